"""Computers (compute targets), their connection checks (a site's checks build on CheckBase in sites.models)
and the directory reads of the Add dialog."""
from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Lower
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from computers.choices import (
    OPEN_CHECK_STATUSES,
    CheckFailure,
    CheckStatus,
    CpuArch,
    DatasetTransfer,
    Kind,
    ReadStatus,
    Visibility,
)
from mado.errors import Conflict

# A day: a longer wait holds a claim (and its GPUs) for nothing; give it back and let the queue decide.
GPU_BUSY_WAIT_MAX_SECONDS = 86400
GPU_BUSY_WAIT_DEFAULT_SECONDS = 600
CONNECTION_FIELDS = ["host", "port", "ssh_user", "ssh_key_path", "known_hosts_path"]


class ComputeTarget(models.Model):
    name = models.CharField(_("Name"), max_length=64)
    kind = models.CharField(_("Type"), max_length=8, choices=Kind.choices, default=Kind.SSH)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="computers")
    visibility = models.CharField(_("Visibility"), max_length=8, choices=Visibility.choices, default=Visibility.PRIVATE)
    enabled = models.BooleanField(_("Enabled"), default=False)
    host = models.CharField(_("Host"), max_length=255, blank=True)
    port = models.PositiveIntegerField(_("Port"), default=22, validators=[MinValueValidator(1), MaxValueValidator(65535)])
    ssh_user = models.CharField(_("SSH user"), max_length=64, blank=True)
    ssh_key_path = models.CharField(_("SSH key path"), max_length=1024, blank=True)
    known_hosts_path = models.CharField(_("known_hosts path"), max_length=1024, blank=True)
    working_dir = models.CharField(_("Working directory"), max_length=1024, blank=True)
    python_path = models.CharField(_("Python executable path"), max_length=1024, blank=True)
    cpu_arch = models.CharField(_("CPU architecture"), max_length=8, choices=CpuArch.choices, default=CpuArch.AMD64)
    runtimes = models.JSONField(_("Supported runtimes"), default=list, blank=True)
    gpu_ids = models.JSONField(_("GPU IDs"), default=list, blank=True)
    concurrency = models.PositiveIntegerField(_("Concurrent jobs"), default=1,
                                              validators=[MinValueValidator(1), MaxValueValidator(128)])
    dataset_transfer = models.CharField(_("Dataset transfer"), max_length=8, choices=DatasetTransfer.choices,
                                        default=DatasetTransfer.RELAY)
    dataset_cache_limit_gib = models.PositiveIntegerField(_("Dataset cache limit (GiB)"), default=100,
                                                          validators=[MinValueValidator(1)])
    # Seconds, so a short wait can be set (and tested) without waiting minutes; the pages show the
    # default as 600 (10 minutes, seed 002). 0 turns the check for processes outside Mado off.
    gpu_busy_wait_seconds = models.PositiveIntegerField(
        _("Wait for GPUs busy outside Mado (seconds)"), default=GPU_BUSY_WAIT_DEFAULT_SECONDS,
        validators=[MaxValueValidator(GPU_BUSY_WAIT_MAX_SECONDS)])
    last_check_worker = models.ForeignKey("workers.Worker", on_delete=models.SET_NULL, null=True, blank=True,
                                          related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(Lower("name"), name="computer_unique_name_ci"),
            models.CheckConstraint(condition=Q(port__gte=1, port__lte=65535), name="computer_port_range"),
            models.CheckConstraint(condition=Q(concurrency__gte=1, concurrency__lte=128),
                                   name="computer_concurrency_range"),
        ]

    def __str__(self) -> str:
        return self.name

    def connection(self) -> dict:
        """What a worker needs to reach the computer."""
        data = {"kind": self.kind}
        if self.kind == Kind.SSH:
            data.update({field: getattr(self, field) for field in CONNECTION_FIELDS})
        return data


class ComputeGroup(models.Model):
    """A named set of SSH computers that multi-node cluster jobs spread over (the peer's resource
    group). Global administrators keep them; a computer may belong to several groups."""

    name = models.CharField(_("Name"), max_length=64)
    description = models.CharField(_("Description"), max_length=500, blank=True)
    computers = models.ManyToManyField(ComputeTarget, related_name="compute_groups", blank=True,
                                       verbose_name=_("Computers"))
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(Lower("name"), name="compute_group_unique_name_ci")]

    def __str__(self) -> str:
        return self.name


class CheckBase(models.Model):
    """What both kinds of connection check share: a worker's check of an SSH or Local computer
    (ConnectionCheck) and a site's launcher logging in (sites.SiteCheck). They differ in who answers
    and when they expire, not in how they end: finish() and expire() are the one guarded ending."""

    # How the refusal of a late answer names it: a worker sends a result, a launcher an answer.
    ANSWER = "result"

    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    status = models.CharField(max_length=12, choices=CheckStatus.choices, default=CheckStatus.QUEUED)
    failure_reason = models.CharField(max_length=32, blank=True)
    result = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    claimed_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"check {self.pk} of {self.target} ({self.status})"

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_CHECK_STATUSES

    def finish(self, status: str, result: Callable[[], dict]) -> bool:
        """End an open check with its worker's or launcher's answer; the caller holds the row's lock
        and has checked who answers. False: this same answer was recorded before (a resend changes
        nothing). An expired check, or one that ended the other way, refuses it (409). `result` is
        built only once the check takes the answer: a late answer is neither validated nor stored."""
        if status not in (CheckStatus.SUCCEEDED, CheckStatus.FAILED):
            raise ValueError(f"a check ends succeeded or failed, not {status}")
        if self.status == CheckStatus.EXPIRED:
            raise Conflict(f"This check expired before its {self.ANSWER} arrived; the user can start a new one.",
                           "check_expired")
        if not self.is_open:
            if self.status == status:
                return False
            raise Conflict(f"This check already ended as {self.status}.", "check_already_completed")
        self.result = result()
        self.status = status
        self.failure_reason = CheckFailure.CHECK_FAILED if status == CheckStatus.FAILED else ""
        self.finished_at = timezone.now()
        self.save(update_fields=["status", "result", "failure_reason", "finished_at"])
        return True

    def expire(self, now) -> bool:
        """End an open check nobody answered in time: not_claimed while queued, no_result once claimed.
        False if it was no longer open: the update is conditional on the status read, so an answer
        that landed meanwhile wins."""
        if not self.is_open:
            return False
        reason = CheckFailure.NOT_CLAIMED if self.status == CheckStatus.QUEUED else CheckFailure.NO_RESULT
        if not type(self).objects.filter(pk=self.pk, status=self.status).update(
                status=CheckStatus.EXPIRED, failure_reason=reason, finished_at=now):
            return False
        self.status, self.failure_reason, self.finished_at = CheckStatus.EXPIRED, reason, now
        return True


class ConnectionCheck(CheckBase):
    """A worker's check of an SSH or Local computer, held under a lease by the worker that claimed it."""

    target = models.ForeignKey(ComputeTarget, on_delete=models.CASCADE, related_name="checks")
    requested_worker = models.ForeignKey("workers.Worker", on_delete=models.SET_NULL, null=True, blank=True,
                                         related_name="requested_checks")
    lease_id = models.UUIDField(null=True, blank=True)
    claimed_by = models.ForeignKey("workers.Worker", on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="claimed_checks")

    class Meta(CheckBase.Meta):
        constraints = [
            # One open check per computer: two admins pressing Check at once get a 409, not two checks.
            models.UniqueConstraint(fields=["target"], condition=Q(status__in=OPEN_CHECK_STATUSES),
                                    name="one_open_check_per_target"),
        ]


class DirectoryRead(models.Model):
    """One directory listing asked of a worker while the Add/Edit dialog is open. Names and kinds only."""

    target = models.ForeignKey(ComputeTarget, on_delete=models.CASCADE, related_name="directory_reads")
    connection = models.JSONField(help_text=_("The connection fields at the time of the request."))
    path = models.CharField(max_length=1024)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    requested_worker = models.ForeignKey("workers.Worker", on_delete=models.CASCADE, related_name="reads")
    status = models.CharField(max_length=12, choices=ReadStatus.choices, default=ReadStatus.QUEUED)
    lease_id = models.UUIDField(null=True, blank=True)
    entries = models.JSONField(default=list, blank=True)
    error = models.CharField(max_length=32, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"read {self.path} on {self.target}"


class GpuReading(models.Model):
    """What a worker's GPU watch last read of one registered GPU of a computer (issue 22, docs/gpus.md
    "The GPU watch"): utilisation and memory now, and the processes outside Mado on it. One row per
    (computer, GPU), overwritten every sample (computers.services.record_gpu_readings), so the table holds
    as many rows as there are registered GPUs, never a history. The GPU board shows a row only while it is
    fresh (seen_at within jobs.gpu_board.READING_FRESH_SECONDS): seed 002's reservations do not stop people
    using a GPU over SSH, and a GPU that no Job holds would otherwise always look free."""

    target = models.ForeignKey(ComputeTarget, on_delete=models.CASCADE, related_name="gpu_readings")
    gpu_id = models.CharField(max_length=64, help_text=_("The GPU ID as registered on the computer."))
    utilization = models.FloatField(null=True, blank=True, help_text=_("Percent; empty where the GPU cannot say."))
    memory_used = models.FloatField(null=True, blank=True, help_text=_("MiB used."))
    memory_total = models.FloatField(null=True, blank=True, help_text=_("MiB in all."))
    # [{"pid": 4242, "user": "alice"}]: processes on the GPU that belong to no Mado Job (no MMT_JOB_ID in
    # an environment the computer's login user can read).
    outside = models.JSONField(default=list, blank=True)
    seen_at = models.DateTimeField(db_index=True, help_text=_("When the server received it."))
    worker = models.ForeignKey("workers.Worker", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")

    class Meta:
        ordering = ["target_id", "gpu_id"]
        constraints = [models.UniqueConstraint(fields=["target", "gpu_id"], name="gpu_reading_one_per_gpu")]

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} of {self.target_id} at {self.seen_at:%Y-%m-%d %H:%M:%S}"
