"""Experiments and Runs: what running code records (MLflow's data model, one Run per Job)."""
from __future__ import annotations

import math
import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from tracking.choices import LifecycleStage, RunKind, RunStatus


def now_ms() -> int:
    return int(timezone.now().timestamp() * 1000)


def point_value(value: float, is_nan: bool) -> float:
    """A stored metric value as logged: NaN where is_nan (stored as 0, as MLflow's server does)."""
    return math.nan if is_nan else value


def new_run_id() -> str:
    return uuid.uuid4().hex


class Experiment(models.Model):
    project = models.ForeignKey("mado.Project", on_delete=models.CASCADE, related_name="experiments")
    name = models.CharField(_("name"), max_length=500)
    is_default = models.BooleanField(default=False)
    lifecycle_stage = models.CharField(max_length=16, choices=LifecycleStage.choices, default=LifecycleStage.ACTIVE)
    tags = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="+")
    creation_time = models.BigIntegerField(default=now_ms)
    last_update_time = models.BigIntegerField(default=now_ms)

    class Meta:
        ordering = ["project", "name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="experiment_name_per_project"),
            models.UniqueConstraint(fields=["project"], condition=models.Q(is_default=True),
                                    name="one_default_experiment_per_project"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def artifact_location(self) -> str:
        return f"mlflow-artifacts:/{self.pk}"


class Run(models.Model):
    run_id = models.CharField(max_length=32, primary_key=True, default=new_run_id, editable=False)
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="runs")
    project = models.ForeignKey("mado.Project", on_delete=models.CASCADE, related_name="runs")
    job = models.OneToOneField("jobs.Job", on_delete=models.SET_NULL, null=True, blank=True, related_name="run")
    name = models.CharField(_("Run name"), max_length=250, blank=True)
    kind = models.CharField(_("Kind"), max_length=16, choices=RunKind.choices, default=RunKind.OTHER)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.RUNNING, db_index=True)
    start_time = models.BigIntegerField(null=True, blank=True)  # milliseconds since the epoch, as MLflow
    end_time = models.BigIntegerField(null=True, blank=True)
    lifecycle_stage = models.CharField(max_length=16, choices=LifecycleStage.choices, default=LifecycleStage.ACTIVE)
    deleted_time = models.BigIntegerField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="runs")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-run_id"]
        indexes = [models.Index(fields=["experiment", "start_time"], name="run_experiment_start")]

    def __str__(self) -> str:
        return self.name or self.run_id

    @property
    def artifact_uri(self) -> str:
        return f"mlflow-artifacts:/{self.experiment_id}/{self.run_id}/artifacts"


class Param(models.Model):
    """Immutable once logged (as in MLflow): the same key again must carry the same value."""
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="params")
    key = models.CharField(max_length=250)
    value = models.TextField()

    class Meta:
        ordering = ["key"]
        constraints = [models.UniqueConstraint(fields=["run", "key"], name="param_once_per_run")]


class Tag(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tags")
    key = models.CharField(max_length=250)
    value = models.TextField()

    class Meta:
        ordering = ["key"]
        constraints = [models.UniqueConstraint(fields=["run", "key"], name="tag_once_per_run")]


class Metric(models.Model):
    """One point of a series. A point may be ±inf or NaN, as MLflow allows; NaN is stored as MLflow's own
    server stores it (value 0, is_nan true: SQLite cannot hold NaN, and NaN must compare equal to itself for
    the uniqueness below). Read the value through `point_value`.

    The same point (run, key, step, timestamp, value) is stored once, as MLflow's primary key does: a batch
    sent again after its answer was lost adds nothing. The unique index also serves get-history.

    The Run is no database foreign key (db_constraint=False): PostgreSQL checked it once per point, a
    third of storing a 1000-point batch, for a Run the statement's caller has just read. Django still
    deletes a Run's points with it (on_delete is Django's, not the database's)."""
    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_points", db_index=False,
                            db_constraint=False)
    key = models.CharField(max_length=250)
    value = models.FloatField()
    timestamp = models.BigIntegerField()
    step = models.BigIntegerField(default=0)
    is_nan = models.BooleanField(default=False)

    class Meta:
        ordering = ["key", "step", "timestamp", "id"]
        constraints = [models.UniqueConstraint(fields=["run", "key", "step", "timestamp", "value", "is_nan"],
                                               name="metric_point_once")]

    @property
    def point_value(self) -> float:
        return point_value(self.value, self.is_nan)


class LatestMetric(models.Model):
    """The latest point of each series (largest step, then timestamp, then value, as MLflow): kept up
    to date by every write, so get_run and searches on metrics never scan a history. `points` counts the
    series' stored points, written by the same statement as they are: the Run panel's change stamp, so a
    poll of an open job page does not count a history."""
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="latest_metrics")
    key = models.CharField(max_length=250)
    value = models.FloatField()
    timestamp = models.BigIntegerField()
    step = models.BigIntegerField(default=0)
    is_nan = models.BooleanField(default=False)  # as Metric.is_nan
    points = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["key"]
        constraints = [models.UniqueConstraint(fields=["run", "key"], name="latest_metric_per_run")]

    @property
    def point_value(self) -> float:
        return point_value(self.value, self.is_nan)


class RunInput(models.Model):
    """A dataset input as MLflow's log-inputs sends it."""
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="inputs")
    name = models.CharField(max_length=500)
    digest = models.CharField(max_length=36)
    source_type = models.CharField(max_length=36, blank=True)
    source = models.TextField(blank=True)
    schema = models.TextField(blank=True)
    profile = models.TextField(blank=True)
    tags = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["run", "name", "digest"], name="run_input_once")]
