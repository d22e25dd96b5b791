from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from mado import downloads, views

urlpatterns = [
    # Ahead of mado.api.urls, whose catch-all answers every other /api/ path.
    path("api/", include("datasets.api_urls")),
    path("api/", include("mado.api.urls")),
    path("mlflow/", include("registry.urls")),  # the model registry, ahead of tracking's catch-all
    path("mlflow/", include("tracking.urls")),  # MLflow's REST API 2.0 (MLFLOW_TRACKING_URI=<server>/mlflow)
    path("", include("monitoring.urls")),  # /metrics for Prometheus
    path("admin/", admin.site.urls),
    path("i18n/", include("django.conf.urls.i18n")),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.home, name="home"),
    # The agent distribution (mado/downloads.py), public like a package index: pip sends no session.
    path("downloads/", downloads.downloads_page, name="downloads"),
    path("downloads/latest.json", downloads.latest, name="downloads-latest"),
    path("downloads/<str:filename>", downloads.download_file, name="download-file"),
    path("set-password/<uidb64>/<token>/", views.SetPasswordView.as_view(), name="set-password"),
    path("settings/", views.global_settings, name="global-settings"),
    path("settings/users/", views.users, name="users"),
    path("settings/users/new", views.user_create, name="user-create"),
    path("settings/users/<int:user_id>/set-password-link", views.user_set_password_link,
         name="user-set-password-link"),
    path("projects/<slug:project>/", views.project_home, name="project-home"),
    path("projects/<slug:project>/settings/members/", views.members, name="project-members"),
    path("projects/<slug:project>/settings/members/new", views.member_add, name="member-add"),
    path("projects/<slug:project>/settings/members/<int:membership_id>/role", views.member_role, name="member-role"),
    path("projects/<slug:project>/settings/members/<int:membership_id>/remove", views.member_remove,
         name="member-remove"),
    path("projects/<slug:project>/settings/service-accounts/", views.service_accounts, name="service-accounts"),
    path("projects/<slug:project>/settings/service-accounts/new", views.service_account_create,
         name="service-account-create"),
    path("projects/<slug:project>/settings/service-accounts/<int:account_id>/tokens/new",
         views.service_account_token_create, name="service-account-token-create"),
    path("projects/<slug:project>/settings/service-accounts/<int:account_id>/disable",
         views.service_account_disable, name="service-account-disable"),
    path("projects/<slug:project>/settings/tokens/", views.project_tokens, name="project-tokens"),
    path("projects/<slug:project>/settings/tokens/new", views.personal_token_create, name="personal-token-create"),
    path("projects/<slug:project>/settings/tokens/<int:token_id>/revoke", views.token_revoke, name="token-revoke"),
    path("", include("computers.urls")),
    path("", include("jobs.urls")),
    path("", include("tracking.page_urls")),  # Runs pages (projects/<p>/runs/…)
    path("", include("sites.urls")),
    path("", include("datasets.urls")),
    path("", include("registry.page_urls")),
    path("", include("notifications.urls")),
]

handler400 = "mado.views.bad_request"
handler404 = "mado.views.not_found"
handler500 = "mado.views.server_error"

if settings.DEBUG:
    from django.contrib.staticfiles.urls import staticfiles_urlpatterns

    urlpatterns += staticfiles_urlpatterns()
