"""HTML routes of the model registry; included at the root by mado/urls.py."""
from django.urls import path

from registry import views

urlpatterns = [
    path("projects/<slug:project>/models/", views.model_list, name="models"),
    path("projects/<slug:project>/models/<int:model>/versions/<int:version>/download", views.version_download,
         name="model-version-download"),
]
