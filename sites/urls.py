from django.urls import path

from sites import views

urlpatterns = [
    path("admin-tools/launchers/", views.launcher_list, name="launchers"),
    path("admin-tools/launchers/new", views.launcher_create, name="launcher-create"),
    path("admin-tools/launchers/<int:launcher_id>/token", views.launcher_token, name="launcher-token"),
    path("admin-tools/launchers/<int:launcher_id>/revoke", views.launcher_revoke, name="launcher-revoke"),
]
