"""HTML routes of Computers under Global settings; included at the root by mado/urls.py."""
from django.urls import path

from computers import compute_page, group_views, views

urlpatterns = [
    path("projects/<slug:project>/compute/", compute_page.project_compute, name="project-compute"),
    path("settings/computers/", views.computer_list, name="computers"),
    path("settings/computers/groups/", group_views.group_list, name="compute-groups"),
    path("settings/computers/groups/new", group_views.group_edit, name="compute-group-add"),
    path("settings/computers/groups/<int:pk>/edit", group_views.group_edit, name="compute-group-edit"),
    path("settings/computers/groups/<int:pk>/delete", group_views.group_delete, name="compute-group-delete"),
    path("settings/computers/new", views.computer_add, name="computer-add"),
    path("settings/computers/worker-candidates", views.worker_candidates, name="computer-worker-candidates"),
    path("settings/computers/<int:pk>/", views.computer_detail, name="computer-detail"),
    path("settings/computers/<int:pk>/connection", views.computer_connection, name="computer-connection"),
    path("settings/computers/<int:pk>/settings", views.computer_settings, name="computer-settings"),
    path("settings/computers/<int:pk>/edit", views.computer_edit, name="computer-edit"),
    path("settings/computers/<int:pk>/enabled", views.computer_set_enabled, name="computer-enabled"),
    path("settings/computers/<int:pk>/checks", views.computer_check_request, name="computer-check-request"),
    path("settings/computers/<int:pk>/checks/<int:check_id>", views.computer_check_status,
         name="computer-check-status"),
    path("settings/computers/<int:pk>/suggested", views.computer_apply_suggested, name="computer-apply-suggested"),
    path("settings/computers/<int:pk>/paths", views.computer_path_assist, name="computer-path-assist"),
]
