"""HTML routes of tracking's pages; included at the root by mado/urls.py."""
from django.urls import path

from tracking import views

urlpatterns = [
    path("projects/<slug:project>/runs/", views.run_list, name="runs"),
    path("projects/<slug:project>/runs/compare", views.run_compare, name="runs-compare"),
    path("projects/<slug:project>/runs/<str:run_id>/", views.run_detail, name="run-detail"),
    path("projects/<slug:project>/runs/<str:run_id>/panel", views.run_panel, name="run-panel"),
    path("projects/<slug:project>/runs/<str:run_id>/artifacts/<path:path>", views.run_artifact,
         name="run-artifact"),
]
