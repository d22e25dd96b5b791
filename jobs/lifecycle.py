"""The one job lifecycle: every change of a Job's status goes through `move`, along TRANSITIONS.

Workers' jobs: queued → claimed → running → finished | failed | canceled (a claim that never started
goes back to the queue). Site jobs (docs/sites-protocol.md): queued | waiting_manual → submitting →
submitted → waiting_resources → running → the end; a runner may start before its submission's report.
Job.save refuses any other write of the status column (jobs.models), so a new path that changes a
status has to add its edge here. Callers lock the Job row first (select_for_update): `move` checks the
status they read under that lock."""
from __future__ import annotations

from django.db import connection, models
from django.db.models import BooleanField
from django.db.models.expressions import RawSQL
from django.db.models.sql import UpdateQuery
from django.utils import timezone

from jobs import hooks
from jobs.choices import JobStatus as S

ENDS = frozenset({S.FINISHED, S.FAILED, S.CANCELED})
# from-status → the statuses it may move to. The ends are final.
TRANSITIONS: dict[str, frozenset[str]] = {
    S.QUEUED: frozenset({S.CLAIMED, S.SUBMITTING, S.CANCELED, S.FAILED}),
    S.WAITING_MANUAL: frozenset({S.SUBMITTING, S.CANCELED, S.FAILED}),
    S.CLAIMED: frozenset({S.QUEUED, S.RUNNING}) | ENDS,
    S.SUBMITTING: frozenset({S.SUBMITTED, S.WAITING_RESOURCES, S.FAILED, S.CANCELED}),
    S.SUBMITTED: frozenset({S.WAITING_RESOURCES, S.FAILED, S.CANCELED}),
    S.WAITING_RESOURCES: frozenset({S.RUNNING}) | ENDS,
    S.RUNNING: ENDS,
    **{end: frozenset() for end in ENDS},
}
# The timestamp each arrival sets (a claim by a worker or a site's submitter, the start, the end).
STAMPS = {S.CLAIMED: "claimed_at", S.SUBMITTING: "claimed_at", S.RUNNING: "started_at",
          **{end: "finished_at" for end in ENDS}}


class IllegalTransition(RuntimeError):
    """A status write the lifecycle does not allow: a programming error, never a user's."""


def can_move(job, to: str) -> bool:
    return to in TRANSITIONS[job.status]


def move(job, to: str, *, at=None, **fields) -> None:
    """Move a locked Job to `to` with the fields that change with it, in one save; the transition's
    timestamp (STAMPS) is `at`, now by default."""
    _stamp(job, to, at, fields)
    _arrive(job, to, fields)
    models.Model.save(job, update_fields=["status", *fields])  # the one write past Job.save's guard


def move_if(job, to: str, when, *, at=None, along=(), also=(), **fields) -> bool:
    """`move` taken only if `when` (a filter of Job rows) holds as the write finds the row, with the rows
    `along` (unsaved) inserted and the `also` updates ((queryset, values) pairs) made with it and only with
    it. On PostgreSQL all of it is one statement (a writable WITH; the claim, issue 19), elsewhere one
    statement each. Returns whether it moved; nothing is written when it did not."""
    _stamp(job, to, at, fields)
    rows = type(job)._default_manager.filter(when, pk=job.pk, status=job.status)
    values = {"status": to, **fields}
    if connection.vendor == "postgresql":
        moved = _in_one_statement(rows, values, along, also)
    else:
        moved = rows.update(**values) == 1
        if moved:
            for model, objs in _by_model(along):
                model._default_manager.bulk_create(objs)
            for queryset, changes in also:
                queryset.update(**changes)
    if moved:
        _arrive(job, to, fields)
    return moved


def _stamp(job, to: str, at, fields: dict) -> None:
    if not can_move(job, to):
        raise IllegalTransition(f"Job {job.pk}: {job.status} → {to} is not a transition of jobs.lifecycle.")
    if to in STAMPS:
        fields[STAMPS[to]] = at or timezone.now()


def _arrive(job, to: str, fields: dict) -> None:
    job.status = to
    for name, value in fields.items():
        setattr(job, name, value)


# Filters the `also` updates of move_if's statement: they happen only where the Job moved.
_MOVED = RawSQL("EXISTS (SELECT 1 FROM moved)", (), output_field=BooleanField())


def _in_one_statement(rows, values: dict, along, also) -> bool:
    """The WITH sub-statements share one snapshot, taken when the statement starts: `when` is read then,
    and the inserts and updates depend on the Job's update (`moved`), so none happens without it."""
    sql, params = _update_sql(rows, values)
    parts, params = [f"moved AS ({sql} RETURNING 1)"], list(params)
    for model, objs in _by_model(along):
        sql, more = _insert_sql(objs)
        parts.append(f"along_{model._meta.db_table} AS ({sql})")
        params += more
    for number, (queryset, changes) in enumerate(also):
        sql, more = _update_sql(queryset.filter(_MOVED), changes)
        parts.append(f"also_{number} AS ({sql})")
        params += more
    with connection.cursor() as cursor:
        cursor.execute(f"WITH {', '.join(parts)} SELECT count(*) FROM moved", params)
        return cursor.fetchone()[0] == 1


def _by_model(objs) -> list[tuple[type, list]]:
    groups: dict[type, list] = {}
    for obj in objs:
        groups.setdefault(type(obj), []).append(obj)
    return list(groups.items())


def _update_sql(queryset, values: dict) -> tuple[str, tuple]:
    """What `queryset.update(**values)` would run."""
    query = queryset.query.chain(UpdateQuery)
    query.add_update_values(values)
    return query.get_compiler(connection=connection).as_sql()


def _insert_sql(objs: list) -> tuple[str, list]:
    """INSERT of unsaved rows of one model, one row per row of `moved` (that is, none unless it moved).
    Each value carries its column's type, as a literal in a SELECT has none."""
    meta = objs[0]._meta
    fields = [f for f in meta.local_concrete_fields if f is not meta.auto_field]
    quote = connection.ops.quote_name
    row = ", ".join(f"%s::{f.db_type(connection)}" for f in fields)
    selects = " UNION ALL ".join(f"SELECT {row} FROM moved" for _ in objs)
    params = [f.get_db_prep_save(f.pre_save(obj, True), connection) for obj in objs for f in fields]
    return f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) {selects}", params


def heartbeat(job, now, *, running: bool, started: str = "Started") -> None:
    """A sign of life from whoever runs the Job (a worker, a site's runner). `running` (its code runs)
    starts a Job that may start (claimed, or waiting for resources): the `started` event, started_at,
    then the start hooks (tracking's Run) once the row says running."""
    if not (running and can_move(job, S.RUNNING)):
        job.heartbeat_at = now
        job.save(update_fields=["heartbeat_at"])
        return
    event(job, "started", started)
    move(job, S.RUNNING, at=now, heartbeat_at=now)
    hooks.run_after_start(job)


def event(job, kind: str, message: str) -> None:
    """A line of the Job's timeline on its page."""
    event_row(job, kind, message).save()


def event_row(job, kind: str, message: str):
    """The line, unsaved (move_if writes it along with a move)."""
    return job.events.model(job=job, kind=kind, message=message[:500])
