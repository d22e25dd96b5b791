"""HTML routes of notifications; included at the root by mado/urls.py."""
from django.urls import path

from notifications import views

urlpatterns = [
    path("projects/<slug:project>/settings/notifications/", views.rule_list, name="notification-rules"),
    path("projects/<slug:project>/settings/notifications/new", views.rule_create, name="notification-rule-create"),
    path("projects/<slug:project>/settings/notifications/<int:pk>/", views.rule_detail, name="notification-rule"),
    path("projects/<slug:project>/settings/notifications/<int:pk>/test", views.rule_test,
         name="notification-rule-test"),
    path("projects/<slug:project>/settings/notifications/<int:pk>/enabled", views.rule_enabled,
         name="notification-rule-enabled"),
    path("projects/<slug:project>/settings/notifications/<int:pk>/delete", views.rule_delete,
         name="notification-rule-delete"),
]
