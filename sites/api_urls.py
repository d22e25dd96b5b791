from django.urls import path

from sites import api

urlpatterns = [
    path("sites", api.SiteListView.as_view(), name="api-sites"),
    path("sites/templates", api.TemplateListView.as_view(), name="api-site-templates"),
    path("sites/<int:pk>", api.SiteDetailView.as_view(), name="api-site"),
    path("sites/<int:pk>/job-shells", api.JobShellListView.as_view(), name="api-site-job-shells"),
    path("sites/<int:pk>/job-shells/<int:version>", api.JobShellDetailView.as_view(), name="api-site-job-shell"),
    path("sites/<int:pk>/my-settings", api.MySettingsView.as_view(), name="api-site-my-settings"),
]
