"""The only writers of experiments, Runs and what is logged to them. Each state change that matters
(experiment created, Run created/updated/deleted/restored) writes an AuditEvent; single metric points,
params and tags do not (they are the Run's data, and would flood the audit trail)."""
from __future__ import annotations

import json
import math
import operator
import random
from collections import Counter

from django.db import IntegrityError, connection, transaction
from django.utils.translation import gettext as _

from jobs.choices import JobStatus
from mado.errors import ServiceError
from mado.services import Actor, audit
from tracking import access
from tracking.choices import DEFAULT_EXPERIMENT_NAME, TERMINAL_RUN_STATUSES, LifecycleStage, RunKind, RunStatus
from tracking.errors import MlflowError, invalid
from tracking.models import Experiment, LatestMetric, Metric, Param, Run, RunInput, Tag, now_ms
from tracking.validation import (
    INT64_MAX,
    INT64_MIN,
    MAX_DATASET_DIGEST_SIZE,
    MAX_DATASET_NAME_SIZE,
    MAX_DATASET_SCHEMA_SIZE,
    MAX_DATASET_SOURCE_SIZE,
    MAX_DATASETS_PER_BATCH,
    MAX_EXPERIMENT_TAG_VAL_LENGTH,
    MAX_PARAM_VAL_LENGTH,
    MAX_RUN_NAME_LENGTH,
    MAX_TAG_VAL_LENGTH,
    as_long,
    experiment_id as parse_experiment_id,
    experiment_name,
    metric_value,
    validate_batch_limits,
    validate_key,
    validate_text,
)

RUN_NAME_TAG = "mlflow.runName"
USER_TAG = "mlflow.user"
KIND_TAG = "mado.kind"  # a Run's kind, settable as a tag by clients that only speak MLflow
JOB_END_STATUS = {JobStatus.FINISHED: RunStatus.FINISHED, JobStatus.FAILED: RunStatus.FAILED,
                  JobStatus.CANCELED: RunStatus.KILLED}


# Experiments ----------------------------------------------------------------------------------------

def default_experiment(project) -> Experiment:
    """The project's default experiment, created on first need (also what MLflow's experiment "0" means)."""
    found = Experiment.objects.filter(project=project, is_default=True).first()
    if found is not None:
        return found
    try:
        with transaction.atomic():
            return Experiment.objects.create(project=project, name=DEFAULT_EXPERIMENT_NAME, is_default=True)
    except IntegrityError:
        pass
    found = Experiment.objects.filter(project=project, is_default=True).first()
    if found is not None:
        return found
    # Someone named an experiment "Default" first: it becomes the default.
    Experiment.objects.filter(project=project, name=DEFAULT_EXPERIMENT_NAME).update(is_default=True)
    return Experiment.objects.get(project=project, is_default=True)


def create_experiment(actor: Actor, principal, project, *, name, tags=None) -> Experiment:
    access.check_can_create(actor.user, principal, project)
    name = experiment_name(name)
    clean_tags = dict(_clean_tags(tags, MAX_EXPERIMENT_TAG_VAL_LENGTH))
    try:
        with transaction.atomic():
            experiment = Experiment.objects.create(project=project, name=name, tags=clean_tags,
                                                   created_by=actor.user)
            audit(actor, "experiment.create", experiment, project=project, after={"name": name})
    except IntegrityError:
        raise MlflowError(f"Experiment(name={name}) already exists.", "RESOURCE_ALREADY_EXISTS") from None
    return experiment


# Runs -----------------------------------------------------------------------------------------------

def create_job_run(actor: Actor, job, options: dict) -> Run:
    """jobs.hooks after-create callback: every Job gets its Run (name = the Job's name) in the project's
    default experiment. `run_kind` is the create_job option naming the Run's kind."""
    kind = options.get("run_kind") or RunKind.OTHER
    if kind not in RunKind.values:
        raise ServiceError(_("The Run's kind is one of %(kinds)s.") % {"kinds": ", ".join(RunKind.values)},
                           "invalid", fields={"run_kind": [_("Unknown kind.")]})
    experiment = default_experiment(job.project)
    run = Run.objects.create(experiment=experiment, project=job.project, job=job, name=job.display_name[:250],
                             kind=kind, status=RunStatus.SCHEDULED, start_time=int(job.created_at.timestamp() * 1000),
                             created_by=job.created_by)
    Tag.objects.bulk_create([Tag(run=run, key=RUN_NAME_TAG, value=run.name),
                             Tag(run=run, key=USER_TAG, value=job.created_by.username)])
    return run


def end_job_run(job) -> None:
    """jobs.hooks after-end callback: the Job's end ends its Run unless the code ended it already."""
    run = Run.objects.select_for_update().filter(job=job).first()
    if run is None or run.status in TERMINAL_RUN_STATUSES:
        return
    run.status = JOB_END_STATUS.get(job.status, RunStatus.FAILED)
    run.end_time = int(job.finished_at.timestamp() * 1000) if job.finished_at else now_ms()
    run.save(update_fields=["status", "end_time"])


def start_job_run(job) -> None:
    """jobs.hooks after-start callback: the Job's process started, so its Run is RUNNING (unless the code
    already ended it), with the Job's start as its start time when the code gave none."""
    run = Run.objects.select_for_update().filter(job=job).first()
    if run is None or run.status != RunStatus.SCHEDULED:
        return
    run.status = RunStatus.RUNNING
    if job.started_at is not None:  # a scheduled Run's start time was the Job's creation
        run.start_time = int(job.started_at.timestamp() * 1000)
    run.save(update_fields=["status", "start_time"])


def claim_payload(job) -> dict:
    """jobs.hooks claim-payload callback: the Run the worker points MLflow at. A claim reads the Run along
    with its job (registered as `reads=("run",)`), so this costs it no query; a resume or a site's runner
    reads it here."""
    try:
        run = job.run
    except Run.DoesNotExist:  # a Job from before Runs existed
        return {}
    return {"run_id": run.run_id, "experiment_id": str(run.experiment_id)}


def record_job_metrics(job, points) -> None:
    """jobs.hooks metrics-recorded callback: the metric points jobs stored for a Job (result.json `metrics`,
    points a worker posts) are also its Run's, in the same transaction. They were checked by jobs (names of
    at most 250 characters, finite values, steps ≥ 0), so they are stored as they came, each point once."""
    run = Run.objects.filter(job=job).only("run_id").first()
    if run is None:  # a Job from before Runs existed
        return
    _insert_points(run, [(p.name, float(p.value), int(p.timestamp.timestamp() * 1000), int(p.step))
                         for p in points])


def create_run(actor: Actor, principal, project, *, experiment_id=None, run_name=None, start_time=None,
               tags=None, user_id=None) -> Run:
    access.check_can_create(actor.user, principal, project)
    if experiment_id in (None, "", "0", 0):
        experiment = default_experiment(project)
    else:
        experiment = access.experiment_for(actor.user, project, parse_experiment_id(experiment_id))
    if experiment.lifecycle_stage != LifecycleStage.ACTIVE:
        raise invalid(f"The experiment {experiment.pk} must be in the 'active' state. Current state is "
                      f"{experiment.lifecycle_stage}.")
    tag_rows = _clean_tags(tags)
    name = validate_text(run_name, "run_name", MAX_RUN_NAME_LENGTH, required=False)
    tagged_name = dict(tag_rows).get(RUN_NAME_TAG)
    if name and tagged_name and name != tagged_name:
        raise invalid(f"Both 'run_name' argument and 'mlflow.runName' tag are specified, but with different "
                      f"values (run_name='{name}', mlflow.runName='{tagged_name}').")
    name = name or tagged_name or _random_name()
    start = as_long(start_time, "start_time", default=None, minimum=0) or now_ms()
    kind = dict(tag_rows).get(KIND_TAG)
    with transaction.atomic():
        run = Run.objects.create(experiment=experiment, project=project, name=name, status=RunStatus.RUNNING,
                                 start_time=start, created_by=actor.user,
                                 kind=kind if kind in RunKind.values else RunKind.OTHER)
        values = dict(tag_rows)
        values[RUN_NAME_TAG] = name
        values.setdefault(USER_TAG, str(user_id or actor.user.username)[:MAX_TAG_VAL_LENGTH])
        Tag.objects.bulk_create([Tag(run=run, key=k, value=v) for k, v in values.items()])
        audit(actor, "run.create", run, project=project,
              after={"experiment": experiment.pk, "name": name, "kind": run.kind})
    return run


def update_run(actor: Actor, principal, run: Run, *, status=None, end_time=None, run_name=None) -> Run:
    access.check_can_write(actor.user, principal, run)
    _check_active(run)
    before = {"status": run.status, "name": run.name}
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        fields = []
        if status not in (None, ""):
            if status not in RunStatus.values:
                raise invalid(f"Invalid value '{status}' for parameter 'status' supplied. Valid values are "
                              f"{', '.join(RunStatus.values)}.")
            run.status = status
            fields.append("status")
        if status not in (None, "") or end_time not in (None, ""):
            end = as_long(end_time, "end_time", minimum=0)
            run.end_time = (end or now_ms()) if status in TERMINAL_RUN_STATUSES else end
            fields.append("end_time")
        if run_name not in (None, ""):
            run.name = validate_text(run_name, "run_name", MAX_RUN_NAME_LENGTH)
            fields.append("name")
            _upsert_tags(run, [(RUN_NAME_TAG, run.name)])
        if fields:
            run.save(update_fields=fields)
            if "status" in fields or "name" in fields:
                audit(actor, "run.update", run, project=run.project, before=before,
                      after={"status": run.status, "name": run.name})
    return run


def set_lifecycle(actor: Actor, principal, run: Run, stage: str) -> Run:
    access.check_can_write(actor.user, principal, run)
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.lifecycle_stage != stage:
            before = run.lifecycle_stage
            run.lifecycle_stage = stage
            run.deleted_time = now_ms() if stage == LifecycleStage.DELETED else None
            run.save(update_fields=["lifecycle_stage", "deleted_time"])
            audit(actor, "run.delete" if stage == LifecycleStage.DELETED else "run.restore", run,
                  project=run.project, before={"lifecycle_stage": before}, after={"lifecycle_stage": stage})
    return run


# Logging --------------------------------------------------------------------------------------------

def log_batch(actor: Actor, principal, run: Run, *, metrics=None, params=None, tags=None) -> None:
    """MLflow's LogBatch: limits first, then every item checked, then all written in one transaction
    (metric points and their latest values in one statement, which is its own transaction when the batch
    has no params or tags)."""
    metrics, params, tags = _list(metrics, "metrics"), _list(params, "params"), _list(tags, "tags")
    validate_batch_limits(metrics, params, tags)
    _reuse_project(run, principal)
    access.check_can_write(actor.user, principal, run)
    _check_active(run)
    points = _clean_metrics(metrics)
    param_rows = _clean_params(params)
    tag_rows = _clean_tags(tags)
    if not param_rows and not tag_rows:
        if points:  # one statement, atomic on its own: no BEGIN and COMMIT round trips
            _insert_points(run, points)
        return
    with transaction.atomic():
        if param_rows:
            _insert_params(run, param_rows)
        if tag_rows:
            _upsert_tags(run, tag_rows)
            _apply_special_tags(run, tag_rows)
        if points:
            _insert_points(run, points)


def delete_tag(actor: Actor, principal, run: Run, key) -> None:
    access.check_can_write(actor.user, principal, run)
    _check_active(run)
    key = validate_key(key, "key", "Tag")
    deleted, _rows = Tag.objects.filter(run=run, key=key).delete()
    if not deleted:
        raise MlflowError(f"No tag with name: {key} in run with id {run.run_id}", "RESOURCE_DOES_NOT_EXIST")


def log_inputs(actor: Actor, principal, run: Run, *, datasets=None) -> None:
    datasets = _list(datasets, "datasets")
    if len(datasets) > MAX_DATASETS_PER_BATCH:
        raise invalid(f"A batch logging request can contain at most {MAX_DATASETS_PER_BATCH} datasets. Got "
                      f"{len(datasets)} datasets. Please split up datasets across multiple requests and try again.")
    access.check_can_write(actor.user, principal, run)
    _check_active(run)
    rows = []
    for index, item in enumerate(datasets):
        item = _dict(item, f"datasets[{index}]")
        dataset = _dict(item.get("dataset"), f"datasets[{index}].dataset")
        path = f"datasets[{index}].dataset"
        input_tags = []
        for t_index, tag in enumerate(_list(item.get("tags"), f"datasets[{index}].tags")):
            tag = _dict(tag, f"datasets[{index}].tags[{t_index}]")
            input_tags.append({"key": validate_text(tag.get("key"), "key", 255),
                               "value": validate_text(tag.get("value"), "value", 500, required=False)})
        rows.append(RunInput(
            run=run, name=validate_text(dataset.get("name"), f"{path}.name", MAX_DATASET_NAME_SIZE),
            digest=validate_text(dataset.get("digest"), f"{path}.digest", MAX_DATASET_DIGEST_SIZE),
            source_type=validate_text(dataset.get("source_type"), f"{path}.source_type", 36, required=False),
            source=validate_text(dataset.get("source"), f"{path}.source", MAX_DATASET_SOURCE_SIZE, required=False),
            schema=validate_text(dataset.get("schema"), f"{path}.schema", MAX_DATASET_SCHEMA_SIZE, required=False),
            profile=validate_text(dataset.get("profile"), f"{path}.profile", 16777215, required=False),
            tags=input_tags))
    with transaction.atomic():
        for row in rows:
            RunInput.objects.update_or_create(run=run, name=row.name, digest=row.digest, defaults={
                "source_type": row.source_type, "source": row.source, "schema": row.schema, "profile": row.profile,
                "tags": row.tags})


# Reading --------------------------------------------------------------------------------------------

def metric_history_json(key: str, rows) -> str:
    """The JSON list of MLflow's GetMetricHistory answer from (value, is_nan, timestamp, step) rows, written
    straight: the text json.dumps gives for the API's metric dicts (a float's repr; NaN and ±inf as protobuf
    JSON's strings), without building 100,000 dicts for it."""
    head = '{"key":' + json.dumps(key) + ',"value":'
    special = {math.inf: '"Infinity"', -math.inf: '"-Infinity"'}
    points = []
    for value, is_nan, timestamp, step in rows:
        if is_nan or value != value:
            shown = '"NaN"'
        else:
            shown = special.get(value) or repr(value)
        points.append(f'{head}{shown},"timestamp":{timestamp},"step":{step}}}')
    return "[" + ",".join(points) + "]"


# helpers --------------------------------------------------------------------------------------------

def _clean_metrics(metrics: list) -> list[tuple[str, float, int, int]]:
    """Each metric as _clean_metric checks it. What MLflow's client sends (a float, an int timestamp and
    step, a key seen earlier in the batch) is taken as it is, without checking the key again: a
    1000-point batch usually names a few keys. Anything else takes _clean_metric's path and messages."""
    keys: set[str] = set()
    points = []
    for index, metric in enumerate(metrics):
        if type(metric) is dict:
            key, value, timestamp, step = (metric.get("key"), metric.get("value"), metric.get("timestamp"),
                                           metric.get("step"))
            if type(key) is str and key in keys and _plain_point(value, timestamp, step):
                points.append((key, float(value), timestamp, step or 0))
                continue
        point = _clean_metric(metric, f"metrics[{index}]")
        keys.add(point[0])
        points.append(point)
    return points


def _plain_point(value, timestamp, step) -> bool:
    """Whether as_long and metric_value would take these as they are (type() is: a bool is no number)."""
    return ((type(value) is float or (type(value) is int and INT64_MIN <= value <= INT64_MAX))
            and type(timestamp) is int and 0 <= timestamp <= INT64_MAX
            and (step is None or (type(step) is int and INT64_MIN <= step <= INT64_MAX)))


def _clean_metric(metric, path: str) -> tuple[str, float, int, int]:
    metric = _dict(metric, path)
    key = validate_key(metric.get("key"), f"{path}.key", "Metric")
    timestamp = metric.get("timestamp")
    value = metric_value(metric.get("value"), f"{path}.value", key, timestamp)
    if timestamp is None:
        raise invalid(f"Missing value for required parameter '{path}.timestamp'.")
    timestamp = as_long(timestamp, f"{path}.timestamp", minimum=0,
                        message=f"metric '{key}' (value={value}). Timestamp must be a nonnegative long "
                                "(64-bit integer) ")
    step = as_long(metric.get("step"), f"{path}.step", default=0,
                   message=f"metric '{key}' (value={value}). Step must be a valid long (64-bit integer).")
    return key, value, timestamp, step


def _clean_params(params: list) -> list[tuple[str, str]]:
    rows = []
    for index, param in enumerate(params):
        param = _dict(param, f"params[{index}]")
        key = validate_key(param.get("key"), f"params[{index}].key", "Param")
        value = validate_text(param.get("value"), f"params[{index}].value", MAX_PARAM_VAL_LENGTH, required=False)
        rows.append((key, value))
    dupes = sorted(k for k, n in Counter(k for k, _v in rows).items() if n > 1)
    if dupes:
        raise invalid(f"Duplicate parameter keys have been submitted: {dupes}. Please ensure the request contains "
                      "only one param value per param key.")
    return rows


def _clean_tags(tags, max_value_length: int = MAX_TAG_VAL_LENGTH) -> list[tuple[str, str]]:
    """The tags, each key once (the last value wins)."""
    rows = {}
    for index, tag in enumerate(_list(tags, "tags")):
        tag = _dict(tag, f"tags[{index}]")
        key = validate_key(tag.get("key"), f"tags[{index}].key", "Tag")
        rows[key] = validate_text(tag.get("value"), f"tags[{index}].value", max_value_length, required=False)
    return list(rows.items())


def _insert_params(run: Run, rows: list[tuple[str, str]]) -> None:
    existing = dict(Param.objects.filter(run=run, key__in=[k for k, _v in rows]).values_list("key", "value"))
    for key, value in rows:
        if key in existing and existing[key] != value:
            raise invalid(f"Changing param values is not allowed. Param with key='{key}' was already logged with "
                          f"value='{existing[key]}' for run ID='{run.run_id}'. Attempted logging new value "
                          f"'{value}'.")
    Param.objects.bulk_create([Param(run=run, key=k, value=v) for k, v in rows if k not in existing],
                              ignore_conflicts=True)


def _upsert_tags(run: Run, rows: list[tuple[str, str]]) -> None:
    Tag.objects.bulk_create([Tag(run=run, key=k, value=v) for k, v in rows], update_conflicts=True,
                            unique_fields=["run", "key"], update_fields=["value"])


def _apply_special_tags(run: Run, rows: list[tuple[str, str]]) -> None:
    values = dict(rows)
    fields = []
    if values.get(RUN_NAME_TAG) and values[RUN_NAME_TAG] != run.name:
        run.name = values[RUN_NAME_TAG][:MAX_RUN_NAME_LENGTH]
        fields.append("name")
    if values.get(KIND_TAG) in RunKind.values and values[KIND_TAG] != run.kind:
        run.kind = values[KIND_TAG]
        fields.append("kind")
    if fields:
        Run.objects.filter(pk=run.pk).update(**{f: getattr(run, f) for f in fields})


def _insert_points(run: Run, points) -> None:
    """Metric points (key, value, timestamp, step) and each key's latest value and count of points in one
    SQL statement, each point stored once: a point already there (the same batch sent again after a lost
    answer) is skipped, as MLflow's primary key does. NaN is stored as MLflow stores it (value 0, is_nan).
    The rows travel as five array literals rather than one model instance (and six parameters) per point:
    building those was most of a 1000-point batch's time."""
    # A dict: duplicates in the batch once, in order. NaN (the only value unequal to itself) as 0, is_nan.
    rows = dict.fromkeys((key, 0.0, timestamp, step, True) if value != value else (key, value, timestamp, step, False)
                         for key, value, timestamp, step in points)
    if not rows:
        return
    # Each key's latest row: a stable sort by _ORDER, so of equal rows the batch's last one wins.
    latest = {row[0]: row for row in sorted(rows, key=_ORDER)}
    if connection.vendor != "postgresql":  # the demo's SQLite has no arrays: the same rows, two statements
        _insert_points_portably(run, rows, latest)
        return
    with connection.cursor() as cursor:
        cursor.execute(_POINTS_SQL, [run.pk, *_array_literals(rows), run.pk, *_array_literals(latest.values())])


def _insert_points_portably(run: Run, rows, latest: dict) -> None:
    table, metric = LatestMetric._meta.db_table, Metric._meta.db_table
    values = ", ".join([f"(%s, %s, %s, %s, %s, %s, (SELECT count(*) FROM {metric} WHERE run_id = %s AND key = %s))"]
                       * len(latest))
    with transaction.atomic():
        Metric.objects.bulk_create([Metric(run_id=run.pk, key=k, value=v, timestamp=t, step=s, is_nan=n)
                                    for k, v, t, s, n in rows], batch_size=1000, ignore_conflicts=True)
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {table} AS latest (run_id, key, value, timestamp, step, is_nan, points) "
                           f"VALUES {values} {_LATEST_UPDATE.format(points='EXCLUDED.points')}",
                           [a for k, v, t, s, n in latest.values() for a in (run.pk, k, v, t, s, n, run.pk, k)])


_ORDER = operator.itemgetter(3, 2, 1)  # step, timestamp, stored value (0 for NaN), as MLflow compares points


def _array_literals(rows) -> list[str]:
    """PostgreSQL array literals of the (key, value, timestamp, step, is_nan) columns. repr of a float is
    exact (and "inf"/"-inf" is PostgreSQL's too); a key is quoted, so any text survives."""
    keys, values, timestamps, steps, nans = zip(*rows)
    quoted = {key: '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"' for key in set(keys)}  # few keys
    return ["{" + ",".join(map(quoted.__getitem__, keys)) + "}", "{" + ",".join(map(repr, values)) + "}",
            "{" + ",".join(map(str, timestamps)) + "}", "{" + ",".join(map(str, steps)) + "}",
            "{" + ",".join(map(_BOOLEAN.__getitem__, nans)) + "}"]


_BOOLEAN = {True: "t", False: "f"}


# The latest point replaces the stored one only if it is later (by step, then timestamp, then stored value);
# the count of points grows by the points the statement stored.
_LATER = "(EXCLUDED.step, EXCLUDED.timestamp, EXCLUDED.value) >= (latest.step, latest.timestamp, latest.value)"
_LATEST_UPDATE = ("ON CONFLICT (run_id, key) DO UPDATE SET points = {points}, " + ", ".join(
    f"{column} = CASE WHEN {_LATER} THEN EXCLUDED.{column} ELSE latest.{column} END"
    for column in ("value", "timestamp", "step", "is_nan")))
_COLUMNS = "unnest(%s::text[], %s::float8[], %s::bigint[], %s::bigint[], %s::boolean[])"
_POINTS_SQL = (
    f"WITH stored AS (INSERT INTO {Metric._meta.db_table} (run_id, key, value, timestamp, step, is_nan) "
    f"SELECT %s, * FROM {_COLUMNS} ON CONFLICT DO NOTHING RETURNING key), "
    "counted AS (SELECT key, count(*) AS n FROM stored GROUP BY key) "
    f"INSERT INTO {LatestMetric._meta.db_table} AS latest (run_id, key, value, timestamp, step, is_nan, points) "
    f"SELECT %s, p.key, p.value, p.timestamp, p.step, p.is_nan, counted.n FROM {_COLUMNS} "
    "AS p (key, value, timestamp, step, is_nan) JOIN counted ON counted.key = p.key "
    + _LATEST_UPDATE.format(points="latest.points + EXCLUDED.points"))


def _reuse_project(run: Run, principal) -> None:
    """The caller's project is the Run's (the API looks the Run up within it): the write check reads it
    from there instead of loading it again."""
    project = getattr(principal, "project", None)
    if project is not None and run.project_id == project.pk and not Run.project.is_cached(run):
        run.project = project


def _check_active(run: Run) -> None:
    if run.lifecycle_stage != LifecycleStage.ACTIVE:
        raise invalid(f"The run {run.run_id} must be in the 'active' state. Current state is "
                      f"{run.lifecycle_stage}.")


def _list(value, path: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid(f"Invalid value {value!r:.200} for parameter '{path}' supplied: expected a list.")
    return value


def _dict(value, path: str) -> dict:
    if not isinstance(value, dict):
        raise invalid(f"Invalid value {value!r:.200} for parameter '{path}' supplied: expected an object.")
    return value


_ADJECTIVES = ("bright", "calm", "clever", "bold", "gentle", "quick", "quiet", "sunny", "swift", "wise")
_NOUNS = ("fox", "owl", "crane", "otter", "hawk", "lynx", "heron", "wolf", "koi", "finch")


def _random_name() -> str:
    return f"{random.choice(_ADJECTIVES)}-{random.choice(_NOUNS)}-{random.randint(100, 999)}"
