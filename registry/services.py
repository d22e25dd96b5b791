"""The only writers of registered models, their versions and aliases. Creating, renaming and deleting a
model or a version writes an AuditEvent. Errors are MLflow's (tracking.errors): the MLflow API answers
them as they are; the job-completion path turns them into the job protocol's ServiceError."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils.translation import gettext as _

from mado import access as identity
from mado import storage
from mado.choices import Role
from mado.errors import ServiceError
from mado.services import Actor, audit
from registry import logged_models
from registry.models import ModelAlias, ModelVersion, RegisteredModel, Stage
from tracking import access as run_access
from tracking import artifacts as run_artifacts
from tracking.access import job_id_of
from tracking.choices import RunKind
from tracking.errors import MlflowError, denied, invalid, not_found
from tracking.models import Run, now_ms

MAX_NAME = 256
MAX_TAG_VALUE = 5000
ALIAS = re.compile(r"^[\w\-]+$")
MODEL_KINDS = (RunKind.TRAINING, RunKind.FINE_TUNING)
ARTIFACT_URI = re.compile(
    r"^mlflow-artifacts:/+(?P<experiment>\d+)/(?P<run>[0-9a-f]{1,32})/artifacts(?:/(?P<path>.*))?$")
RUNS_URI = re.compile(r"^runs:/(?P<run>[0-9a-f]{1,32})(?:/(?P<path>.*))?$")
LOGGED_MODEL_URI = re.compile(r"^models:/(?P<id>m-[0-9a-f]{32})/?$")


# Who may do what ------------------------------------------------------------------------------------

def models_visible_in(user, project):
    if not identity.has_role(user, project, Role.VIEWER):
        return RegisteredModel.objects.none()
    return RegisteredModel.objects.filter(project=project)


def model_for(user, project, name) -> RegisteredModel:
    model = models_visible_in(user, project).filter(name=name).first() if name else None
    if model is None:
        raise not_found(f"Registered Model with name={name} not found")
    return model


def version_for(model: RegisteredModel, version) -> ModelVersion:
    number = _version_number(version)
    found = model.versions.select_related("run").filter(version=number).first()
    if found is None:
        raise not_found(f"Model Version (name={model.name}, version={version}) not found")
    return found


def _check_member(user, project) -> None:
    if not identity.has_role(user, project, Role.MEMBER):
        raise denied("Writing to the model registry needs the member role in this project; ask a project admin.")


def _check_person_write(actor: Actor, principal, project, what: str) -> None:
    """What only people do (a job token creates versions from its own Run only): a member's change."""
    if job_id_of(principal) is not None:
        raise denied(f"A job token cannot {what}; it creates model versions from its own Job's Run only. Use a "
                     "personal token with registry:write.")
    _check_member(actor.user, project)


def _check_version_write(user, principal, version: ModelVersion) -> None:
    job_id = job_id_of(principal)
    if job_id is not None and (version.run is None or version.run.job_id != job_id):
        raise denied(f"This job token changes only the model versions made from its own Job's Run; version "
                     f"{version.version} of {version.model.name} is not one of them.")
    _check_member(user, version.model.project)


# Validation ---------------------------------------------------------------------------------------

def _name(value, field="name") -> str:
    if not isinstance(value, str) or not value.strip():
        raise invalid(f"Missing value for required parameter '{field}'. Registered model names are non-empty "
                      "strings.")
    if len(value) > MAX_NAME:
        raise invalid(f"Registered model name '{value[:50]}…' is {len(value)} characters; the limit is {MAX_NAME}.")
    if "/" in value or ":" in value or any(ord(c) < 32 for c in value):
        raise invalid(f"Invalid registered model name '{value}': names may not contain '/', ':' or control "
                      "characters.")
    return value


def _version_number(value) -> int:
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    if not re.fullmatch(r"[0-9]{1,10}", text) or not 0 < int(text) < 2**31:
        raise invalid(f"Parameter 'version' must be a whole number from 1 to {2**31 - 1}, got '{value!s:.50}'.")
    return int(text)


def _text(value, field: str, limit: int = MAX_TAG_VALUE) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise invalid(f"Invalid value {value!r:.100} for parameter '{field}' supplied: expected a string.")
    if len(value) > limit:
        raise invalid(f"'{field}' exceeds the maximum length of {limit} characters.")
    return value


def _tags(value) -> dict:
    if value in (None, ""):
        return {}
    if not isinstance(value, list):
        raise invalid("Parameter 'tags' is a list of {\"key\": ..., \"value\": ...} objects.")
    tags = {}
    for index, tag in enumerate(value):
        if not isinstance(tag, dict) or not isinstance(tag.get("key"), str) or not tag["key"].strip():
            raise invalid(f"tags[{index}] needs a non-empty string key.")
        if len(tag["key"]) > 250:
            raise invalid(f"tags[{index}].key exceeds the maximum length of 250 characters.")
        tags[tag["key"]] = _text(tag.get("value"), f"tags[{index}].value")
    return tags


def _alias(value) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME or not ALIAS.match(value):
        raise invalid(f"Invalid alias name '{value}'. Aliases may only contain alphanumerics, '_' and '-'.")
    if value.lower() == "latest" or re.fullmatch(r"[vV]\d+", value):
        raise invalid(f"Invalid alias name '{value}'. Aliases 'latest' and 'v<number>' are reserved.")
    return value


def _touch(obj, *fields: str) -> None:
    """Saves `fields` of a model or version, and its last update time as now."""
    obj.last_updated_time = now_ms()
    obj.save(update_fields=[*fields, "last_updated_time"])


# Registered models --------------------------------------------------------------------------------

def create_model(actor: Actor, principal, project, *, name, description=None, tags=None) -> RegisteredModel:
    """Job tokens may create a model (mlflow.register_model does so before creating the version)."""
    _check_member(actor.user, project)
    name = _name(name)
    description, tags = _text(description, "description", 100_000), _tags(tags)
    try:
        with transaction.atomic():
            model = RegisteredModel.objects.create(project=project, name=name, description=description, tags=tags,
                                                   created_by=actor.user)
            audit(actor, "registered_model.create", model, project=project, after={"name": name})
    except IntegrityError:
        raise MlflowError(f"Registered Model (name={name}) already exists.", "RESOURCE_ALREADY_EXISTS") from None
    return model


def update_model(actor: Actor, principal, model: RegisteredModel, *, description) -> RegisteredModel:
    _check_person_write(actor, principal, model.project, "change a registered model")
    model.description = _text(description, "description", 100_000)
    _touch(model, "description")
    return model


def rename_model(actor: Actor, principal, model: RegisteredModel, new_name) -> RegisteredModel:
    _check_person_write(actor, principal, model.project, "rename a registered model")
    new_name = _name(new_name, "new_name")
    if new_name == model.name:
        return model
    if RegisteredModel.objects.filter(project=model.project, name=new_name).exists():
        raise MlflowError(f"Registered Model (name={new_name}) already exists.", "RESOURCE_ALREADY_EXISTS")
    before = model.name
    with transaction.atomic():
        model.name = new_name
        _touch(model, "name")
        audit(actor, "registered_model.rename", model, project=model.project, before={"name": before},
              after={"name": new_name})
    return model


def delete_model(actor: Actor, principal, model: RegisteredModel) -> None:
    """The versions go with it; their bytes stay with their Runs (the registry points at them)."""
    _check_person_write(actor, principal, model.project, "delete a registered model")
    with transaction.atomic():
        audit(actor, "registered_model.delete", model, project=model.project,
              before={"name": model.name, "versions": model.versions.count()})
        model.delete()


def set_model_tag(actor: Actor, principal, model: RegisteredModel, key, value) -> None:
    _check_person_write(actor, principal, model.project, "change a registered model")
    model.tags.update(_tags([{"key": key, "value": value}]))
    _touch(model, "tags")


def delete_model_tag(actor: Actor, principal, model: RegisteredModel, key) -> None:
    _check_person_write(actor, principal, model.project, "change a registered model")
    if key not in model.tags:
        raise not_found(f"No tag with name: {key} in registered model {model.name}.")
    del model.tags[key]
    model.save(update_fields=["tags"])


# Versions -----------------------------------------------------------------------------------------

def _stored(run: Run, source: str) -> str:
    """Where the bytes of a source URI inside this Run's artifacts are, relative to MEDIA_ROOT ("" when
    the source is elsewhere or not uploaded)."""
    match = ARTIFACT_URI.match(source) or RUNS_URI.match(source)
    if match is None or match.group("run") != run.run_id:
        return ""
    inner = (match.group("path") or "").strip("/")
    root = run_artifacts.root_of(run)
    target = (root / inner) if inner else root
    try:
        target.resolve().relative_to(root.resolve())
    except ValueError:
        raise invalid(f"Invalid source '{source}': artifact paths are relative and normalized (no '..').") from None
    if not target.exists():
        return ""
    return str(target.relative_to(Path(settings.MEDIA_ROOT)))


def _digest(relative: str) -> tuple[str, int | None]:
    """sha256 and size of a stored file; for a directory, the sha256 of its sorted "path sha256\\n" lines."""
    if not relative:
        return "", None
    target = Path(settings.MEDIA_ROOT) / relative
    if target.is_file():
        return storage.sha256_of(target), target.stat().st_size
    lines, total = hashlib.sha256(), 0
    for file in sorted(p for p in target.rglob("*") if p.is_file() and not p.name.endswith((".uploading", ".lock"))):
        lines.update(f"{file.relative_to(target).as_posix()} {storage.sha256_of(file)}\n".encode())
        total += file.stat().st_size
    return lines.hexdigest(), total


def create_version(actor: Actor, principal, model: RegisteredModel, *, source, run_id=None, tags=None,
                   description=None, run_link=None, model_id=None) -> ModelVersion:
    """From a Run's artifacts (runs:/…, mlflow-artifacts:/…) or, MLflow 3's way, a logged model
    (source models:/<model_id> or model_id): its bytes are where the source points."""
    source = _text(source, "source", 5000)
    if not source:
        raise invalid("Missing value for required parameter 'source'. Pass the model's artifact URI, e.g. "
                      "runs:/<run_id>/model.")
    logged = _logged_model(actor, model.project, source, model_id)
    run = None
    if run_id:
        run = run_access.run_for(actor.user, model.project, str(run_id))
    elif logged is not None:
        run = logged.source_run
    else:
        match = ARTIFACT_URI.match(source) or RUNS_URI.match(source)
        if match is not None:
            run = run_access.runs_visible_in(actor.user, model.project).filter(pk=match.group("run")).first()
    job_id = job_id_of(principal)
    if job_id is not None and (run is None or run.job_id != job_id):
        raise denied("This job token creates model versions only from its own Job's Run; "
                     f"{'Run ' + run.run_id if run else 'a version without a run_id'} is not that Run. Pass "
                     "run_id=MLFLOW_RUN_ID, or use a personal token with registry:write.")
    _check_member(actor.user, model.project)
    tags, description = _tags(tags), _text(description, "description", 100_000)
    if logged is not None:
        root = logged_models.root_of(logged)
        stored = str(root.relative_to(Path(settings.MEDIA_ROOT))) if root.is_dir() else ""
    else:
        stored = _stored(run, source) if run is not None else ""
    digest, size = _digest(stored)
    return _new_version(actor, model, source=source, run=run, stored=stored, digest=digest, size=size, tags=tags,
                        description=description, run_link=_text(run_link, "run_link", 5000), logged_model=logged)


def _logged_model(actor: Actor, project, source: str, model_id):
    """The logged model a version is registered from: model_id, else a models:/<model_id> source."""
    if model_id in (None, ""):
        match = LOGGED_MODEL_URI.match(source)
        model_id = match.group("id") if match else None
    if model_id is None:
        return None
    if not isinstance(model_id, str):
        raise invalid(f"Invalid value {model_id!r:.100} for parameter 'model_id' supplied: expected a string.")
    return logged_models.model_for(actor.user, project, model_id)


def _new_version(actor: Actor, model: RegisteredModel, **fields) -> ModelVersion:
    with transaction.atomic():
        model = RegisteredModel.objects.select_for_update().get(pk=model.pk)
        number = (model.versions.aggregate(top=Max("version"))["top"] or 0) + 1
        version = ModelVersion.objects.create(model=model, version=number, created_by=actor.user,
                                              stored_path=fields.pop("stored"), **fields)
        _touch(model)
        audit(actor, "model_version.create", version, project=model.project,
              after={"model": model.name, "version": number, "source": version.source, "digest": version.digest,
                     "run": version.run_id})
    return version


def update_version(actor: Actor, principal, version: ModelVersion, *, description) -> ModelVersion:
    _check_version_write(actor.user, principal, version)
    version.description = _text(description, "description", 100_000)
    _touch(version, "description")
    return version


def delete_version(actor: Actor, principal, version: ModelVersion) -> None:
    _check_person_write(actor, principal, version.model.project, "delete a model version")
    with transaction.atomic():
        audit(actor, "model_version.delete", version, project=version.model.project,
              before={"model": version.model.name, "version": version.version})
        version.delete()


def stage_name(stage) -> str:
    """MLflow's stage names, in any case ("production" is Production)."""
    names = {s.value.lower(): s.value for s in Stage}
    if not isinstance(stage, str) or stage.lower() not in names:
        raise invalid(f"Invalid Model Version stage: {stage!s:.50}. Value must be one of None, Staging, "
                      "Production, Archived.")
    return names[stage.lower()]


def transition_stage(actor: Actor, principal, version: ModelVersion, stage, archive_existing) -> ModelVersion:
    """MLflow's legacy stages (MLflow 3 still serves transition-stage; aliases are the current way)."""
    _check_version_write(actor.user, principal, version)
    stage = stage_name(stage)
    if archive_existing not in (None, True, False, "true", "True", "false", "False"):
        raise invalid(f"Invalid value {archive_existing!s:.50} for parameter 'archive_existing_versions' "
                      "supplied: expected true or false.")
    archive = archive_existing in (True, "true", "True")
    with transaction.atomic():
        if archive and stage in (Stage.STAGING, Stage.PRODUCTION):
            version.model.versions.filter(stage=stage).exclude(pk=version.pk).update(stage=Stage.ARCHIVED,
                                                                                    last_updated_time=now_ms())
        version.stage = stage
        _touch(version, "stage")
    return version


def set_version_tag(actor: Actor, principal, version: ModelVersion, key, value) -> None:
    _check_version_write(actor.user, principal, version)
    version.tags.update(_tags([{"key": key, "value": value}]))
    version.save(update_fields=["tags"])


def delete_version_tag(actor: Actor, principal, version: ModelVersion, key) -> None:
    _check_version_write(actor.user, principal, version)
    if key not in version.tags:
        raise not_found(f"No tag with name: {key} in model version {version.model.name} v{version.version}.")
    del version.tags[key]
    version.save(update_fields=["tags"])


def set_alias(actor: Actor, principal, model: RegisteredModel, alias, version) -> None:
    _check_person_write(actor, principal, model.project, "set a model alias")
    alias, target = _alias(alias), version_for(model, version)
    ModelAlias.objects.update_or_create(model=model, alias=alias, defaults={"version": target})
    _touch(model)


def delete_alias(actor: Actor, principal, model: RegisteredModel, alias) -> None:
    _check_person_write(actor, principal, model.project, "delete a model alias")
    ModelAlias.objects.filter(model=model, alias=_alias(alias)).delete()


def version_by_alias(model: RegisteredModel, alias) -> ModelVersion:
    found = ModelAlias.objects.select_related("version").filter(model=model, alias=alias).first()
    if found is None:
        raise not_found(f"Registered model alias {alias} not found.")
    return found.version


# result.json `models` (jobs.outputs handlers) -------------------------------------------------------

def check_job_models(job, models: list[dict]) -> None:
    """At declaration time: only a training or fine-tuning Run declares models."""
    run = Run.objects.filter(job=job).only("kind").first()
    kind = run.kind if run else None
    if kind not in MODEL_KINDS:
        shown = RunKind(kind).label if kind in RunKind.values else _("none")
        raise ServiceError(
            _("Only training and fine-tuning Runs can declare models in result.json; this job's Run is of kind "
              "%(kind)s. Remove \"models\", or submit the job with run_kind training or fine-tuning.")
            % {"kind": shown}, "models_not_allowed", fields={"result": ["models"]})


def register_job_models(job) -> list[ModelVersion]:
    """In the finished job's completion transaction: each declared weights file becomes a version of the
    model named by its modelId (or the Run's name), pointing at the uploaded artifact. Runs once."""
    run = Run.objects.select_related("experiment").filter(job=job).first()
    if run is None or run.kind not in MODEL_KINDS or run.model_versions.exists():
        return []
    actor = Actor(job.created_by)
    created = []
    for item in (job.result or {}).get("models") or []:
        artifact = job.artifacts.filter(path=item["path"], complete=True).first()
        if artifact is None:
            continue
        name = (item.get("model_id") or run.name or job.display_name)[:MAX_NAME].replace("/", "-").replace(":", "-")
        model = RegisteredModel.objects.filter(project=job.project, name=name).first()
        if model is None:
            with transaction.atomic():
                model = RegisteredModel.objects.create(project=job.project, name=name, created_by=job.created_by,
                                                       description="")
                audit(actor, "registered_model.create", model, project=job.project, after={"name": name,
                                                                                          "job": job.pk})
        metadata = item.get("metadata") or {}
        tags = {str(k)[:250]: str(v)[:MAX_TAG_VALUE] for k, v in metadata.items()} if isinstance(metadata, dict) \
            else {}
        version = _new_version(actor, model, source=f"runs:/{run.run_id}/container/{artifact.path}", run=run,
                               stored=artifact.file.name, digest=artifact.sha256, size=artifact.size, tags=tags,
                               description="", run_link="")
        logged_models.for_stored_file(version)  # what MLflow clients download models:/<name>/<version> from
        created.append(version)
    return created
