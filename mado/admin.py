from django.contrib import admin

from mado.models import ApiToken, AuditEvent, JobToken, Membership, Project, ServiceAccount


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["project", "user", "role", "created_at"]
    list_filter = ["role", "project"]
    search_fields = ["user__username", "project__slug"]
    autocomplete_fields = ["user", "project"]


@admin.register(ServiceAccount)
class ServiceAccountAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "role", "created_by", "created_at", "disabled_at"]
    list_filter = ["role", "project", ("disabled_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "description"]
    readonly_fields = ["user", "created_by", "created_at"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are issued in the product, where the plaintext is shown once; here they are only
    inspected and revoked. The hash is never shown."""

    list_display = ["prefix", "kind", "user", "project", "expires_at", "revoked_at", "last_used_at"]
    list_filter = ["kind", "project", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["prefix", "name", "user__username"]
    exclude = ["token_hash"]
    readonly_fields = ["user", "project", "kind", "prefix", "scopes", "created_by", "created_at", "expires_at",
                       "last_used_at", "revoked_by"]

    def has_add_permission(self, request):
        return False


@admin.register(JobToken)
class JobTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "job_id", "project", "user", "created_at", "revoked_at"]
    exclude = ["token_hash"]
    readonly_fields = ["job_id", "lease_id", "project", "user", "prefix", "created_at", "revoked_at"]

    def has_add_permission(self, request):
        return False


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["at", "actor_label", "action", "object_type", "object_id", "project", "ip"]
    list_filter = ["action", "actor", "project", ("at", admin.DateFieldListFilter)]
    search_fields = ["action", "actor_label", "object_type", "object_id"]
    date_hierarchy = "at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
