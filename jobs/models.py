"""Jobs, their GPU reservations, logs, metrics, artifacts and timeline."""
from __future__ import annotations

import shlex
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from computers.choices import Runtime
from jobs.choices import (
    HELD_STATUSES,
    MAIN_REPLICA,
    TERMINAL_STATUSES,
    ClusterMode,
    EndReason,
    JobStatus,
    Stream,
    replica_names,
)
from jobs.lifecycle import IllegalTransition

UNRESPONSIVE_AFTER = timedelta(seconds=60)


def readable_command(argv) -> str:
    """The command line as its author typed it in the New job form, which splits it with shlex (nothing
    is expanded): plain words bare, others in single quotes, an argument holding a single quote in
    double quotes ("it's", where shlex.join would write 'it'"'"'s'). shlex.split gives `argv` back."""
    if not isinstance(argv, list):
        return str(argv)
    words = []
    for arg in map(str, argv):
        if "'" in arg:
            words.append('"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"')
        else:
            words.append(shlex.quote(arg))
    return " ".join(words)


class Job(models.Model):
    project = models.ForeignKey("mado.Project", on_delete=models.CASCADE, related_name="jobs")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(_("Run name"), max_length=200, blank=True)
    target = models.ForeignKey("computers.ComputeTarget", on_delete=models.PROTECT, related_name="jobs")
    runtime = models.CharField(_("Runtime"), max_length=16, choices=Runtime.choices, default=Runtime.PYTHON)
    image = models.CharField(_("Image"), max_length=1024, blank=True)
    command = models.JSONField(_("Command"), default=list)
    source = models.JSONField(null=True, blank=True)
    requirements = models.TextField(_("Requirements"), blank=True)
    parameters = models.JSONField(_("Parameters"), default=dict, blank=True)
    env = models.JSONField(default=dict, blank=True)
    gpu_ids = models.JSONField(_("GPU IDs"), default=list, blank=True)
    gpu_count = models.PositiveIntegerField(null=True, blank=True)
    walltime_seconds = models.PositiveIntegerField(null=True, blank=True)
    cluster_size = models.PositiveIntegerField(default=1)
    cluster_mode = models.CharField(max_length=16, choices=ClusterMode.choices, default=ClusterMode.SINGLE_NODE)
    # Cluster jobs (docs/cluster-jobs.md): GPUs are asked per replica and picked at claim time.
    gpus_per_replica = models.PositiveSmallIntegerField(default=0)
    compute_group = models.ForeignKey("computers.ComputeGroup", on_delete=models.SET_NULL, null=True, blank=True,
                                      related_name="jobs")
    end_replica = models.CharField(max_length=8, blank=True)

    status = models.CharField(max_length=20, choices=JobStatus.choices, default=JobStatus.QUEUED, db_index=True)
    end_reason = models.CharField(max_length=16, choices=EndReason.choices, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    error = models.CharField(max_length=1000, blank=True)
    worker = models.ForeignKey("workers.Worker", on_delete=models.SET_NULL, null=True, blank=True, related_name="jobs")
    lease_id = models.UUIDField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # When the periodic runner last announced this job as Not responding (audit `job.not_responding`):
    # once per silence, again only after a heartbeat newer than this (jobs.services.report_unresponsive).
    unresponsive_reported_at = models.DateTimeField(null=True, blank=True)
    # The worker that last gave this job back unstarted (its GPUs in use outside Mado) and when: that
    # worker does not claim it again for jobs.services.RELEASE_BACKOFF; other workers may.
    released_by = models.ForeignKey("workers.Worker", on_delete=models.SET_NULL, null=True, blank=True,
                                    related_name="+")
    released_at = models.DateTimeField(null=True, blank=True)
    stop_requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                          related_name="+")
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True, help_text=_("The validated result.json: version, models, datasets."))

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status", "created_at", "id"], name="job_queue_order")]

    def __str__(self) -> str:
        return self.name or f"job {self.pk}"

    def save(self, *args, **kwargs):
        """The status of a stored Job changes only through jobs.lifecycle.move: a save that would write
        the column (update_fields naming it, or a full save) is refused. A new Job starts where it likes."""
        fields = kwargs.get("update_fields")
        if not self._state.adding and (fields is None or "status" in fields):
            raise IllegalTransition(f"Job {self.pk}: save it with update_fields, without status; its status "
                                    "changes through jobs.lifecycle.move.")
        super().save(*args, **kwargs)

    @property
    def display_name(self) -> str:
        return self.name or f"job-{self.pk}"

    @property
    def command_line(self) -> str:
        """The command as its author would type it (it is stored as argv)."""
        return readable_command(self.command)

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def is_cluster(self) -> bool:
        return self.cluster_size > 1

    @property
    def is_multi_node(self) -> bool:
        return self.is_cluster and self.cluster_mode == ClusterMode.MULTI_NODE

    @property
    def replica_names(self) -> list[str]:
        return replica_names(self.cluster_size)

    @property
    def is_unresponsive(self) -> bool:
        """Shown as Not responding; never acted on automatically (GPUs stay reserved)."""
        return (self.status in HELD_STATUSES and self.heartbeat_at is not None
                and self.heartbeat_at < timezone.now() - UNRESPONSIVE_AFTER)


class GpuReservation(models.Model):
    """A GPU held by a job. The unique constraint is the last word: even a claim that bypassed the
    claim query could not put two jobs on one GPU."""

    target = models.ForeignKey("computers.ComputeTarget", on_delete=models.CASCADE, related_name="gpu_reservations")
    gpu_id = models.CharField(max_length=64)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="gpu_reservations")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["target", "gpu_id"], name="one_job_per_gpu")]

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} of {self.target_id} for job {self.job_id}"


class JobReplica(models.Model):
    """Where one replica of a cluster job runs: written in the claim transaction with its GPUs'
    reservations, kept after the job ends. Ordinary jobs have none."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="replicas")
    index = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=8)
    target = models.ForeignKey("computers.ComputeTarget", on_delete=models.PROTECT, related_name="job_replicas")
    gpu_ids = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["job", "index"]
        constraints = [models.UniqueConstraint(fields=["job", "index"], name="one_replica_per_index")]

    def __str__(self) -> str:
        return f"{self.name} of job {self.job_id} on {self.target_id}"

    @property
    def role(self) -> str:
        return "main" if self.index == 0 else "sub"


class LogChunk(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_chunks")
    replica = models.CharField(max_length=8, default=MAIN_REPLICA)
    stream = models.CharField(max_length=8, choices=Stream.choices)
    offset = models.BigIntegerField(help_text=_("Byte offset of the chunk in its stream."))
    data = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]
        constraints = [
            # At-least-once delivery: a resent chunk has the same offset and is ignored.
            models.UniqueConstraint(fields=["job", "replica", "stream", "offset"], name="log_chunk_once_per_replica"),
        ]

    @classmethod
    def store_new(cls, rows: list[LogChunk]) -> int:
        """Insert `rows` in their order with one statement; a row whose (job, replica, stream, offset) is
        already stored is skipped. Returns how many were new. One INSERT … ON CONFLICT DO NOTHING
        RETURNING counts them without the SELECT that bulk_create(ignore_conflicts=True) would need
        (it returns every object it was given); ids follow the list's order, which readers rely on."""
        from django.db import connection  # here, to keep this model's imports as they are

        if not rows:
            return 0
        table = connection.ops.quote_name(cls._meta.db_table)
        offset = connection.ops.quote_name("offset")
        values = ", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(rows))
        params: list = []
        for row in rows:
            params += [row.job_id, row.replica, row.stream, row.offset, row.data, row.created_at]
        sql = (f"INSERT INTO {table} (job_id, replica, stream, {offset}, data, created_at) "
               f"VALUES {values} ON CONFLICT DO NOTHING RETURNING id")
        if connection.vendor == "postgresql":
            # A psycopg cursor with server-side binding, in the same transaction: Django's cursor binds
            # on the client, which escapes and copies each MiB of text in Python (a third of the time a
            # 4 MiB chunk took to store, bench/log_throughput.py --profile).
            import psycopg

            connection.ensure_connection()
            with psycopg.Cursor(connection.connection) as cursor:
                cursor.execute(sql, params)
                return len(cursor.fetchall())
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return len(cursor.fetchall())


class Metric(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="metrics")
    name = models.CharField(max_length=200)
    value = models.FloatField()
    step = models.BigIntegerField(default=0)
    timestamp = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "step", "id"]
        indexes = [models.Index(fields=["job", "name", "step"], name="metric_series")]


def artifact_path(instance, filename):
    return f"artifacts/{instance.job.project_id}/{instance.job_id}/{instance.path}"


class Artifact(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="artifacts")
    path = models.CharField(max_length=1024)
    size = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    mime_type = models.CharField(max_length=200, blank=True)
    file = models.FileField(upload_to=artifact_path, max_length=1200, blank=True)
    received_bytes = models.BigIntegerField(default=0)
    complete = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["path"]
        constraints = [models.UniqueConstraint(fields=["job", "path"], name="artifact_unique_path")]


class JobEvent(models.Model):
    """The job's timeline on its page: created, claimed, started, stop requested, ended."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=32)
    message = models.CharField(max_length=500)

    class Meta:
        ordering = ["at", "id"]


def source_path(instance, filename):
    return f"sources/{instance.project_id}/{instance.sha256}.tar.gz"


class SourceArchive(models.Model):
    """A source directory uploaded by `mado-tracking jobs create --source DIR`, as a tar.gz."""

    project = models.ForeignKey("mado.Project", on_delete=models.CASCADE, related_name="source_archives")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    sha256 = models.CharField(max_length=64)
    size = models.BigIntegerField()
    file = models.FileField(upload_to=source_path, max_length=500)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"source {self.sha256[:12]} ({self.size} bytes)"
