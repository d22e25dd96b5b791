"""MLflow 3's logged models under /mlflow/ (logged-models…, runs/outputs), with MLflow's paths, JSON and
error body (tracking.mlflow_api.endpoint). What `mlflow.<flavor>.log_model`, `mlflow.initialize_logged_model`,
`mlflow.log_model_params` and `mlflow.search_logged_models` call; the model's files go through the
proxied artifact API at its artifact_uri (mlflow-artifacts:/<experiment>/models/<model_id>/artifacts).

Scopes: `read` to read, `runs:write` to write (logged models belong to Runs); a job token writes only the
logged models of its own Job's Run."""
from __future__ import annotations

from django.db.models import Prefetch

from mado.choices import Scope
from registry import logged_models
from registry.mlflow_api import search_filter
from registry.models import LoggedModel, ModelVersion
from tracking.artifacts import clean_path, entries
from tracking.errors import invalid
from tracking.mlflow_api import RUNS_WRITE, Call, endpoint, page_bounds, paged, require_scope, searched_experiments

READ = Scope.READ.value
MAX_RESULTS = 1000
FIELDS = {"name": "name", "model_id": "model_id", "model_type": "model_type", "status": "status",
          "source_run_id": "source_run_id"}
ORDER = {"name": "name", "model_id": "model_id", "creation_timestamp": "creation_time",
         "creation_time": "creation_time", "last_updated_timestamp": "last_updated_time"}


def _pairs(values: dict) -> list[dict]:
    return [{"key": k, "value": v} for k, v in sorted(values.items())]


def model_json(model: LoggedModel) -> dict:
    info = {"model_id": model.model_id, "experiment_id": str(model.experiment_id), "name": model.name,
            "creation_timestamp_ms": model.creation_time, "last_updated_timestamp_ms": model.last_updated_time,
            "artifact_uri": model.artifact_uri, "status": model.status, "model_type": model.model_type,
            "status_message": model.status_message, "tags": _pairs(model.tags),
            "registrations": [{"name": v.model.name, "version": str(v.version)} for v in model.versions.all()]}
    if model.source_run_id:
        info["source_run_id"] = model.source_run_id
    return {"info": info, "data": {"params": _pairs(model.params), "metrics": []}}


def _model(call: Call, model_id: str, *, allow_deleted: bool = False) -> LoggedModel:
    return logged_models.model_for(call.user, call.project, model_id, allow_deleted=allow_deleted)


def _answer(model: LoggedModel) -> dict:
    fresh = LoggedModel.objects.prefetch_related(
        Prefetch("versions", queryset=ModelVersion.objects.select_related("model"))).get(pk=model.pk)
    return {"model": model_json(fresh)}


@endpoint(RUNS_WRITE)
def create(call: Call):
    model = logged_models.create(call.actor, call.principal, call.project, experiment=call.get("experiment_id"),
                                 name=call.get("name"), model_type=call.get("model_type"),
                                 source_run_id=call.get("source_run_id"), params=call.get("params"),
                                 tags=call.get("tags"))
    return _answer(model)


@endpoint(READ, methods=("GET", "PATCH", "DELETE"))
def one(call: Call, model_id: str):
    """One path, three MLflow calls: GET reads, PATCH finalizes (sets the status), DELETE deletes."""
    if call.request.method == "GET":
        allow_deleted = str(call.get("allow_deleted") or "").lower() == "true"
        return _answer(_model(call, model_id, allow_deleted=allow_deleted))
    require_scope(call, RUNS_WRITE)
    model = _model(call, model_id)
    if call.request.method == "DELETE":
        logged_models.delete(call.actor, call.principal, model)
        return {}
    if call.get("status") is None:
        raise invalid("Missing value for required parameter 'status'. Pass LOGGED_MODEL_READY or "
                      "LOGGED_MODEL_UPLOAD_FAILED.")
    return _answer(logged_models.finalize(call.actor, call.principal, model, call.get("status")))


@endpoint(RUNS_WRITE)
def params(call: Call, model_id: str):
    logged_models.log_params(call.actor, call.principal, _model(call, model_id), call.get("params"))
    return {}


@endpoint(RUNS_WRITE, methods=("PATCH",))
def tags(call: Call, model_id: str):
    logged_models.set_tags(call.actor, call.principal, _model(call, model_id), call.get("tags"))
    return {}


@endpoint(RUNS_WRITE, methods=("DELETE",))
def tag(call: Call, model_id: str, tag_key: str):
    logged_models.delete_tag(call.actor, call.principal, _model(call, model_id), tag_key)
    return {}


@endpoint(READ, methods=("GET",))
def artifact_directories(call: Call, model_id: str):
    """MLflow's ListLoggedModelArtifacts: one directory of the model's files, paths relative to its root."""
    model = _model(call, model_id)
    inner = clean_path(call.string("artifact_directory_path") or "")
    files = [{**item, "path": f"{inner}/{item['path']}" if inner else item["path"]}
             for item in entries(logged_models.root_of(model), inner)]
    return {"root_uri": model.artifact_uri, "files": files}


@endpoint(READ)
def search(call: Call):
    offset, limit = page_bounds(call, default=100, maximum=MAX_RESULTS)
    experiments = searched_experiments(call)
    rows = (logged_models.visible_in(call.user, call.project)
            .filter(experiment_id__in=experiments, lifecycle_stage="active")
            .filter(search_filter(call.string("filter"), FIELDS, tag_field="tags", param_field="params"))
            .order_by(*_order(call.getlist("order_by")))
            .prefetch_related(Prefetch("versions", queryset=ModelVersion.objects.select_related("model"))))
    return paged(rows, offset, limit, "models", model_json)


def _order(order_by: list) -> list[str]:
    """MLflow's [{"field_name", "ascending"}] (metrics are not kept for logged models); newest first after."""
    ordering = []
    for index, item in enumerate(order_by):
        field = item.get("field_name") if isinstance(item, dict) else None
        key = str(field or "").removeprefix("attributes.").removeprefix("attribute.")
        if key not in ORDER:
            raise invalid(f"Invalid order_by[{index}] {str(item)[:200]}: order logged models by field_name one of "
                          f"{', '.join(ORDER)}.")
        ascending = item.get("ascending", True)
        if not isinstance(ascending, bool):
            raise invalid(f"Invalid order_by[{index}].ascending: expected true or false.")
        ordering.append(("" if ascending else "-") + ORDER[key])
    return [*ordering, "-creation_time", "model_id"]


@endpoint(RUNS_WRITE)
def runs_outputs(call: Call):
    """MLflow's LogOutputs (log_model calls it): the Run made these logged models."""
    logged_models.log_outputs(call.actor, call.principal, call.run(), call.get("models") or [])
    return {}
