"""Mark as lost on the job page (issue 13, jobs.services.mark_lost) through Django's test client: the
button only for Project admins and only while the Job is Not responding; the dialog says what happens
(Failed, Worker lost; GPUs released; its process may still run on the computer); confirming ends the
Job; a refusal is shown in the dialog; the same without HTMX and in Japanese."""
from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import services
from jobs.models import Job
from mado.models import AuditEvent
from mado.services import Actor

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
WARNING = "Its process may still be running on the computer: check the computer before you reuse its GPUs."


def claimed(world, box, worker, *, silent_for=timedelta(seconds=90), gpu_ids=("0", "1")) -> Job:
    job = services.create_job(Actor(world.member), world.project,
                              {"computer": box.pk, "runtime": "python", "command": ["python", "train.py"],
                               "gpu_ids": list(gpu_ids), "name": "resnet"})
    item = worker.claim()
    assert item["id"] == job.pk
    Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - silent_for)
    return Job.objects.get(pk=job.pk)


def lost_url(job: Job) -> str:
    return f"/projects/lab/jobs/{job.pk}/lost"


def page(client, user, job: Job, **headers) -> str:
    client.force_login(user)
    response = client.get(f"/projects/lab/jobs/{job.pk}/", **headers)
    assert response.status_code == 200
    return response.content.decode()


def test_a_project_admin_sees_mark_as_lost_only_while_the_job_is_not_responding(world, client, gpu_box,
                                                                                  job_worker):
    job = claimed(world, gpu_box, job_worker, silent_for=timedelta(seconds=5))
    html = page(client, world.project_admin, job)
    assert "No response" not in html and 'id="mark-lost"' not in html
    Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=90))
    html = page(client, world.project_admin, job)
    assert "No response" in html and 'id="mark-lost"' in html and lost_url(job) in html


def test_members_and_the_creator_see_no_button_and_are_refused(world, client, gpu_box, job_worker):
    job = claimed(world, gpu_box, job_worker)
    html = page(client, world.member, job)  # the creator, a member: stop yes, mark as lost no
    assert "No response" in html and 'id="mark-lost"' not in html and "Request stop" in html
    assert client.get(lost_url(job), **HTMX).status_code == 403
    assert client.post(lost_url(job), **HTMX).status_code == 403
    client.force_login(world.outsider)
    assert client.get(lost_url(job)).status_code == 404
    job.refresh_from_db()
    assert job.status == "claimed" and job.gpu_reservations.count() == 2


def test_the_dialog_says_what_happens_and_confirming_ends_the_job_as_worker_lost(world, client, gpu_box,
                                                                                 job_worker):
    job = claimed(world, gpu_box, job_worker)
    client.force_login(world.project_admin)
    dialog = client.get(lost_url(job), **HTMX).content.decode()
    assert '<h2 id="dialog-title">Mark as lost</h2>' in dialog
    assert "The Job ends as Failed (Worker lost)." in dialog
    assert "Its GPUs (0, 1) are released, so other Jobs can take them." in dialog
    assert WARNING in dialog
    assert "resnet" in dialog and "bob" in dialog and "gpu-host-1" in dialog and "lab-worker-1" in dialog
    assert "<html" not in dialog  # a fragment for the dialog shell

    response = client.post(lost_url(job), **HTMX)
    assert response.status_code == 204
    assert json.loads(response["HX-Trigger"]) == {"jobsChanged": True, "closeDialog": True}
    job.refresh_from_db()
    assert job.status == "failed" and job.end_reason == "worker_lost" and job.finished_at is not None
    assert not job.gpu_reservations.exists()
    assert AuditEvent.objects.filter(action="job.mark_lost", object_id=str(job.pk)).exists()
    html = page(client, world.project_admin, job)
    assert 'Failed</span> · <span class="muted end-reason">Worker lost</span>' in re.sub(r"\s+", " ", html)
    assert 'id="mark-lost"' not in html


def test_a_job_that_answers_again_is_not_marked_and_the_dialog_says_why(world, client, gpu_box, job_worker):
    job = claimed(world, gpu_box, job_worker)
    client.force_login(world.project_admin)
    assert WARNING in client.get(lost_url(job), **HTMX).content.decode()
    Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now())  # the worker came back meanwhile
    response = client.post(lost_url(job), **HTMX)
    assert response.status_code == 200  # shown in the dialog: htmx swaps no 4xx answer
    body = response.content.decode()
    assert 'role="alert">Only a Job that shows No response' in body
    assert "Its worker is responding again, so this Job is not marked as lost." in body
    assert "<form" not in body
    job.refresh_from_db()
    assert job.status == "claimed" and job.gpu_reservations.count() == 2

    services.request_stop(Actor(world.member), job)
    Job.objects.filter(pk=job.pk).update(status="canceled", end_reason="canceled", finished_at=timezone.now())
    assert "Already ended" in client.get(lost_url(job), **HTMX).content.decode()


def test_without_htmx_the_dialog_is_a_whole_page_and_confirming_returns_to_the_job(world, client, gpu_box,
                                                                                   job_worker):
    job = claimed(world, gpu_box, job_worker, gpu_ids=())
    client.force_login(world.project_admin)
    html = client.get(lost_url(job)).content.decode()
    assert "<html" in html and "hx-disable" in html and WARNING in html
    assert "Its place on the computer is freed for other Jobs." in html
    response = client.post(lost_url(job))
    assert response.status_code == 302 and response["Location"] == f"/projects/lab/jobs/{job.pk}/"
    assert Job.objects.get(pk=job.pk).end_reason == "worker_lost"


def test_the_dialog_speaks_japanese(world, client, gpu_box, job_worker):
    job = claimed(world, gpu_box, job_worker)
    client.force_login(world.project_admin)
    assert "接続喪失にする" in page(client, world.project_admin, job, HTTP_ACCEPT_LANGUAGE="ja")
    dialog = client.get(lost_url(job), HTTP_ACCEPT_LANGUAGE="ja", **HTMX).content.decode()
    assert "Jobは「失敗（workerとの接続喪失）」で終わります。" in dialog
    assert "GPUを再び使う前に、コンピュータで確かめてください。" in dialog
