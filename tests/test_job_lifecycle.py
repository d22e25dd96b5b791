"""The one job lifecycle (jobs.lifecycle): its table, the model's guard against other status writes, and
the one start rule that a worker's and a site runner's heartbeats share."""
from __future__ import annotations

import pytest
from django.utils import timezone

from jobs import lifecycle
from jobs.choices import TERMINAL_STATUSES, JobStatus
from jobs.lifecycle import TRANSITIONS, IllegalTransition
from jobs.models import Job
from jobs.services import create_job
from mado.services import Actor
from tests.job_fixtures import job_request


@pytest.fixture
def job(world, gpu_box) -> Job:
    return create_job(Actor(world.member), world.project, job_request(gpu_box))


def stored(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def test_a_status_saved_outside_the_lifecycle_is_refused_and_the_row_keeps_its_status(job):
    job.status = JobStatus.CANCELED
    with pytest.raises(IllegalTransition, match="jobs.lifecycle.move"):
        job.save(update_fields=["status"])
    with pytest.raises(IllegalTransition):
        job.save()  # a full save writes the status column too
    assert stored(job).status == JobStatus.QUEUED
    job.name, job.status = "renamed", JobStatus.QUEUED
    job.save(update_fields=["name"])  # other fields save as before
    assert stored(job).name == "renamed"


@pytest.mark.parametrize("start,to", [(JobStatus.QUEUED, JobStatus.RUNNING), (JobStatus.FINISHED, JobStatus.RUNNING),
                                      (JobStatus.SUBMITTED, JobStatus.SUBMITTING),
                                      (JobStatus.RUNNING, JobStatus.QUEUED)])
def test_a_move_the_table_does_not_hold_raises_and_writes_nothing(world, gpu_box, start, to):
    job = Job.objects.create(project=world.project, created_by=world.member, target=gpu_box, status=start)
    with pytest.raises(IllegalTransition, match=f"{start} → {to}"):
        lifecycle.move(job, to)
    row = stored(job)
    assert row.status == start and row.started_at is None and row.finished_at is None


def test_a_move_writes_the_status_its_timestamp_and_its_fields_in_one_save(job, world):
    at = timezone.now()
    lifecycle.move(job, JobStatus.CANCELED, at=at, end_reason="canceled")
    row = stored(job)
    assert (row.status, row.finished_at, row.end_reason) == (JobStatus.CANCELED, at, "canceled")


def test_every_status_is_in_the_table_and_every_unended_one_can_end():
    assert set(TRANSITIONS) == set(JobStatus.values)
    assert {s for s, exits in TRANSITIONS.items() if not exits} == set(TERMINAL_STATUSES)
    for status in TRANSITIONS:
        seen, todo = set(), [status]
        while todo:
            seen.add(current := todo.pop())
            todo += [s for s in TRANSITIONS[current] if s not in seen]
        assert seen & set(TERMINAL_STATUSES), f"{status} can never end"
    # Nobody runs a queued or manual-waiting Job yet: a stop cancels it at once (request_stop).
    assert all(JobStatus.CANCELED in TRANSITIONS[s] for s in (JobStatus.QUEUED, JobStatus.WAITING_MANUAL))


def test_a_workers_running_heartbeats_start_the_job_once(job, job_worker):
    item = job_worker.claim()
    assert stored(job).status == JobStatus.CLAIMED and stored(job).claimed_at is not None
    assert job_worker.heartbeat(item, status="running").status_code == 200
    started = stored(job).started_at
    assert job_worker.heartbeat(item, status="running").status_code == 200
    row = stored(job)
    assert row.status == JobStatus.RUNNING and row.started_at == started and row.heartbeat_at > started
    assert list(row.events.filter(kind="started").values_list("message", flat=True)) == ["Started"]


@pytest.mark.parametrize("status,starts", [(JobStatus.WAITING_RESOURCES, True), (JobStatus.SUBMITTED, False),
                                           (JobStatus.RUNNING, False)])
def test_a_running_heartbeat_starts_only_a_job_that_may_start(world, gpu_box, status, starts):
    job = Job.objects.create(project=world.project, created_by=world.member, target=gpu_box, status=status)
    now = timezone.now()
    lifecycle.heartbeat(job, now, running=True, started="Started: all 2 replicas run")
    row = stored(job)
    assert row.heartbeat_at == now
    assert (row.status, row.started_at) == ((JobStatus.RUNNING, now) if starts else (status, None))
    assert row.events.filter(kind="started", message="Started: all 2 replicas run").exists() == starts
