"""The model registry: registered models of a project and their numbered versions (MLflow's data model:
versions have a source URI and Run, tags, a legacy stage and, the current MLflow way, aliases)."""
from __future__ import annotations

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


class ModelVersion(models.Model):
    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    description = models.TextField(blank=True)
    source = models.TextField(help_text=_("The artifact URI the version was registered from."))
    run = models.ForeignKey("tracking.Run", on_delete=models.SET_NULL, null=True, blank=True,
                            related_name="model_versions")
    run_link = models.TextField(blank=True)
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
