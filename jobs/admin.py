"""The operator's console for jobs and GPU reservations. Only the job lifecycle (jobs.lifecycle) writes
a Job's status, so the rows are read-only here and the actions call the same services as the pages."""
from django.contrib import admin
from django.utils import timezone

from jobs import services
from jobs.choices import HELD_STATUSES
from jobs.models import UNRESPONSIVE_AFTER, GpuReservation, Job, JobEvent
from mado.admin import ReadOnlyAdmin, ServiceActionMixin, user_label
from mado.validation import BIGINT_MAX


class ResponsiveFilter(admin.SimpleListFilter):
    """Not responding = claimed or running with no heartbeat for 60 s (the jobs a Mark as lost is for)."""

    title = "heartbeat"
    parameter_name = "heartbeat"

    def lookups(self, request, model_admin):
        return [("not_responding", "No response")]

    def queryset(self, request, queryset):
        if self.value() == "not_responding":
            return queryset.filter(status__in=HELD_STATUSES,
                                   heartbeat_at__lt=timezone.now() - UNRESPONSIVE_AFTER)
        return queryset


class GpuReservationInline(admin.TabularInline):
    model = GpuReservation
    extra = 0
    can_delete = False
    fields = readonly_fields = ["target", "gpu_id", "created_at"]

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    can_delete = False
    fields = readonly_fields = ["at", "kind", "message"]

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Job)
class JobAdmin(ServiceActionMixin, ReadOnlyAdmin):
    list_display = ["id", "name", "status", "not_responding", "end_reason", "project", "target", "worker",
                    "creator", "created_at", "finished_at"]
    list_display_links = ["id", "name"]
    list_filter = ["status", ResponsiveFilter, "end_reason", "target", "project", "worker"]
    search_fields = ["name"]
    search_help_text = "A job ID (42) or part of its run name."
    list_select_related = ["project", "target", "worker", "created_by__service_account__project"]
    date_hierarchy = "created_at"
    inlines = [GpuReservationInline, JobEventInline]
    actions = ["request_stop", "mark_lost"]

    def get_search_results(self, request, queryset, search_term):
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip().lstrip("#")
        if term.isdigit() and int(term) <= BIGINT_MAX:
            results |= queryset.filter(pk=int(term))
        return results, may_have_duplicates

    @admin.display(description="Created by", ordering="created_by__username")
    def creator(self, job):
        return user_label(job.created_by)

    @admin.display(description="No response", boolean=True)
    def not_responding(self, job):
        return job.is_unresponsive

    @admin.action(description="Request stop of the selected jobs")
    def request_stop(self, request, queryset):
        self.apply_service(request, queryset, services.request_stop, done="Requested stop of {count} job(s).",
                           name=_job_name)

    @admin.action(description="Mark the selected No response jobs as lost (ends them failed, frees their GPUs)")
    def mark_lost(self, request, queryset):
        self.apply_service(request, queryset, services.mark_lost, done="Marked {count} job(s) as lost.",
                           name=_job_name)


def _job_name(job: Job) -> str:
    return f"Job {job.pk} ({job.display_name})" if job.name else f"Job {job.pk}"


@admin.register(GpuReservation)
class GpuReservationAdmin(ReadOnlyAdmin):
    list_display = ["target", "gpu_id", "job", "job_status", "job_project", "created_at"]
    list_filter = ["target"]
    search_fields = ["target__name", "gpu_id"]
    list_select_related = ["target", "job__project"]

    @admin.display(description="Job status", ordering="job__status")
    def job_status(self, reservation):
        return reservation.job.get_status_display()

    @admin.display(description="Project", ordering="job__project__slug")
    def job_project(self, reservation):
        return reservation.job.project
