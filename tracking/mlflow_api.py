"""The MLflow REST API 2.0 under /mlflow/ (MLFLOW_TRACKING_URI=<server>/mlflow): what the MLflow 3
client calls for tracking, with MLflow's paths, JSON and error body {"error_code", "message"}.

Plain Django views, deliberately outside the DRF schema at /api/schema/: their contract is MLflow's
(https://mlflow.org/docs/latest/rest-api.html), not Mado's error shape, so the suite fuzzes them with
its own bad-input tests (tests/tracking/test_mlflow_bad_input.py) instead of schemathesis.

Authentication: `Authorization: Bearer` with an API token (`read` to read, `runs:write` to write) or a
job token (reads within its project, writes only to its own Job's Run). Everything is scoped to the
token's project; experiment "0" (MLflow's default experiment) is the project's default experiment."""
from __future__ import annotations

import base64
import json
import logging
import math
from functools import wraps

from django.conf import settings
from django.db.models import Q
from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions as drf_exceptions

from mado import access as identity
from mado.authentication import BearerTokenAuthentication
from mado.choices import Scope
from mado.services import Actor
from mado.validation import bad_text_in, json_too_deep, may_hold_bad_text
from tracking import access, experiments, services
from tracking.choices import LifecycleStage
from tracking.errors import MlflowError, invalid, not_found
from tracking.models import Experiment, Metric, Run
from tracking.search import order_fields, parse_filter, split_identifier, string_q, tokenize
from tracking.validation import INT64_MAX, as_long, experiment_id, validate_run_id

logger = logging.getLogger(__name__)

RUNS_WRITE = "runs:write"
MAX_RESULTS_RUNS = 50000
DEFAULT_RESULTS_RUNS = 1000
MAX_RESULTS_EXPERIMENTS = 50000
MAX_BODY = 20 * 1024 * 1024
MAX_DEPTH = 8  # the deepest MLflow body: {"datasets": [{"dataset": {…}, "tags": [{"key": …}]}]}


class Call:
    """One authenticated MLflow call: who, on what project, with which body."""

    def __init__(self, request, user, principal):
        self.request = request
        self.user = user
        self.principal = principal
        self.project = principal.project
        self.actor = Actor(user=user, ip=request.META.get("REMOTE_ADDR"))
        self._body = None

    @property
    def body(self) -> dict:
        if self._body is None:
            if self.request.method == "GET":
                self._body = {key: (values if len(values) > 1 else values[0])
                              for key, values in self.request.GET.lists()}
            else:
                try:
                    raw = self.request.body
                except RequestDataTooBig:
                    raise invalid(f"The request body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes; send "
                                  "less per request (split a batch).") from None
                if not raw.strip():
                    self._body = {}
                else:
                    try:
                        self._body = json.loads(raw)
                    except (ValueError, UnicodeDecodeError):
                        raise MlflowError("The request body is not valid JSON; send a JSON object.",
                                          "MALFORMED_REQUEST") from None
                    except RecursionError:
                        raise MlflowError("The request body is nested too deeply to parse; send a flat JSON "
                                          "object as the MLflow API documents.", "MALFORMED_REQUEST") from None
                    if not isinstance(self._body, dict):
                        raise MlflowError("The request body must be a JSON object.", "MALFORMED_REQUEST")
        return self._body

    def check(self) -> None:
        """Before a handler reads its parameters: the body parses (however deeply nested), nests at most
        MAX_DEPTH levels, and no string in it, key or value, is text the database cannot take (a NUL or a
        lone surrogate). A PUT's body is an upload (mlflow-artifacts), not parameters."""
        if self.request.method == "PUT":
            return
        body = self.body
        if json_too_deep(body, MAX_DEPTH):
            raise MlflowError(f"The request body nests more than {MAX_DEPTH} levels deep; MLflow's parameters are "
                              "strings, numbers, and lists of objects such as tags.", "MALFORMED_REQUEST")
        problem = bad_text_in(body) if self._may_hold_bad_text() else None
        if problem is not None:
            where = problem[1].encode("utf-8", "replace").decode()[:200].replace("\x00", "?")
            what = f"Invalid {where}" if where.startswith("a key") else f"Invalid value for parameter '{where}'"
            raise invalid(f"{what} supplied: text may not contain NUL characters or unpaired surrogates (such as "
                          "\\ud800); send valid Unicode.")

    def _may_hold_bad_text(self) -> bool:
        """An ASCII JSON body (what MLflow's clients send) can hold a NUL or a lone surrogate only as a
        \\u0000 or \\ud800-\\udfff escape (json.loads refuses raw control characters), so the walk over a
        1000-point batch is skipped when there is none. Query strings are always walked."""
        if self.request.method == "GET":
            return True
        raw = self.request.body
        return not raw.isascii() or may_hold_bad_text(raw.decode("ascii"))

    def get(self, name, default=None):
        return self.body.get(name, default)

    def getlist(self, name) -> list:
        value = self.body.get(name)
        if value is None:
            return []
        return value if isinstance(value, list) else [value]

    def string(self, name, *, required=False) -> str | None:
        value = self.body.get(name)
        if value is None or value == "":
            if required:
                raise invalid(f"Missing value for required parameter '{name}'. See the API docs for more "
                              "information about request parameters.")
            return None
        if isinstance(value, list) and len(value) == 1 and self.request.method == "GET":
            value = value[0]
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise invalid(f"Invalid value {value!r:.200} for parameter '{name}' supplied: expected a string.")
        return str(value)

    def run(self) -> Run:
        run_id = self.string("run_id") or self.string("run_uuid")
        validate_run_id(run_id)
        return access.run_for(self.user, self.project, run_id)


def _authenticate(request):
    try:
        result = BearerTokenAuthentication().authenticate(request)
    except drf_exceptions.APIException as error:
        if error.status_code == 429:  # Throttled
            raise MlflowError(str(error.detail), "REQUEST_LIMIT_EXCEEDED") from None
        raise MlflowError(str(error.detail), "UNAUTHENTICATED") from None
    if result is None:
        raise MlflowError("Send an API token as 'Authorization: Bearer <token>' (MLFLOW_TRACKING_TOKEN).",
                          "UNAUTHENTICATED")
    return result


def endpoint(scope: str, methods=("POST",)):
    """An MLflow endpoint: checks the method, the token and its scope, then the request (Call.check: it
    parses, is not nested too deeply, carries no NUL or lone surrogate), and answers MlflowError as MLflow does."""

    def decorate(handler):
        @csrf_exempt
        @wraps(handler)
        def view(request, *args, **kwargs):
            try:
                if request.method not in methods:
                    raise MlflowError(f"The endpoint {request.path} takes {', '.join(methods)}, not "
                                      f"{request.method}.", "ENDPOINT_NOT_FOUND", status=405)
                user, principal = _authenticate(request)
                identity.remember_roles(user)
                if identity.role_is_a_membership(user):  # read along with the token: no query of its own
                    identity.remember_role(user, principal.project, principal.token.member_role)
                call = Call(request, user, principal)
                require_scope(call, scope)
                call.check()
                result = handler(call, *args, **kwargs)
            except MlflowError as error:
                return JsonResponse(error.body(), status=error.status)
            if isinstance(result, HttpResponseBase):
                return result
            return _json(result)
        return view
    return decorate


def require_scope(call: Call, scope: str) -> None:
    """Job tokens pass (their service checks what they may write), other tokens need `scope`; also for an
    endpoint whose methods need different scopes (reads with `read`, writes with another)."""
    if not call.principal.is_job and scope not in call.principal.scopes:
        raise MlflowError(f"This token lacks the {scope} scope; issue a token that has it.", "PERMISSION_DENIED")


def _json(data: dict) -> HttpResponse:
    return HttpResponse(json.dumps(data, allow_nan=False, separators=(",", ":")), content_type="application/json")


@csrf_exempt
def not_found_view(request, path=""):
    return JsonResponse({"error_code": "ENDPOINT_NOT_FOUND",
                         "message": f"No MLflow endpoint at {request.path} on this server (Mado supports MLflow's "
                                    "tracking API: experiments, runs, metrics, logged models and artifacts, and "
                                    "its model registry)."}, status=404)


# Serialization ----------------------------------------------------------------------------------------

def _double(value: float):
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def experiment_json(experiment: Experiment) -> dict:
    return {"experiment_id": str(experiment.pk), "name": experiment.name,
            "artifact_location": experiment.artifact_location, "lifecycle_stage": experiment.lifecycle_stage,
            "last_update_time": experiment.last_update_time, "creation_time": experiment.creation_time,
            "tags": [{"key": k, "value": v} for k, v in sorted(experiment.tags.items())]}


def run_info(run: Run) -> dict:
    info = {"run_id": run.run_id, "run_uuid": run.run_id, "run_name": run.name,
            "experiment_id": str(run.experiment_id), "user_id": run.created_by.username, "status": run.status,
            "start_time": run.start_time, "artifact_uri": run.artifact_uri, "lifecycle_stage": run.lifecycle_stage}
    if run.start_time is None:
        del info["start_time"]
    if run.end_time is not None:
        info["end_time"] = run.end_time
    return info


def metric_json(key, value, timestamp, step) -> dict:
    return {"key": key, "value": _double(value), "timestamp": timestamp, "step": step}


def run_json(run: Run) -> dict:
    """A Run with its data: from what runs_search prefetched, else one query per relation."""
    return {
        "info": run_info(run),
        "data": {"metrics": [metric_json(m.key, m.point_value, m.timestamp, m.step) for m in run.latest_metrics.all()],
                 "params": [{"key": p.key, "value": p.value} for p in run.params.all()],
                 "tags": [{"key": t.key, "value": t.value} for t in run.tags.all()]},
        "inputs": {"dataset_inputs": [
            {"tags": i.tags, "dataset": {"name": i.name, "digest": i.digest, "source_type": i.source_type,
                                         "source": i.source, "schema": i.schema, "profile": i.profile}}
            for i in run.inputs.all()]},
    }


def page_bounds(call: Call, *, default: int, maximum: int) -> tuple[int, int]:
    """(offset, max_results) of a paged MLflow search: max_results checked, page_token decoded."""
    max_results = as_long(call.get("max_results"), "max_results", default=default, minimum=0)
    if max_results == 0:
        max_results = default
    if max_results > maximum:
        raise invalid(f"Invalid value {max_results} for parameter 'max_results' supplied. It must be at most "
                      f"{maximum}, but got value {max_results}")
    token = call.string("page_token")
    offset = 0
    if token:
        try:
            offset = int(json.loads(base64.b64decode(token.encode(), validate=True))["offset"])
            if not 0 <= offset <= INT64_MAX:
                raise ValueError
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError, UnicodeDecodeError):
            raise invalid("Invalid page token, could not base64-decode; pass next_page_token as it came.") from None
    return offset, max_results


def page_token(offset: int) -> str:
    """The next_page_token of a page that ends before `offset`."""
    return base64.b64encode(json.dumps({"offset": offset}).encode()).decode()


def searched_experiments(call: Call) -> list[int]:
    """A search's `experiment_ids`, every one checked before any is used; 0 is the project's default
    experiment (created on first use, as MLflow's)."""
    numbers = [experiment_id(value, "experiment_ids") for value in call.getlist("experiment_ids")]
    return [services.default_experiment(call.project).pk if number == 0 else number for number in numbers]


def paged(rows, offset: int, limit: int, key: str, to_json) -> dict:
    """A search's answer: the page of `rows` under `key`, and next_page_token if more rows follow."""
    page = list(rows[offset:offset + limit + 1])
    answer = {key: [to_json(row) for row in page[:limit]]}
    if len(page) > limit:
        answer["next_page_token"] = page_token(offset + limit)
    return answer


def _view_stages(value) -> list[str]:
    value = str(value or "ACTIVE_ONLY").upper()
    stages = {"ACTIVE_ONLY": [LifecycleStage.ACTIVE], "DELETED_ONLY": [LifecycleStage.DELETED],
              "ALL": [LifecycleStage.ACTIVE, LifecycleStage.DELETED],
              "1": [LifecycleStage.ACTIVE], "2": [LifecycleStage.DELETED], "3": [LifecycleStage.ACTIVE,
                                                                                  LifecycleStage.DELETED]}
    if value not in stages:
        raise invalid(f"Invalid view type '{value}'; use ACTIVE_ONLY, DELETED_ONLY or ALL.")
    return stages[value]


# Experiments ------------------------------------------------------------------------------------------

@endpoint(RUNS_WRITE)
def experiments_create(call: Call):
    experiment = services.create_experiment(call.actor, call.principal, call.project, name=call.get("name"),
                                            tags=call.get("tags"))
    return {"experiment_id": str(experiment.pk)}


def _experiment(call: Call) -> Experiment:
    value = call.string("experiment_id", required=True)
    if value == "0":
        return services.default_experiment(call.project)
    return access.experiment_for(call.user, call.project, experiment_id(value))


@endpoint(Scope.READ.value, methods=("GET",))
def experiments_get(call: Call):
    return {"experiment": experiment_json(_experiment(call))}


@endpoint(Scope.READ.value, methods=("GET",))
def experiments_get_by_name(call: Call):
    name = call.string("experiment_name", required=True)
    experiment = access.experiments_visible_in(call.user, call.project).filter(name=name).first()
    if experiment is None and name == "Default":
        experiment = services.default_experiment(call.project)
    if experiment is None:
        raise not_found(f"Could not find experiment with name '{name}'")
    return {"experiment": experiment_json(experiment)}


@endpoint(Scope.READ.value, methods=("GET", "POST"))
def experiments_search(call: Call):
    services.default_experiment(call.project)
    offset, limit = page_bounds(call, default=1000, maximum=MAX_RESULTS_EXPERIMENTS)
    rows = access.experiments_visible_in(call.user, call.project).filter(
        lifecycle_stage__in=_view_stages(call.get("view_type")))
    text = call.string("filter")
    if text:
        rows = rows.filter(_experiment_filter(text))
    return paged(rows.order_by("-creation_time", "-id"), offset, limit, "experiments", experiment_json)


def _experiment_filter(text: str):
    tokens = tokenize(text)  # the runs' grammar, on experiments' names
    query, index = Q(), 0
    while index < len(tokens):
        entity, key, index = split_identifier(tokens, index, text)
        if entity not in ("attribute", "attributes") or key.lower() != "name" or index + 1 >= len(tokens):
            raise invalid(f"Invalid filter string '{text}': experiments are filtered by name "
                          "(name = 'x', name LIKE 'x%').")
        op = tokens[index][1].upper()
        operand = tokens[index + 1]
        if op not in ("=", "!=", "LIKE", "ILIKE") or operand[0] != "string":
            raise invalid(f"Invalid filter string '{text}': use name = 'x', name != 'x', name LIKE 'x%' or "
                          "name ILIKE 'x%'.")
        query &= string_q("name", op, operand)
        index = next_clause(tokens, index + 2, text)
    return query


def next_clause(tokens: list, index: int, text: str) -> int:
    """Where the filter's next clause starts, past the AND that must join it to the one ending at `index`."""
    if index < len(tokens):
        if tokens[index][1].upper() != "AND":
            raise invalid(f"Invalid filter string '{text}': clauses are joined with AND.")
        index += 1
        if index >= len(tokens):
            raise invalid(f"Invalid filter string '{text}': a comparison must follow AND.")
    return index


@endpoint(RUNS_WRITE)
def experiments_update(call: Call):
    experiments.rename_experiment(call.actor, call.principal, _experiment(call), call.get("new_name"))
    return {}


@endpoint(RUNS_WRITE)
def experiments_delete(call: Call):
    experiments.delete_experiment(call.actor, call.principal, _experiment(call))
    return {}


@endpoint(RUNS_WRITE)
def experiments_restore(call: Call):
    experiments.restore_experiment(call.actor, call.principal, _experiment(call))
    return {}


# Runs -------------------------------------------------------------------------------------------------

@endpoint(RUNS_WRITE)
def runs_create(call: Call):
    experiment = call.string("experiment_id")
    if experiment is not None:
        experiment_id(experiment)
    run = services.create_run(call.actor, call.principal, call.project, experiment_id=experiment,
                              run_name=call.get("run_name"), start_time=call.get("start_time"),
                              tags=call.get("tags"), user_id=call.get("user_id"))
    return {"run": run_json(run)}


@endpoint(RUNS_WRITE)
def runs_update(call: Call):
    run = services.update_run(call.actor, call.principal, call.run(), status=call.get("status"),
                              end_time=call.get("end_time"), run_name=call.get("run_name"))
    return {"run_info": run_info(run)}


@endpoint(RUNS_WRITE)
def runs_delete(call: Call):
    services.set_lifecycle(call.actor, call.principal, call.run(), LifecycleStage.DELETED)
    return {}


@endpoint(RUNS_WRITE)
def runs_restore(call: Call):
    services.set_lifecycle(call.actor, call.principal, call.run(), LifecycleStage.ACTIVE)
    return {}


@endpoint(Scope.READ.value, methods=("GET",))
def runs_get(call: Call):
    return {"run": run_json(call.run())}


@endpoint(Scope.READ.value)
def runs_search(call: Call):
    offset, limit = page_bounds(call, default=DEFAULT_RESULTS_RUNS, maximum=MAX_RESULTS_RUNS)
    experiments = searched_experiments(call)
    rows = access.runs_visible_in(call.user, call.project).filter(
        lifecycle_stage__in=_view_stages(call.get("run_view_type")))
    if experiments:
        rows = rows.filter(experiment_id__in=experiments)
    rows = rows.filter(parse_filter(call.string("filter")))
    annotations, ordering = order_fields(call.getlist("order_by"))
    rows = rows.annotate(**annotations).order_by(*ordering).select_related("created_by").prefetch_related(
        "latest_metrics", "params", "tags", "inputs")
    return paged(rows, offset, limit, "runs", run_json)


@endpoint(RUNS_WRITE)
def runs_log_metric(call: Call):
    metric = {"key": call.get("key"), "value": call.get("value"), "timestamp": call.get("timestamp"),
              "step": call.get("step")}
    services.log_batch(call.actor, call.principal, call.run(), metrics=[metric])
    return {}


@endpoint(RUNS_WRITE)
def runs_log_parameter(call: Call):
    services.log_batch(call.actor, call.principal, call.run(),
                       params=[{"key": call.get("key"), "value": call.get("value")}])
    return {}


@endpoint(RUNS_WRITE)
def runs_set_tag(call: Call):
    services.log_batch(call.actor, call.principal, call.run(),
                       tags=[{"key": call.get("key"), "value": call.get("value")}])
    return {}


@endpoint(RUNS_WRITE)
def runs_delete_tag(call: Call):
    services.delete_tag(call.actor, call.principal, call.run(), call.get("key"))
    return {}


@endpoint(RUNS_WRITE)
def runs_log_batch(call: Call):
    if len(call.request.body) > MAX_BODY:
        raise invalid(f"Batched logging API requests must be at most {MAX_BODY} bytes, got a request of size "
                      f"{len(call.request.body)}.")
    services.log_batch(call.actor, call.principal, call.run(), metrics=call.get("metrics"),
                       params=call.get("params"), tags=call.get("tags"))
    return {}


@endpoint(RUNS_WRITE)
def runs_log_inputs(call: Call):
    services.log_inputs(call.actor, call.principal, call.run(), datasets=call.get("datasets"))
    return {}


@endpoint(Scope.READ.value, methods=("GET",))
def metrics_get_history(call: Call):
    run = call.run()
    # As MLflow's server: a required string, not checked as a key to log (result.json metric names, which
    # jobs accept more freely, are read back by this too); an unknown key answers an empty history.
    key = call.string("metric_key", required=True)
    max_results = as_long(call.get("max_results"), "max_results", default=None, minimum=0)
    offset, _limit = page_bounds(call, default=1, maximum=INT64_MAX) if call.get("page_token") else (0, 0)
    rows = Metric.objects.filter(run=run, key=key).order_by("step", "timestamp", "id").values_list(
        "value", "is_nan", "timestamp", "step")
    if max_results:
        page = list(rows[offset:offset + max_results + 1])
    else:
        page = list(rows[offset:]) if offset else list(rows)
    # Written as text, not as a dict per point for json.dumps: most of a long history's time went there.
    answer = '{"metrics":' + services.metric_history_json(key, page[:max_results] if max_results else page)
    if max_results and len(page) > max_results:
        answer += ',"next_page_token":' + json.dumps(page_token(offset + max_results))
    return HttpResponse(answer + "}", content_type="application/json")
