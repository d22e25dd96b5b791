"""The operator's console for workers: presence only, written by the workers' own hello and claim calls."""
from django.contrib import admin
from django.utils import timezone

from mado.admin import ReadOnlyAdmin
from workers.models import ONLINE_WINDOW, Worker


class OnlineFilter(admin.SimpleListFilter):
    title = "presence"
    parameter_name = "presence"

    def lookups(self, request, model_admin):
        return [("online", "Online"), ("offline", "Offline")]

    def queryset(self, request, queryset):
        since = timezone.now() - ONLINE_WINDOW
        if self.value() == "online":
            return queryset.filter(last_seen_at__gte=since)
        if self.value() == "offline":
            return queryset.filter(last_seen_at__lt=since)
        return queryset


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = ["worker_id", "online", "version", "hostname", "project", "service_account", "active_jobs",
                    "parallel_jobs", "last_seen_at", "started_at"]
    list_filter = [OnlineFilter, "project", "version"]
    search_fields = ["worker_id", "hostname", "account__service_account__name", "account__username"]
    list_select_related = ["project", "account__service_account"]

    @admin.display(description="Online", boolean=True)
    def online(self, worker):
        return worker.is_online

    @admin.display(description="Service account", ordering="account__service_account__name")
    def service_account(self, worker):
        account = getattr(worker.account, "service_account", None)
        return account.name if account else worker.account.username
