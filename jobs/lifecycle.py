"""The one job lifecycle: every change of a Job's status goes through `move`, along TRANSITIONS.

Workers' jobs: queued → claimed → running → finished | failed | canceled (a claim that never started
goes back to the queue). Site jobs (docs/sites-protocol.md): queued | waiting_manual → submitting →
submitted → waiting_resources → running → the end; a runner may start before its submission's report.
Job.save refuses any other write of the status column (jobs.models), so a new path that changes a
status has to add its edge here. Callers lock the Job row first (select_for_update): `move` checks the
status they read under that lock."""
from __future__ import annotations

from django.db import models
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
    if not can_move(job, to):
        raise IllegalTransition(f"Job {job.pk}: {job.status} → {to} is not a transition of jobs.lifecycle.")
    if to in STAMPS:
        fields[STAMPS[to]] = at or timezone.now()
    job.status = to
    for name, value in fields.items():
        setattr(job, name, value)
    models.Model.save(job, update_fields=["status", *fields])  # the one write past Job.save's guard


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
    job.events.create(kind=kind, message=message[:500])
