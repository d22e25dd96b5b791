from django.contrib import admin

from datasets.models import Dataset, DatasetVersion
from mado.admin import ReadOnlyAdmin, user_label


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "creator", "created_at")
    list_filter = ("project",)
    search_fields = ("name",)
    list_select_related = ("project", "created_by__service_account__project")

    @admin.display(description="Created by", ordering="created_by__username")
    def creator(self, dataset):
        return user_label(dataset.created_by)


@admin.register(DatasetVersion)
class DatasetVersionAdmin(ReadOnlyAdmin):
    """A version is immutable once written (its files, sizes and hashes are what jobs read): the console
    only inspects versions; they are made by uploads and jobs through the datasets services."""

    list_display = ("dataset", "number", "status", "file_count", "total_size", "job", "created_at")
    list_filter = ("status",)
    list_select_related = ("dataset", "job")
    raw_id_fields = ("dataset", "job", "created_by")
