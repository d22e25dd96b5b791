"""HTML routes of the workers app; included at the root by mado/urls.py."""
from django.urls import path

from workers import views

urlpatterns = [
    path("projects/<slug:project>/compute/", views.project_compute, name="project-compute"),
]
