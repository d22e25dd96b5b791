"""The operator's console for computers, compute groups, workers' connection checks (sites.admin has
the sites') and directory reads. Every row is changed in the product (services with their audit
trail); here they are inspected, and computers are enabled or disabled through the same services as
the Computers page."""
from django.contrib import admin

from computers import services
from computers.models import ComputeGroup, ComputeTarget, ConnectionCheck, DirectoryRead, GpuReading
from mado.admin import ReadOnlyAdmin, ServiceActionMixin


@admin.register(ComputeTarget)
class ComputeTargetAdmin(ServiceActionMixin, ReadOnlyAdmin):
    list_display = ["name", "kind", "owner", "visibility", "enabled", "host", "gpu_count", "concurrency",
                    "last_check_worker", "updated_at"]
    list_filter = ["kind", "visibility", "enabled"]
    search_fields = ["name", "host", "owner__username"]
    list_select_related = ["owner", "last_check_worker"]
    actions = ["disable", "enable"]

    @admin.display(description="GPUs")
    def gpu_count(self, target):
        return len(target.gpu_ids or [])

    @admin.action(description="Disable the selected computers (running Jobs go on; no new ones start)")
    def disable(self, request, queryset):
        self.apply_service(request, queryset, lambda actor, target: services.set_enabled(actor, target, False),
                           done="Disabled {count} computer(s).")

    @admin.action(description="Enable the selected computers")
    def enable(self, request, queryset):
        self.apply_service(request, queryset, lambda actor, target: services.set_enabled(actor, target, True),
                           done="Enabled {count} computer(s).")


@admin.register(ComputeGroup)
class ComputeGroupAdmin(ReadOnlyAdmin):
    list_display = ["name", "description", "computer_names", "created_by", "created_at"]
    search_fields = ["name", "description"]
    list_select_related = ["created_by"]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("computers")

    @admin.display(description="Computers")
    def computer_names(self, group):
        return ", ".join(computer.name for computer in group.computers.all())


@admin.register(ConnectionCheck)
class ConnectionCheckAdmin(ReadOnlyAdmin):
    list_display = ["id", "target", "status", "failure_reason", "requested_by", "requested_worker", "claimed_by",
                    "created_at", "finished_at"]
    list_filter = ["status", "failure_reason", "target"]
    search_fields = ["target__name"]
    list_select_related = ["target", "requested_by", "requested_worker", "claimed_by"]
    date_hierarchy = "created_at"


@admin.register(DirectoryRead)
class DirectoryReadAdmin(ReadOnlyAdmin):
    list_display = ["id", "target", "path", "status", "error", "requested_by", "requested_worker", "created_at",
                    "finished_at"]
    list_filter = ["status", "error", "target"]
    search_fields = ["target__name", "path"]
    list_select_related = ["target", "requested_by", "requested_worker"]
    date_hierarchy = "created_at"


@admin.register(GpuReading)
class GpuReadingAdmin(ReadOnlyAdmin):
    """The GPU watch's latest reading of each registered GPU (one row per GPU, overwritten every sample)."""

    list_display = ["target", "gpu_id", "utilization", "memory_used", "memory_total", "outside", "seen_at", "worker"]
    list_filter = ["target"]
    search_fields = ["target__name", "gpu_id"]
    list_select_related = ["target", "worker"]
