"""HTML routes of launchers (Global administration) and of site computers (their details live under
Computers: /settings/computers/<id>/; Add computer with Type Site posts to computers' own route)."""
from django.urls import path

from sites import views

urlpatterns = [
    path("admin-tools/launchers/", views.launcher_list, name="launchers"),
    path("admin-tools/launchers/new", views.launcher_create, name="launcher-create"),
    path("admin-tools/launchers/<int:launcher_id>/token", views.launcher_token, name="launcher-token"),
    path("admin-tools/launchers/<int:launcher_id>/allowed-hosts", views.launcher_allowed_hosts,
         name="launcher-allowed-hosts"),
    path("admin-tools/launchers/<int:launcher_id>/revoke", views.launcher_revoke, name="launcher-revoke"),
    path("settings/computers/known-hosts-fingerprints", views.known_hosts_fingerprints,
         name="site-known-hosts-fingerprints"),
    path("settings/computers/<int:pk>/site", views.site_edit, name="site-edit"),
    path("settings/computers/<int:pk>/job-shell", views.site_job_shell_save, name="site-job-shell"),
    path("settings/computers/<int:pk>/job-shell/<int:version>", views.site_job_shell_version,
         name="site-job-shell-version"),
    path("settings/computers/<int:pk>/keys/recreate", views.site_key_recreate, name="site-key-recreate"),
    path("settings/computers/<int:pk>/my-settings", views.site_my_settings, name="site-my-settings"),
    path("settings/computers/<int:pk>/site-checks", views.site_check_request, name="site-check-request"),
    path("settings/computers/<int:pk>/site-checks/<int:check_id>", views.site_check_status,
         name="site-check-status"),
]
