"""Why a claimed job has not started (issue 22): the worker's heartbeat carries the reason — its GPUs are
in use by a process outside Mado — and the job's timeline shows it once per reason, in the reader's
language; a reason that is not text, or too long, is refused with what to send."""
from __future__ import annotations

import pytest
from django.test import Client

from jobs.models import JobEvent
from tests.conftest import assert_error
from tests.job_fixtures import job_request

REASON = "GPU 1 is in use by a process outside Mado (pid 4242, user alice)"


@pytest.mark.django_db
def test_the_reason_a_claimed_job_waits_is_on_its_page_once_per_reason(world, job_worker, gpu_box):
    member = Client()
    member.force_login(world.member)
    created = member.post("/api/projects/lab/jobs", job_request(gpu_box), content_type="application/json")
    assert created.status_code == 201, created.content
    item = job_worker.claim()
    for _ in range(3):
        assert job_worker.leased(item, "heartbeat", waiting=REASON).status_code == 200
    events = list(JobEvent.objects.filter(job_id=item["id"], kind="waiting").values_list("message", flat=True))
    assert events == [f"Waiting for its GPUs: {REASON}"]
    page = member.get(f"/projects/lab/jobs/{item['id']}/").content.decode()
    assert '<span class="event-text">Waiting for its GPUs</span>' in page
    assert f'<span class="event-detail muted">{REASON}</span>' in page
    japanese = member.get(f"/projects/lab/jobs/{item['id']}/", HTTP_ACCEPT_LANGUAGE="ja").content.decode()
    assert '<span class="event-text">GPUの空きを待っています</span>' in japanese and REASON in japanese

    # Control characters (a terminal's escape codes in a user name) are not written to the timeline.
    assert job_worker.leased(item, "heartbeat", waiting="GPU 1 is in use by \x1b[31mmallory\x1b[0m\r").status_code == 200
    last = JobEvent.objects.filter(job_id=item["id"], kind="waiting").order_by("-id").first().message
    assert last == "Waiting for its GPUs: GPU 1 is in use by [31mmallory[0m"

    # Started: a late reason is not written any more.
    assert job_worker.heartbeat(item, status="running").status_code == 200
    assert job_worker.leased(item, "heartbeat", waiting="GPU 0 is in use").status_code == 200
    assert JobEvent.objects.filter(job_id=item["id"], kind="waiting").count() == 2


@pytest.mark.django_db
def test_a_reason_that_is_not_short_text_is_refused(world, job_worker, gpu_box):
    member = Client()
    member.force_login(world.member)
    assert member.post("/api/projects/lab/jobs", job_request(gpu_box), content_type="application/json").status_code == 201
    item = job_worker.claim()
    assert_error(job_worker.leased(item, "heartbeat", waiting="x" * 451), 422)
    assert_error(job_worker.leased(item, "heartbeat", waiting=["GPU 1"]), 422)
    assert not JobEvent.objects.filter(job_id=item["id"], kind="waiting").exists()
