"""Giving a claim back (issue 22): a worker whose job's GPUs stayed in use outside Mado past its wait calls
worker/jobs/{id}/release. The job is queued again with the reason on its timeline, its GPUs and token
gone, audited as the worker's; that worker is not handed it again for a while, another worker is. Only
the lease holder releases, only a job that never started, and a job whose stop was asked ends canceled.
Through the worker API against PostgreSQL."""
from __future__ import annotations

import pytest
from django.test import Client

from jobs import services
from jobs.models import GpuReservation, Job, JobEvent
from mado.models import AuditEvent
from tests.conftest import assert_error, bearer
from tests.job_fixtures import JobWorker, job_request

pytestmark = pytest.mark.django_db

REASON = "GPU 1 is in use by a process outside Mado (pid 4242, user alice); it waited 600 s (the computer's setting)"


def create(world, target, **extra) -> int:
    member = Client()
    member.force_login(world.member)
    created = member.post("/api/projects/lab/jobs", job_request(target, gpu_ids=["1"], **extra),
                          content_type="application/json")
    assert created.status_code == 201, created.content
    return created.json()["id"]


def test_a_released_job_is_queued_again_with_the_reason_and_not_handed_back_to_the_same_worker_at_once(
        world, job_worker, gpu_box):
    job_id = create(world, gpu_box)
    item = job_worker.claim()
    assert item["id"] == job_id and GpuReservation.objects.filter(job_id=job_id).exists()

    answer = job_worker.leased(item, "release", reason=REASON)
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"id": job_id, "status": "queued"}
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.worker, job.lease_id) == ("queued", None, None)
    assert not GpuReservation.objects.filter(job_id=job_id).exists(), "its GPUs are free for other jobs"
    assert_error(bearer(item["job_token"]).get("/api/auth/token"), 401)
    line = JobEvent.objects.filter(job_id=job_id).order_by("-id").first()
    assert (line.kind, line.message) == ("requeued", f"Back in the queue: worker lab-worker-1 gave it back: {REASON}")
    audit = AuditEvent.objects.filter(action="job.requeue", object_id=str(job_id)).get()
    assert audit.actor == world.service_account.user and audit.after["reason"] == "released"
    assert audit.after["worker"] == "lab-worker-1" and REASON in audit.after["message"]

    member = Client()
    member.force_login(world.member)
    page = member.get(f"/projects/lab/jobs/{job_id}/").content.decode()
    assert "gave it back" in page and "pid 4242, user alice" in page

    assert job_worker.claim() is None, "the worker that gave it back does not get it again at once"
    other = JobWorker(world.worker_token, "lab-worker-2")
    assert other.hello().status_code == 200
    again = other.claim()
    assert again["id"] == job_id and again["lease_id"] != item["lease_id"]

    # Given back by the second one too: now the first may take it, the second may not.
    assert other.leased(again, "release", reason=REASON).status_code == 200
    assert other.claim() is None
    third = job_worker.claim()
    assert third["id"] == job_id
    # Once the while has passed, a worker may take again what it gave back.
    assert job_worker.leased(third, "release", reason=REASON).status_code == 200
    assert job_worker.claim() is None
    released_at = Job.objects.get(pk=job_id).released_at
    Job.objects.filter(pk=job_id).update(released_at=released_at - services.RELEASE_BACKOFF)
    assert job_worker.claim()["id"] == job_id

def test_only_the_lease_holder_releases_a_job_that_never_started(world, job_worker, gpu_box):
    job_id = create(world, gpu_box)
    item = job_worker.claim()
    wrong = {**item, "lease_id": "00000000-0000-0000-0000-000000000000"}
    assert_error(job_worker.leased(wrong, "release", reason=REASON), 409, "invalid_lease")
    other = JobWorker(world.worker_token, "lab-worker-2")
    assert other.hello().status_code == 200
    assert_error(other.leased(item, "release", reason=REASON), 409, "invalid_lease")
    assert "reason" in assert_error(job_worker.leased(item, "release"), 422)["fields"]
    assert_error(job_worker.leased(item, "release", reason="x" * 451), 422)
    assert Job.objects.get(pk=job_id).status == "claimed"

    assert job_worker.heartbeat(item, status="running").status_code == 200
    body = assert_error(job_worker.leased(item, "release", reason=REASON), 409, "job_started")
    assert "complete it instead" in body["error"]
    assert Job.objects.get(pk=job_id).status == "running"
    assert job_worker.complete(item).status_code == 200
    assert_error(job_worker.leased(item, "release", reason=REASON), 409, "job_ended")


def test_a_job_whose_stop_was_asked_ends_canceled_instead_of_going_back(world, job_worker, gpu_box):
    job_id = create(world, gpu_box)
    item = job_worker.claim()
    member = Client()
    member.force_login(world.member)
    assert member.post(f"/api/jobs/{job_id}/stop").status_code == 200
    answer = job_worker.leased(item, "release", reason=REASON)
    assert answer.status_code == 200 and answer.json()["status"] == "canceled"
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.end_reason) == ("canceled", "canceled")
    assert not GpuReservation.objects.exists()
