from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from mado.api import views
from mado.exceptions import json_not_found

urlpatterns = [
    path("health", views.HealthView.as_view(), name="api-health"),
    path("auth/token", views.AuthTokenView.as_view(), name="api-auth-token"),
    path("projects", views.ProjectListView.as_view(), name="api-projects"),
    path("projects/<slug:project>/members", views.MemberView.as_view(), name="api-members"),
    path("projects/<slug:project>/members/<str:username>", views.MemberDetailView.as_view(), name="api-member"),
    path("projects/<slug:project>/service-accounts", views.ServiceAccountListView.as_view(), name="api-service-accounts"),
    path("projects/<slug:project>/service-accounts/<int:account_id>/tokens", views.ServiceAccountTokenView.as_view(),
         name="api-service-account-tokens"),
    path("projects/<slug:project>/service-accounts/<int:account_id>/disable", views.ServiceAccountDisableView.as_view(),
         name="api-service-account-disable"),
    path("projects/<slug:project>/tokens", views.ProjectTokenView.as_view(), name="api-project-tokens"),
    path("tokens/<int:token_id>/revoke", views.TokenRevokeView.as_view(), name="api-token-revoke"),
    path("", include("computers.api_urls")),
    path("", include("workers.api_urls")),
    path("", include("worker_api.urls")),
    path("", include("jobs.api_urls")),
    path("", include("sites.api_urls")),
    path("schema/", SpectacularAPIView.as_view(permission_classes=[], authentication_classes=[]), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema", permission_classes=[], authentication_classes=[]),
         name="api-docs"),
]

# Anything else under /api/ answers with the JSON error body, in DEBUG too.
urlpatterns.append(re_path(r"^.*$", json_not_found))
