"""The operator's console for sites: site settings, job shells, people's own site settings, launchers
with their keys and connection checks, and submissions. All are changed in the product (sites.services, sites.launchers,
the launcher and runner APIs, each with its audit trail); here they are inspected, and launchers are
revoked through the same service as the Launchers page."""
from django.contrib import admin

from mado.admin import ReadOnlyAdmin, ServiceActionMixin
from sites import launchers
from sites.models import JobShell, Launcher, LauncherKey, SiteCheck, SiteSettings, SiteUserSettings, Submission


@admin.register(SiteSettings)
class SiteSettingsAdmin(ReadOnlyAdmin):
    list_display = ["target", "submission", "account", "launcher", "host", "ssh_user", "template",
                    "max_active_submissions", "queue_timeout_seconds", "updated_at"]
    list_filter = ["submission", "account", "template", "launcher"]
    search_fields = ["target__name", "host"]
    list_select_related = ["target", "launcher"]


@admin.register(JobShell)
class JobShellAdmin(ReadOnlyAdmin):
    list_display = ["target", "version", "short_sha256", "created_by", "created_at"]
    list_filter = ["target"]
    search_fields = ["target__name", "sha256"]
    list_select_related = ["target", "created_by"]

    @admin.display(description="SHA-256", ordering="sha256")
    def short_sha256(self, shell):
        return shell.sha256[:12]


@admin.register(SiteUserSettings)
class SiteUserSettingsAdmin(ReadOnlyAdmin):
    list_display = ["target", "user", "account_name", "working_dir", "updated_at"]
    list_filter = ["target"]
    search_fields = ["target__name", "user__username", "account_name"]
    list_select_related = ["target", "user"]


class LauncherKeyInline(admin.TabularInline):
    model = LauncherKey
    extra = 0
    can_delete = False
    fields = readonly_fields = ["target", "user", "fingerprint", "created_at", "recreate_requested_at"]

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Launcher)
class LauncherAdmin(ServiceActionMixin, ReadOnlyAdmin):
    list_display = ["name", "state", "project", "allowed_hosts", "hostname", "version", "last_seen_at", "created_by",
                    "created_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "hostname"]
    list_select_related = ["token__project", "created_by"]
    inlines = [LauncherKeyInline]
    actions = ["revoke"]

    @admin.display(description="State")
    def state(self, launcher):
        return launchers.state_of(launcher)

    @admin.display(description="Project")
    def project(self, launcher):
        return launchers.project_of(launcher)

    @admin.action(description="Revoke the selected launchers and their tokens")
    def revoke(self, request, queryset):
        self.apply_service(request, queryset, launchers.revoke, done="Revoked {count} launcher(s).")


@admin.register(LauncherKey)
class LauncherKeyAdmin(ReadOnlyAdmin):
    list_display = ["fingerprint", "launcher", "target", "user", "created_at", "recreate_requested_at"]
    list_filter = ["launcher", "target"]
    search_fields = ["fingerprint", "user__username", "target__name"]
    list_select_related = ["launcher", "target", "user"]


@admin.register(SiteCheck)
class SiteCheckAdmin(ReadOnlyAdmin):
    list_display = ["id", "target", "status", "failure_reason", "requested_by", "launcher", "site_user",
                    "account_name", "created_at", "finished_at"]
    list_filter = ["status", "failure_reason", "target"]
    search_fields = ["target__name", "account_name"]
    list_select_related = ["target", "requested_by", "launcher", "site_user"]
    date_hierarchy = "created_at"


@admin.register(Submission)
class SubmissionAdmin(ReadOnlyAdmin):
    list_display = ["job", "target", "status", "launcher", "submitted_by", "account_name", "scheduler_job_id",
                    "cancel_state", "claimed_at", "reported_at"]
    list_filter = ["status", "cancel_state", "target", "launcher"]
    search_fields = ["scheduler_job_id", "account_name", "target__name"]
    list_select_related = ["job", "target", "launcher", "submitted_by"]
    date_hierarchy = "claimed_at"
