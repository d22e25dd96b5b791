from django.contrib import admin

from datasets.models import Dataset, DatasetVersion


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "created_by", "created_at")
    list_filter = ("project",)
    search_fields = ("name",)


@admin.register(DatasetVersion)
class DatasetVersionAdmin(admin.ModelAdmin):
    list_display = ("dataset", "number", "status", "file_count", "total_size", "job", "created_at")
    list_filter = ("status",)
    raw_id_fields = ("dataset", "job", "created_by")
