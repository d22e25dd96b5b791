"""The only writers of MLflow 3 logged models (registry.models.LoggedModel): create, params, tags, finalize,
delete, a Run's outputs, and the logged model a result.json weights file gets so that MLflow clients can
download it. Creating and deleting write an AuditEvent. Errors are MLflow's (tracking.errors).

Who may write: members with runs:write (checked by the API); a job token only for a logged model whose
source Run is its own Job's Run, and it must name that Run when it creates one."""
from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

from django.conf import settings
from django.db import transaction

from mado import access as identity
from mado.choices import Role
from mado.services import Actor, audit
from registry.models import LoggedModel, LoggedModelStatus, ModelVersion
from tracking import access as run_access
from tracking.access import job_id_of
from tracking.artifacts import Tree
from tracking.choices import LifecycleStage
from tracking.errors import denied, invalid, not_found
from tracking.models import Experiment, Run, now_ms
from tracking.services import default_experiment
from tracking.validation import (
    MAX_PARAM_VAL_LENGTH,
    MAX_PARAMS_TAGS_PER_BATCH,
    MAX_TAG_VAL_LENGTH,
    as_long,
    experiment_id,
    validate_key,
    validate_run_id,
    validate_text,
)

MAX_NAME = 500
MAX_TYPE = 500
DELETED = LifecycleStage.DELETED
STATUS_NUMBERS = {"1": LoggedModelStatus.PENDING, "2": LoggedModelStatus.READY,
                  "3": LoggedModelStatus.UPLOAD_FAILED}  # the enum as a number (MLflow's proto JSON accepts it)


def root_of(model: LoggedModel) -> Path:
    return Path(settings.MEDIA_ROOT) / "mlflow-artifacts" / str(model.project_id) / "models" / model.model_id


# Reading ------------------------------------------------------------------------------------------

def visible_in(user, project):
    if not identity.has_role(user, project, Role.VIEWER):
        return LoggedModel.objects.none()
    return LoggedModel.objects.filter(project=project)


def model_for(user, project, model_id, *, allow_deleted: bool = False) -> LoggedModel:
    found = None
    if isinstance(model_id, str) and len(model_id) <= 34:
        found = visible_in(user, project).select_related("source_run").filter(pk=model_id).first()
    if found is None or (found.lifecycle_stage == DELETED and not allow_deleted):
        raise not_found(f"Logged model with ID '{str(model_id)[:100]}' not found.")
    return found


def tree_of(call, experiment: str, model_id: str) -> Tree:
    """tracking.artifacts' locator for `<experiment>/models/<model_id>/artifacts/…`."""
    model = model_for(call.user, call.project, model_id, allow_deleted=True)  # versions of it still download
    if str(model.experiment_id) != experiment:
        raise not_found(f"Logged model with ID '{model_id}' not found in experiment {experiment}.")

    return Tree(root_of(model), f"logged model {model.model_id}",
                lambda: check_writable(call.user, call.principal, model))


# Who may write ------------------------------------------------------------------------------------

def check_write(user, principal, model: LoggedModel) -> None:
    job_id = job_id_of(principal)
    if job_id is not None and (model.source_run is None or model.source_run.job_id != job_id):
        raise denied(f"This job token writes only the logged models of its own Job's Run; {model.model_id} is "
                     "not one of them. Use a personal token with runs:write.")
    if not identity.has_role(user, model.project, Role.MEMBER):
        raise denied("Writing logged models needs the member role in this project; ask a project admin.")


def check_writable(user, principal, model: LoggedModel) -> None:
    """The caller may write this model, and it is not deleted."""
    check_write(user, principal, model)
    if model.lifecycle_stage == DELETED:
        raise not_found(f"Logged model with ID '{model.model_id}' not found.")


# Validation ---------------------------------------------------------------------------------------

def _pairs(value, field: str, limit: int) -> dict:
    """MLflow's [{"key", "value"}] lists (params, tags) as a dict, each key and value checked."""
    if value in (None, ""):
        return {}
    if not isinstance(value, list):
        raise invalid(f"Invalid value {value!r:.200} for parameter '{field}' supplied: expected a list of "
                      "{\"key\": ..., \"value\": ...} objects.")
    if len(value) > MAX_PARAMS_TAGS_PER_BATCH:
        raise invalid(f"A request can contain at most {MAX_PARAMS_TAGS_PER_BATCH} {field}, got {len(value)}; "
                      "send them in batches.")
    pairs = {}
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise invalid(f"Invalid value {item!r:.200} for parameter '{field}[{index}]' supplied: expected an "
                          "object.")
        key = validate_key(item.get("key"), f"{field}[{index}].key", "Param" if field == "params" else "Tag")
        pairs[key] = validate_text(item.get("value"), f"{field}[{index}].value", limit, required=False)
    return pairs


def _status(value) -> str:
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    status = STATUS_NUMBERS.get(text, text)
    if status not in (LoggedModelStatus.READY, LoggedModelStatus.UPLOAD_FAILED, LoggedModelStatus.PENDING):
        raise invalid(f"Invalid value '{str(value)[:50]}' for parameter 'status' supplied. Use LOGGED_MODEL_READY "
                      "or LOGGED_MODEL_UPLOAD_FAILED.")
    return status


_ADJECTIVES = ("bright", "calm", "clever", "bold", "gentle", "quick", "quiet", "sunny", "swift", "wise")
_NOUNS = ("fox", "owl", "crane", "otter", "hawk", "lynx", "heron", "wolf", "koi", "finch")


def _random_name() -> str:
    return f"{random.choice(_ADJECTIVES)}-{random.choice(_NOUNS)}-{random.randint(100, 999)}"


# Writing ------------------------------------------------------------------------------------------

def create(actor: Actor, principal, project, *, experiment=None, name=None, model_type=None, source_run_id=None,
           params=None, tags=None) -> LoggedModel:
    """MLflow's CreateLoggedModel. The experiment is required and active ("0" is the project's default);
    a job token must name its own Job's Run as the source."""
    if experiment in (None, ""):
        raise invalid("Missing value for required parameter 'experiment_id'. See the API docs for more "
                      "information about request parameters.")
    number = experiment_id(experiment)
    found = default_experiment(project) if number == 0 else run_access.experiment_for(actor.user, project, number)
    run = None
    if source_run_id not in (None, ""):
        run = run_access.run_for(actor.user, project, validate_run_id(source_run_id, "source_run_id"))
    job_id = job_id_of(principal)
    if job_id is not None and (run is None or run.job_id != job_id):
        raise denied("A job token creates logged models only for its own Job's Run: pass source_run_id = "
                     "MLFLOW_RUN_ID (log_model inside mlflow.start_run() does), or use a personal token.")
    if not identity.has_role(actor.user, project, Role.MEMBER):
        raise denied("Creating logged models needs the member role in this project; ask a project admin.")
    if found.lifecycle_stage != LifecycleStage.ACTIVE:
        raise invalid(f"The experiment {found.pk} must be in the 'active' state. Current state is "
                      f"{found.lifecycle_stage}.")
    name = validate_text(name, "name", MAX_NAME, required=False) or _random_name()
    model_type = validate_text(model_type, "model_type", MAX_TYPE, required=False)
    params, tags = _pairs(params, "params", MAX_PARAM_VAL_LENGTH), _pairs(tags, "tags", MAX_TAG_VAL_LENGTH)
    with transaction.atomic():
        model = LoggedModel.objects.create(project=project, experiment=found, source_run=run, name=name,
                                           model_type=model_type, params=params, tags=tags, created_by=actor.user)
        audit(actor, "logged_model.create", model, project=project,
              after={"name": name, "experiment": found.pk, "run": run.run_id if run else None})
    return model


def _save(model: LoggedModel, *fields: str) -> LoggedModel:
    model.last_updated_time = now_ms()
    model.save(update_fields=[*fields, "last_updated_time"])
    return model


def finalize(actor: Actor, principal, model: LoggedModel, status) -> LoggedModel:
    check_writable(actor.user, principal, model)
    model.status = _status(status)
    return _save(model, "status")


def log_params(actor: Actor, principal, model: LoggedModel, params) -> LoggedModel:
    return _merge(actor, principal, model, "params", params, MAX_PARAM_VAL_LENGTH)


def set_tags(actor: Actor, principal, model: LoggedModel, tags) -> LoggedModel:
    return _merge(actor, principal, model, "tags", tags, MAX_TAG_VAL_LENGTH)


def _merge(actor: Actor, principal, model: LoggedModel, field: str, pairs, limit: int) -> LoggedModel:
    """MLflow's key/value lists into the model's `field` (params or tags), the row locked meanwhile."""
    check_writable(actor.user, principal, model)
    with transaction.atomic():
        model = LoggedModel.objects.select_for_update().get(pk=model.pk)
        getattr(model, field).update(_pairs(pairs, field, limit))
        return _save(model, field)


def delete_tag(actor: Actor, principal, model: LoggedModel, key) -> None:
    check_writable(actor.user, principal, model)
    with transaction.atomic():
        model = LoggedModel.objects.select_for_update().get(pk=model.pk)
        if key not in model.tags:
            raise not_found(f"No tag with key {str(key)[:250]!r} found for logged model {model.model_id}.")
        del model.tags[key]
        _save(model, "tags")


def delete(actor: Actor, principal, model: LoggedModel) -> None:
    """As MLflow: the logged model is marked deleted (hidden, its files kept); versions registered from it
    stay and still download."""
    check_writable(actor.user, principal, model)
    with transaction.atomic():
        model.lifecycle_stage = DELETED
        _save(model, "lifecycle_stage")
        audit(actor, "logged_model.delete", model, project=model.project, before={"name": model.name})


def log_outputs(actor: Actor, principal, run: Run, outputs) -> None:
    """MLflow's LogOutputs: the Run produced these logged models (at a step). Each must be the Run's own."""
    run_access.check_can_write(actor.user, principal, run)
    if not isinstance(outputs, list):
        raise invalid("Parameter 'models' is a list of {\"model_id\": ..., \"step\": ...} objects.")
    steps = {}
    for index, item in enumerate(outputs):
        if not isinstance(item, dict):
            raise invalid(f"models[{index}] must be an object with model_id and step.")
        model = model_for(actor.user, run.project, item.get("model_id"))
        if model.source_run_id != run.run_id:
            raise invalid(f"Logged model {model.model_id} was not created by Run {run.run_id} (its source_run_id "
                          "differs); log it as an output of the Run that made it.")
        steps[model.pk] = as_long(item.get("step"), f"models[{index}].step", default=0)
    for model_id, step in steps.items():
        LoggedModel.objects.filter(pk=model_id).update(output_step=step, last_updated_time=now_ms())


# result.json weights: a logged model that holds the file ------------------------------------------

def for_stored_file(version: ModelVersion) -> LoggedModel | None:
    """The logged model of a version whose bytes are one stored file (result.json `models`, kept with the
    job's outputs; or one file of a Run's artifacts): a directory holding that file, hard-linked (copied across
    file systems), because MLflow's clients download a model as a directory. Made once; None when the
    version's bytes are not one file here (a folder of a Run's artifacts downloads as it is)."""
    if version.logged_model_id is not None:
        return version.logged_model
    source = Path(settings.MEDIA_ROOT) / version.stored_path if version.stored_path else None
    run = version.run
    if source is None or not source.is_file() or run is None:
        return None
    experiment = Experiment.objects.get(pk=run.experiment_id)
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().get(pk=version.pk)
        if locked.logged_model_id is not None:  # a concurrent first download made it
            return locked.logged_model
        model = LoggedModel.objects.create(project=experiment.project, experiment=experiment, source_run=run,
                                           name=version.model.name, status=LoggedModelStatus.READY,
                                           tags={"mado.registered_from": version.source[:MAX_TAG_VAL_LENGTH]},
                                           created_by=version.created_by)
        target = root_of(model) / source.name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copyfile(source, target)
        ModelVersion.objects.filter(pk=version.pk).update(logged_model=model)
    version.logged_model = model
    return model
