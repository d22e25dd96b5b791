from django.urls import path

from sites import api, launcher_api

urlpatterns = [
    path("sites", api.SiteListView.as_view(), name="api-sites"),
    path("sites/templates", api.TemplateListView.as_view(), name="api-site-templates"),
    path("sites/<int:pk>", api.SiteDetailView.as_view(), name="api-site"),
    path("sites/<int:pk>/job-shells", api.JobShellListView.as_view(), name="api-site-job-shells"),
    path("sites/<int:pk>/job-shells/<int:version>", api.JobShellDetailView.as_view(), name="api-site-job-shell"),
    path("sites/<int:pk>/my-settings", api.MySettingsView.as_view(), name="api-site-my-settings"),
    path("launchers", launcher_api.LauncherListView.as_view(), name="api-launchers"),
    path("launchers/<int:pk>/token", launcher_api.LauncherTokenView.as_view(), name="api-launcher-token"),
    path("launchers/<int:pk>/revoke", launcher_api.LauncherRevokeView.as_view(), name="api-launcher-revoke"),
    path("launcher/config", launcher_api.LauncherConfigView.as_view(), name="api-launcher-config"),
]
