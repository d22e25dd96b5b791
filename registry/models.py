"""The model registry: registered models of a project and their numbered versions (MLflow's data model:
versions have a source URI and Run, tags, a legacy stage and, the current MLflow way, aliases), and MLflow 3's
logged models (a model's files, params and tags, made by a Run, before any registration).

Logged models live here, above tracking, because they are what versions are registered from; tracking
serves their files through its artifact API without knowing them (tracking.artifacts.register_tree)."""
from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from tracking.models import now_ms


class Stage(models.TextChoices):
    """MLflow's model version stages (deprecated in MLflow 3 in favour of aliases, still served)."""
    NONE = "None", _("None")
    STAGING = "Staging", _("Staging")
    PRODUCTION = "Production", _("Production")
    ARCHIVED = "Archived", _("Archived")


class RegisteredModel(models.Model):
    project = models.ForeignKey("mado.Project", on_delete=models.CASCADE, related_name="registered_models")
    name = models.CharField(_("name"), max_length=256)
    description = models.TextField(blank=True)
    tags = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="+")
    creation_time = models.BigIntegerField(default=now_ms)
    last_updated_time = models.BigIntegerField(default=now_ms)

    class Meta:
        ordering = ["project", "name"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="registered_model_name_per_project")]

    def __str__(self) -> str:
        return self.name


def new_model_id() -> str:
    return f"m-{uuid.uuid4().hex}"  # MLflow's form, so clients that check for "m-" recognise it


class LoggedModelStatus(models.TextChoices):
    """MLflow's LoggedModelStatus enum names, as its JSON carries them."""
    PENDING = "LOGGED_MODEL_PENDING", _("Pending")
    READY = "LOGGED_MODEL_READY", _("Ready")
    UPLOAD_FAILED = "LOGGED_MODEL_UPLOAD_FAILED", _("Upload failed")


class LoggedModel(models.Model):
    """An MLflow 3 logged model (`models:/<model_id>`): its files are an artifact tree of their own,
    MEDIA_ROOT/mlflow-artifacts/<project>/models/<model_id>/ (artifact_uri below)."""
    model_id = models.CharField(max_length=34, primary_key=True, default=new_model_id, editable=False)
    project = models.ForeignKey("mado.Project", on_delete=models.CASCADE, related_name="logged_models")
    experiment = models.ForeignKey("tracking.Experiment", on_delete=models.CASCADE, related_name="logged_models")
    source_run = models.ForeignKey("tracking.Run", on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="logged_models")
    output_step = models.BigIntegerField(null=True, blank=True)  # MLflow's LogOutputs: the Run's step
    name = models.CharField(_("name"), max_length=500)
    model_type = models.CharField(max_length=500, blank=True)
    status = models.CharField(max_length=32, choices=LoggedModelStatus.choices, default=LoggedModelStatus.PENDING)
    status_message = models.TextField(blank=True)
    lifecycle_stage = models.CharField(max_length=16, default="active")
    params = models.JSONField(default=dict, blank=True)
    tags = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="+")
    creation_time = models.BigIntegerField(default=now_ms)
    last_updated_time = models.BigIntegerField(default=now_ms)

    class Meta:
        ordering = ["-creation_time", "model_id"]
        indexes = [models.Index(fields=["experiment", "name"], name="logged_model_experiment_name")]

    def __str__(self) -> str:
        return self.name

    @property
    def artifact_uri(self) -> str:
        return f"mlflow-artifacts:/{self.experiment_id}/models/{self.model_id}/artifacts"


class ModelVersion(models.Model):
    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    description = models.TextField(blank=True)
    source = models.TextField(help_text=_("The artifact URI the version was registered from."))
    run = models.ForeignKey("tracking.Run", on_delete=models.SET_NULL, null=True, blank=True,
                            related_name="model_versions")
    run_link = models.TextField(blank=True)
    logged_model = models.ForeignKey(LoggedModel, on_delete=models.SET_NULL, null=True, blank=True,
                                     related_name="versions")
    # Where the bytes are on this server, relative to MEDIA_ROOT (a file or a directory); "" when the
    # source is elsewhere.
    stored_path = models.CharField(max_length=1000, blank=True)
    digest = models.CharField(max_length=64, blank=True, help_text=_("sha256 of the file (or of a directory's "
                                                                     "path and sha256 list)."))
    size = models.BigIntegerField(null=True, blank=True)
    status = models.CharField(max_length=32, default="READY")
    stage = models.CharField(max_length=16, choices=Stage.choices, default=Stage.NONE)
    tags = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="+")
    creation_time = models.BigIntegerField(default=now_ms)
    last_updated_time = models.BigIntegerField(default=now_ms)

    class Meta:
        ordering = ["model", "-version"]
        constraints = [models.UniqueConstraint(fields=["model", "version"], name="model_version_number")]

    def __str__(self) -> str:
        return f"{self.model.name} v{self.version}"


class ModelAlias(models.Model):
    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="aliases")
    alias = models.CharField(max_length=256)
    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="aliases")

    class Meta:
        ordering = ["alias"]
        constraints = [models.UniqueConstraint(fields=["model", "alias"], name="model_alias_once")]
