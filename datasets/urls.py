"""HTML routes of Datasets; included at the root by mado/urls.py."""
from django.urls import path

from datasets import views

urlpatterns = [
    path("projects/<slug:project>/datasets/", views.dataset_list, name="datasets"),
    path("projects/<slug:project>/datasets/<int:dataset>/versions/<int:version>/", views.version_detail,
         name="dataset-version"),
]
