from django.contrib import admin

from notifications.models import Delivery, NotificationRule


@admin.register(NotificationRule)
class NotificationRuleAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "channel", "enabled", "created_by", "created_at"]
    list_filter = ["channel", "enabled", "project"]
    exclude = ["secret"]  # never shown again after creation
    readonly_fields = ["project", "job", "created_by", "created_at"]


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ["id", "rule", "event", "status", "attempts", "next_attempt_at", "created_at"]
    list_filter = ["status", "event"]
    readonly_fields = [f.name for f in Delivery._meta.fields]

    def has_add_permission(self, request):
        return False
