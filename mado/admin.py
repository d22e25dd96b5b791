from django.contrib import admin, messages

from mado import services
from mado.errors import ServiceError
from mado.models import ApiToken, AuditEvent, JobToken, Membership, Project, ServiceAccount


class ReadOnlyAdmin(admin.ModelAdmin):
    """Identity changes go through the product (and its audit trail); here they are only inspected.
    Revoking and disabling are offered as actions that call the same services."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ServiceActionMixin:
    """Admin actions that call a service per selected row, as the product's pages do. A refused row
    (a ServiceError) is reported by name and the others still go through."""

    def apply_service(self, request, queryset, call, *, done: str, name=str):
        actor = services.Actor.from_request(request)
        succeeded = 0
        for obj in queryset:
            try:
                call(actor, obj)
            except ServiceError as error:
                self.message_user(request, f"{name(obj)}: {error.message}", messages.ERROR)
            else:
                succeeded += 1
        if succeeded:
            self.message_user(request, done.format(count=succeeded), messages.SUCCESS)
        return succeeded


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    can_delete = False
    readonly_fields = ["user", "role", "created_at"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Project)
class ProjectAdmin(ReadOnlyAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(ReadOnlyAdmin):
    list_display = ["project", "user", "role", "created_at"]
    list_filter = ["role", "project"]
    search_fields = ["user__username", "project__slug"]


@admin.register(ServiceAccount)
class ServiceAccountAdmin(ReadOnlyAdmin):
    list_display = ["name", "project", "role", "created_by", "created_at", "disabled_at"]
    list_filter = ["role", "project", ("disabled_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "description"]
    actions = ["disable"]

    @admin.action(description="Disable the selected service accounts (their tokens stop at once)")
    def disable(self, request, queryset):
        actor = services.Actor.from_request(request)
        for account in queryset:
            services.disable_service_account(actor, account)
        messages.success(request, f"Disabled {queryset.count()} service account(s).")


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    """Tokens are issued in the product, where the plaintext is shown once; here they are only
    inspected and revoked. The hash is never shown."""

    list_display = ["prefix", "kind", "user", "project", "expires_at", "revoked_at", "last_used_at"]
    list_filter = ["kind", "project", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["prefix", "name", "user__username"]
    exclude = ["token_hash"]
    actions = ["revoke"]

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        actor = services.Actor.from_request(request)
        for token in queryset:
            services.revoke_token(actor, token)
        messages.success(request, f"Revoked {queryset.count()} token(s).")


@admin.register(JobToken)
class JobTokenAdmin(ReadOnlyAdmin):
    list_display = ["prefix", "job_id", "project", "user", "created_at", "revoked_at"]
    exclude = ["token_hash"]


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ["at", "actor_label", "action", "object_type", "object_id", "project", "ip"]
    list_filter = ["action", "actor", "project", ("at", admin.DateFieldListFilter)]
    search_fields = ["action", "actor_label", "object_type", "object_id"]
    date_hierarchy = "at"
