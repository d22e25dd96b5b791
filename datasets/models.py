"""Datasets of a project and their versions (seed 002 "Input dataset transfer", seed 001 result.json
`datasets`). A version is a fixed set of files: its entries (path, sha256, size) are the manifest, and
its digest is the sha256 of the canonical manifest, the same digest result.json declarations get.

Bytes are stored once per project and sha256 (DatasetFile): a new version that changes one file of a
large set uploads that one file only, and a job's output files become a version without a copy."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models.functions import Lower
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from datasets.choices import VersionStatus


class Dataset(models.Model):
    project = models.ForeignKey("mado.Project", on_delete=models.CASCADE, related_name="datasets")
    name = models.CharField(_("Name"), max_length=100)
    description = models.TextField(_("Description"), blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = [Lower("name")]
        constraints = [models.UniqueConstraint(Lower("name"), "project", name="dataset_name_unique_ci")]

    def __str__(self) -> str:
        return self.name


class DatasetVersion(models.Model):
    """Created `uploading` from a manifest; `complete` once every file's bytes are stored and
    verified. Only then does it get its number (1, 2, …), so abandoned uploads leave no gaps."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=VersionStatus.choices, default=VersionStatus.UPLOADING)
    digest = models.CharField(max_length=1000, help_text=_("sha256: of the canonical manifest (or as declared "
                                                           "for a version given by uri)."))
    file_count = models.PositiveIntegerField(default=0)
    total_size = models.BigIntegerField(default=0)
    uri = models.CharField(max_length=4000, blank=True, help_text=_("Data stored elsewhere, declared by a job."))
    schema = models.JSONField(default=dict, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    job = models.ForeignKey("jobs.Job", on_delete=models.SET_NULL, null=True, blank=True,
                            related_name="dataset_versions", help_text=_("The job whose outputs these are."))
    created_at = models.DateTimeField(default=timezone.now)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [models.UniqueConstraint(fields=["dataset", "number"], name="dataset_version_number")]
        indexes = [models.Index(fields=["dataset", "status", "digest"], name="dataset_version_digest")]

    def __str__(self) -> str:
        return f"{self.dataset.name} v{self.number}" if self.number else f"{self.dataset.name} (uploading)"

    @property
    def is_complete(self) -> bool:
        return self.status == VersionStatus.COMPLETE

    @property
    def digest_prefix(self) -> str:
        return self.digest.removeprefix("sha256:")[:12]

    def manifest(self) -> list[dict]:
        """The canonical manifest: every file, sorted by path."""
        return [{"path": p, "sha256": s, "size": n}
                for p, s, n in self.entries.order_by("path").values_list("path", "sha256", "size")]


def stored_path(instance, filename):
    return f"datasets/{instance.project_id}/files/{instance.sha256[:2]}/{instance.sha256}"


class DatasetFile(models.Model):
    """The bytes of one file content in a project, shared by every version that lists its sha256.
    `received_bytes` counts the parts of an unfinished upload; `complete` means stored and verified."""

    project = models.ForeignKey("mado.Project", on_delete=models.CASCADE, related_name="+")
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    file = models.FileField(upload_to=stored_path, max_length=300, blank=True)
    received_bytes = models.BigIntegerField(default=0)
    complete = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "sha256"], name="dataset_file_once")]


class DatasetEntry(models.Model):
    """One line of a version's manifest: the file at `path` inside the version."""

    version = models.ForeignKey(DatasetVersion, on_delete=models.CASCADE, related_name="entries")
    path = models.CharField(max_length=1024)
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    # RESTRICT, not PROTECT: deleting the project deletes both sides in one go.
    file = models.ForeignKey(DatasetFile, on_delete=models.RESTRICT, related_name="entries")

    class Meta:
        ordering = ["path"]
        constraints = [models.UniqueConstraint(fields=["version", "path"], name="dataset_entry_path")]


class JobInputDataset(models.Model):
    """A dataset version a job reads: delivered to its computer's cache before the job starts
    (docs/datasets.md, "Versions as job inputs")."""

    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, related_name="input_datasets")
    # PROTECT: a version in use by a job's record stays, so the job's inputs stay explainable.
    version = models.ForeignKey(DatasetVersion, on_delete=models.PROTECT, related_name="input_of")
    position = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["job", "position"]
        constraints = [models.UniqueConstraint(fields=["job", "version"], name="job_input_dataset_once")]


class DatasetCacheReport(models.Model):
    """What a worker last found in a computer's dataset cache, reported after it ensured a job's
    inputs there: the computer's details page shows it with its time, never a guess."""

    target = models.OneToOneField("computers.ComputeTarget", on_delete=models.CASCADE,
                                  related_name="dataset_cache_report")
    used_bytes = models.BigIntegerField(default=0)
    limit_bytes = models.BigIntegerField(default=0)
    version_count = models.PositiveIntegerField(default=0)
    pinned_count = models.PositiveIntegerField(default=0)
    worker_id = models.CharField(max_length=64, blank=True)
    job = models.ForeignKey("jobs.Job", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    reported_at = models.DateTimeField(default=timezone.now)
