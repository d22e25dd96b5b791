from django.contrib import admin, messages
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.models import User

from mado import access, services
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


def user_label(user) -> str:
    """A user as the console names them: a service account by its name and project, never by its
    internal `sa-…` username. Callers select `…__service_account` so a list costs one query."""
    if user is None:
        return "—"
    account = access.service_account_of(user)
    return f"{account.name} (service account, {account.project.slug})" if account else user.username


class _Named:
    """Stands in for a row where Django admin only needs its primary key and a label."""

    def __init__(self, pk, label: str):
        self.pk = pk
        self.label = label

    def __str__(self) -> str:
        return self.label


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
    # The internal user row (`sa-…`, no password) is an implementation detail: not shown.
    fields = ["name", "project", "role", "description", "created_by", "created_at", "disabled_at"]
    list_select_related = ["project", "created_by"]
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

    list_display = ["prefix", "kind", "holder", "project", "expires_at", "revoked_at", "last_used_at"]
    list_filter = ["kind", "project", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["prefix", "name", "user__username", "user__service_account__name"]
    list_select_related = ["project", "user__service_account__project"]
    fields = ["prefix", "name", "kind", "holder", "project", "scopes", "created_by", "created_at", "expires_at",
              "revoked_at", "revoked_by", "last_used_at"]
    readonly_fields = ["holder"]
    actions = ["revoke"]

    @admin.display(description="Holder", ordering="user__username")
    def holder(self, token):
        return user_label(token.user)

    def label(self, token) -> str:
        return f"{token.prefix}… ({token.kind}, {user_label(token.user)})"

    def action_checkbox(self, token):
        # The checkbox's accessible name is str(token), which names the holder by username.
        return super().action_checkbox(_Named(token.pk, self.label(token)))

    def change_view(self, request, object_id, form_url="", extra_context=None):
        token = self.get_object(request, object_id)
        if token is not None:
            extra_context = {**(extra_context or {}), "subtitle": self.label(token)}
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        actor = services.Actor.from_request(request)
        for token in queryset:
            services.revoke_token(actor, token)
        messages.success(request, f"Revoked {queryset.count()} token(s).")


@admin.register(JobToken)
class JobTokenAdmin(ReadOnlyAdmin):
    list_display = ["prefix", "job_id", "project", "creator", "created_at", "revoked_at"]
    list_select_related = ["project", "user__service_account__project"]
    fields = ["prefix", "job_id", "lease_id", "project", "creator", "created_at", "revoked_at"]
    readonly_fields = ["creator"]

    @admin.display(description="Job creator", ordering="user__username")
    def creator(self, token):
        return user_label(token.user)


class ActorFilter(admin.SimpleListFilter):
    """Who acted, named as the product names them (service accounts by name)."""

    title = "actor"
    parameter_name = "actor"

    def lookups(self, request, model_admin):
        actors = (User.objects.filter(pk__in=AuditEvent.objects.values("actor").distinct())
                  .select_related("service_account__project").order_by("username"))
        return [(str(user.pk), user_label(user)) for user in actors]

    def queryset(self, request, queryset):
        return queryset.filter(actor_id=self.value()) if self.value() else queryset


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ["at", "who", "action", "object_type", "object_id", "project", "ip"]
    list_filter = ["action", ActorFilter, "project", ("at", admin.DateFieldListFilter)]
    search_fields = ["action", "actor_label", "actor__service_account__name", "object_type", "object_id"]
    list_select_related = ["project", "actor__service_account__project"]
    date_hierarchy = "at"
    fields = ["at", "who", "action", "object_type", "object_id", "project", "before", "after", "ip"]
    readonly_fields = ["who"]

    @admin.display(description="Actor", ordering="actor_label")
    def who(self, event):
        # The label kept at the time, unless the actor still exists and is a service account.
        if event.actor is not None and access.service_account_of(event.actor) is not None:
            return user_label(event.actor)
        return event.actor_label or "—"


class KindFilter(admin.SimpleListFilter):
    title = "kind"
    parameter_name = "kind"

    def lookups(self, request, model_admin):
        return [("person", "People"), ("service", "Service accounts")]

    def queryset(self, request, queryset):
        if self.value() == "person":
            return queryset.filter(service_account__isnull=True)
        if self.value() == "service":
            return queryset.filter(service_account__isnull=False)
        return queryset


admin.site.unregister(User)


@admin.register(User)
class MadoUserAdmin(UserAdmin):
    """Django's user admin, with service accounts named as the product names them."""

    list_display = ["username", "service_account_name", "email", "is_active", "is_superuser", "last_login"]
    list_filter = [KindFilter, "is_superuser", "is_active"]
    search_fields = ["username", "email", "first_name", "last_name", "service_account__name"]
    list_select_related = ["service_account__project"]

    @admin.display(description="Service account", ordering="service_account__name")
    def service_account_name(self, user):
        account = access.service_account_of(user)
        return f"{account.name} ({account.project.slug})" if account else "—"
