"""MLflow's model registry REST API 2.0 (registered-models/…, model-versions/…) under /mlflow/, with the
tracking app's authentication, body parsing and checks, and error body (tracking.mlflow_api.endpoint).

Scopes: `read` to read, `registry:write` to write. A job token reads within its project and creates
versions only from its own Job's Run (it may create the registered model first, as mlflow.register_model
does); anything else it tries is PERMISSION_DENIED."""
from __future__ import annotations

import re

from django.db.models import Prefetch, Q
from django.db.models.fields.json import KeyTextTransform
from django.db.models.lookups import Exact, IRegex, IsNull, Regex

from mado.choices import Scope
from registry import logged_models, services
from registry.models import ModelAlias, ModelVersion, RegisteredModel
from tracking.errors import invalid
from tracking.mlflow_api import Call, endpoint, next_clause, page_bounds, paged, require_scope
from tracking.search import like_regex, parse_list, split_identifier, string_q, tokenize, unquote
from tracking.validation import validate_run_id

READ = Scope.READ.value
WRITE = Scope.REGISTRY_WRITE.value
MAX_MODELS = 1000
MAX_VERSIONS = 200_000


def _required(call: Call, name: str):
    """A required parameter of any type (its validator checks the type): missing is MLflow's message."""
    value = call.get(name)
    if value is None:
        raise invalid(f"Missing value for required parameter '{name}'. See the API docs for more information "
                      "about request parameters.")
    return value


# Serialization ------------------------------------------------------------------------------------

def version_json(version: ModelVersion, model: RegisteredModel | None = None) -> dict:
    model = model or version.model
    answer = {"name": model.name, "version": str(version.version), "creation_timestamp": version.creation_time,
              "last_updated_timestamp": version.last_updated_time,
              "user_id": version.created_by.username if version.created_by_id else "",
              "current_stage": version.stage, "description": version.description, "source": version.source,
              "run_id": version.run_id or "", "status": version.status, "run_link": version.run_link,
              "tags": [{"key": k, "value": v} for k, v in sorted(version.tags.items())],
              "aliases": sorted(a.alias for a in version.aliases.all())}
    if version.logged_model_id:
        answer["model_id"] = version.logged_model_id
    return answer


def _latest_per_stage(versions) -> list[ModelVersion]:
    latest: dict[str, ModelVersion] = {}
    for version in versions:
        if version.stage not in latest or version.version > latest[version.stage].version:
            latest[version.stage] = version
    return sorted(latest.values(), key=lambda v: v.version)


def model_json(model: RegisteredModel) -> dict:
    versions = list(model.versions.all())
    return {"name": model.name, "creation_timestamp": model.creation_time,
            "last_updated_timestamp": model.last_updated_time,
            "user_id": model.created_by.username if model.created_by_id else "", "description": model.description,
            "latest_versions": [version_json(v, model) for v in _latest_per_stage(versions)],
            "tags": [{"key": k, "value": v} for k, v in sorted(model.tags.items())],
            "aliases": [{"alias": a.alias, "version": str(a.version.version)} for a in model.aliases.all()]}


def _models(call: Call):
    versions = ModelVersion.objects.select_related("created_by").prefetch_related("aliases")
    return (services.models_visible_in(call.user, call.project).select_related("created_by")
            .prefetch_related(Prefetch("versions", queryset=versions),
                              Prefetch("aliases", queryset=ModelAlias.objects.select_related("version"))))


def _model(call: Call) -> RegisteredModel:
    name = call.string("name", required=True)
    found = _models(call).filter(name=name).first()
    if found is None:
        raise services.not_found(f"Registered Model with name={name} not found")
    return found


def _version(call: Call) -> ModelVersion:
    model = services.model_for(call.user, call.project, call.string("name", required=True))
    return services.version_for(model, call.string("version", required=True))


# Search filters (MLflow's grammar: clauses joined by AND) -----------------------------------------

MODEL_FIELDS = {"name": "name"}
VERSION_FIELDS = {"name": "model__name", "run_id": "run_id", "source_path": "source", "source": "source"}


def search_filter(text: str | None, fields: dict, *, tag_field: str, numeric: dict | None = None,
                  param_field: str | None = None) -> Q:
    """MLflow's filter grammar on registry rows: attributes in `fields` (strings) and `numeric` (whole
    numbers), `tags.<key>` in the JSON field `tag_field`, and `params.<key>` in `param_field` if given."""
    if not text or not text.strip():
        return Q()
    tokens = tokenize(text)
    query, index = Q(), 0
    while index < len(tokens):
        entity, key, index = split_identifier(tokens, index, text)
        if index >= len(tokens) or tokens[index][0] not in ("op", "word"):
            raise invalid(f"Invalid filter string '{text}': expected a comparison such as name = 'x'.")
        op = tokens[index][1].upper()
        index += 1
        if op == "NOT" and index < len(tokens) and tokens[index][1].upper() == "IN":
            op, index = "NOT IN", index + 1
        if op in ("IN", "NOT IN"):
            operand, index = parse_list(tokens, index, text)
        else:
            if index >= len(tokens):
                raise invalid(f"Invalid filter string '{text}': a comparison lacks its value.")
            operand, index = tokens[index], index + 1
        json_field = {"tag": tag_field, "tags": tag_field, "param": param_field, "params": param_field}.get(entity)
        if json_field:
            if op not in ("=", "!=", "LIKE", "ILIKE"):
                raise invalid(f"Invalid comparator '{op}' for tags in '{text}'; use =, !=, LIKE or ILIKE.")
            if operand[0] not in ("string", "number", "word"):
                raise invalid(f"Invalid filter string '{text}': compare tags with a quoted string.")
            value, tag = unquote(operand[1]), KeyTextTransform(key, json_field)  # the key as it is, never a lookup
            if op == "=":
                query &= Q(Exact(tag, value))
            elif op == "!=":  # as MLflow: models without the tag match (the client's prompt filter relies on it)
                query &= Q(IsNull(tag, True)) | ~Q(Exact(tag, value))
            else:
                query &= Q((Regex if op == "LIKE" else IRegex)(tag, like_regex(value)))
        elif entity in ("attribute", "attributes") and numeric and key in numeric:
            if op not in ("=", "!=", ">", ">=", "<", "<=", "IN"):
                raise invalid(f"Invalid comparator '{op}' for {key} in '{text}'.")
            try:
                values = [_whole(unquote(v)) for v in operand] if op == "IN" else [_whole(unquote(operand[1]))]
            except ValueError:
                raise invalid(f"Invalid filter string '{text}': {key} is compared with a whole number such as "
                              "3.") from None
            lookup = {"=": "", ">": "__gt", ">=": "__gte", "<": "__lt", "<=": "__lte", "IN": "__in", "!=": ""}[op]
            clause = Q(**{numeric[key] + lookup: values if op == "IN" else values[0]})
            query &= ~clause if op == "!=" else clause
        elif entity in ("attribute", "attributes") and key in fields:
            if op not in ("=", "!=", "LIKE", "ILIKE", "IN", "NOT IN"):
                raise invalid(f"Invalid comparator '{op}' for {key} in '{text}'; use =, !=, LIKE, ILIKE or IN.")
            query &= string_q(fields[key], op, operand)
        else:
            known = ", ".join([*fields, *(numeric or {}), "tags.<key>"])
            raise invalid(f"Invalid filter string '{text}': cannot filter on '{key}'; use {known}.")
        index = next_clause(tokens, index, text)
    return query


def _whole(text: str) -> int:
    """A version number in a filter, clamped into the column's range (a huge one matches nothing)."""
    if not re.fullmatch(r"-?[0-9]{1,30}", text.strip()):
        raise ValueError(text)
    return max(-1, min(int(text), 2**31))


def _order(order_by: list, fields: dict, default: list[str]) -> list[str]:
    ordering = []
    for clause in order_by:
        parts = str(clause).split()
        if not parts or len(parts) > 2 or (len(parts) == 2 and parts[1].upper() not in ("ASC", "DESC")):
            raise invalid(f"Invalid order_by clause '{clause}'; write '<field> ASC' or '<field> DESC'.")
        key = parts[0].removeprefix("attributes.").removeprefix("attribute.")
        if key not in fields:
            raise invalid(f"Invalid order_by clause '{clause}': order by one of {', '.join(fields)}.")
        ordering.append(("-" if len(parts) == 2 and parts[1].upper() == "DESC" else "") + fields[key])
    return ordering + default


# Registered models --------------------------------------------------------------------------------

@endpoint(WRITE)
def models_create(call: Call):
    model = services.create_model(call.actor, call.principal, call.project, name=call.get("name"),
                                  description=call.get("description"), tags=call.get("tags"))
    return {"registered_model": model_json(model)}


@endpoint(READ, methods=("GET",))
def models_get(call: Call):
    return {"registered_model": model_json(_model(call))}


@endpoint(WRITE)
def models_rename(call: Call):
    model = services.rename_model(call.actor, call.principal, _model(call), call.get("new_name"))
    return {"registered_model": model_json(model)}


@endpoint(WRITE, methods=("PATCH",))
def models_update(call: Call):
    model = services.update_model(call.actor, call.principal, _model(call), description=call.get("description"))
    return {"registered_model": model_json(model)}


@endpoint(WRITE, methods=("DELETE",))
def models_delete(call: Call):
    services.delete_model(call.actor, call.principal, _model(call))
    return {}


@endpoint(READ, methods=("GET", "POST"))
def models_search(call: Call):
    offset, limit = page_bounds(call, default=100, maximum=MAX_MODELS)
    ordering = _order(call.getlist("order_by"), {"name": "name", "timestamp": "last_updated_time",
                                                 "last_updated_timestamp": "last_updated_time",
                                                 "creation_timestamp": "creation_time"}, ["name", "id"])
    query = search_filter(call.string("filter"), MODEL_FIELDS, tag_field="tags")
    return paged(_models(call).filter(query).order_by(*ordering), offset, limit, "registered_models", model_json)


@endpoint(READ, methods=("GET", "POST"))
def models_latest_versions(call: Call):
    model = _model(call)
    stages = [services.stage_name(stage).lower() for stage in call.getlist("stages")]
    versions = [v for v in model.versions.all() if not stages or v.stage.lower() in stages]
    return {"model_versions": [version_json(v, model) for v in _latest_per_stage(versions)]}


@endpoint(WRITE)
def models_set_tag(call: Call):
    services.set_model_tag(call.actor, call.principal, _model(call), call.string("key", required=True),
                           _required(call, "value"))
    return {}


@endpoint(WRITE, methods=("DELETE",))
def models_delete_tag(call: Call):
    services.delete_model_tag(call.actor, call.principal, _model(call), call.string("key", required=True))
    return {}


@endpoint(READ, methods=("GET", "POST", "DELETE"))
def models_alias(call: Call):
    """One path, three MLflow calls: POST sets, DELETE removes, GET resolves an alias."""
    if call.request.method != "GET":
        require_scope(call, WRITE)
    model = _model(call)
    alias = call.string("alias", required=True)
    if call.request.method == "POST":
        services.set_alias(call.actor, call.principal, model, alias, call.string("version", required=True))
        return {}
    if call.request.method == "DELETE":
        services.delete_alias(call.actor, call.principal, model, alias)
        return {}
    return {"model_version": version_json(services.version_by_alias(model, alias), model)}


# Model versions -----------------------------------------------------------------------------------

@endpoint(WRITE)
def versions_create(call: Call):
    model = services.model_for(call.user, call.project, call.string("name", required=True))
    version = services.create_version(call.actor, call.principal, model, source=call.get("source"),
                                      run_id=_run_id(call), tags=call.get("tags"),
                                      description=call.get("description"), run_link=call.get("run_link"),
                                      model_id=call.get("model_id"))
    return {"model_version": version_json(version, model)}


def _run_id(call: Call) -> str | None:
    run_id = call.get("run_id")
    return validate_run_id(run_id) if run_id not in (None, "") else None


@endpoint(READ, methods=("GET",))
def versions_get(call: Call):
    return {"model_version": version_json(_version(call))}


@endpoint(WRITE, methods=("PATCH",))
def versions_update(call: Call):
    version = services.update_version(call.actor, call.principal, _version(call),
                                      description=call.get("description"))
    return {"model_version": version_json(version)}


@endpoint(WRITE, methods=("DELETE",))
def versions_delete(call: Call):
    services.delete_version(call.actor, call.principal, _version(call))
    return {}


@endpoint(WRITE)
def versions_transition_stage(call: Call):
    version = services.transition_stage(call.actor, call.principal, _version(call), _required(call, "stage"),
                                        call.get("archive_existing_versions"))
    return {"model_version": version_json(version)}


@endpoint(READ, methods=("GET", "POST"))
def versions_search(call: Call):
    offset, limit = page_bounds(call, default=10_000, maximum=MAX_VERSIONS)
    ordering = _order(call.getlist("order_by"), {"name": "model__name", "version_number": "version",
                                                 "creation_timestamp": "creation_time", "timestamp": "creation_time",
                                                 "last_updated_timestamp": "last_updated_time"},
                      ["model__name", "-version"])
    query = search_filter(call.string("filter"), VERSION_FIELDS, tag_field="tags",
                    numeric={"version_number": "version"})
    visible = services.models_visible_in(call.user, call.project)
    rows = (ModelVersion.objects.filter(model__in=visible).filter(query).select_related("model", "created_by")
            .prefetch_related("aliases").order_by(*ordering))
    return paged(rows, offset, limit, "model_versions", version_json)


@endpoint(READ, methods=("GET",))
def versions_download_uri(call: Call):
    version = _version(call)
    logged = logged_models.for_stored_file(version)  # a logged model's directory, or a stored file's (made once)
    if logged is not None:
        return {"artifact_uri": logged.artifact_uri}
    source = version.source
    if source.startswith("runs:/") and version.run is not None:
        source = version.run.artifact_uri + "/" + source.removeprefix(f"runs:/{version.run.run_id}").strip("/")
    return {"artifact_uri": source}


@endpoint(WRITE)
def versions_set_tag(call: Call):
    services.set_version_tag(call.actor, call.principal, _version(call), call.string("key", required=True),
                             _required(call, "value"))
    return {}


@endpoint(WRITE, methods=("DELETE",))
def versions_delete_tag(call: Call):
    services.delete_version_tag(call.actor, call.principal, _version(call), call.string("key", required=True))
    return {}

