from django.urls import path

from workers import api

urlpatterns = [
    path("workers", api.AllWorkersView.as_view(), name="api-workers"),
    path("projects/<slug:project>/workers", api.ProjectWorkersView.as_view(), name="api-project-workers"),
]
