"""The runner's side through the real API with the Job's job token: start → waiting_resources, a
second runner refused with 409 runner_conflict, heartbeats → running and the stop it learns of, logs,
metrics and outputs, finish (timed out, idempotent), and the token reaching its own Job only."""
from __future__ import annotations

import hashlib
import json
import uuid

import pytest

from jobs.models import Job
from sites.models import Submission
from tests.conftest import assert_error, bearer
from tests.sites.site_jobs import (  # noqa: F401  (fixtures)
    Runner,
    claim,
    launcher,
    lclient,
    no_expiry_throttle,
    queue,
    registered,
    report,
    site_of,
    submitted,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def site(world, host_keys, launcher):
    return site_of(world.project_admin, host_keys, launcher)


@pytest.fixture
def pair(world, site, lclient):
    """Two Jobs submitted as one array; (item, runner of the first, runner of the second)."""
    queue(site, world.member, world.project, 2)
    item = submitted(lclient, site, scheduler_job_id="5001")
    return item, Runner(item["jobs"][0]["id"], item["jobs"][0]["token"]), Runner(item["jobs"][1]["id"],
                                                                                   item["jobs"][1]["token"])


def test_start_waits_for_resources_and_a_second_runner_is_refused(world, pair):
    item, runner, _ = pair
    response = runner.start(scheduler_job_id="5001_0", array_index=0)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["heartbeat_seconds"] == 5 and body["log_interval_seconds"] == 1
    assert body["job"]["id"] == runner.job_id and body["job"]["job_token"] is None
    assert body["job"]["api_url"] == "https://tracking.example.org"
    job = Job.objects.get(pk=runner.job_id)
    assert job.status == "waiting_resources" and job.heartbeat_at is not None
    row = Submission.objects.get(job=job)
    assert str(row.runner_id) == runner.runner_id and row.runner_hostname == "node-01"
    assert runner.start().status_code == 200, "the same runner again: accepted"
    second = Runner(runner.job_id, item["jobs"][0]["token"])
    assert_error(second.start(), 409, "runner_conflict")
    assert_error(second.heartbeat(), 409, "runner_conflict")
    assert Submission.objects.get(job=job).runner_id == uuid.UUID(runner.runner_id)


def test_heartbeats_move_to_running_and_carry_a_stop(world, pair):
    _, runner, _ = pair
    runner.start()
    body = runner.heartbeat("running").json()
    assert body == {"cancel_requested": False, "status": "running"}
    job = Job.objects.get(pk=runner.job_id)
    assert job.started_at is not None and job.events.filter(kind="started").exists()
    assert runner.heartbeat().json() == {"cancel_requested": False, "status": "running"}
    assert bearer(world.member_token(world.member)).post(f"/api/jobs/{runner.job_id}/stop").status_code == 200
    assert runner.heartbeat().json() == {"cancel_requested": True, "status": "running"}
    finished = runner.finish(status="canceled")
    assert finished.json() == {"id": runner.job_id, "status": "canceled", "end_reason": "canceled"}
    assert_error(runner.heartbeat("nope"), 401)


def test_logs_and_metrics_are_stored_and_a_time_limit_ends_timed_out(world, pair):
    _, runner, _ = pair
    runner.start()
    runner.heartbeat("running")
    chunks = [{"stream": "stdout", "offset": 0, "data": "epoch 1\n"}, {"stream": "stderr", "offset": 0, "data": "w\n"}]
    assert runner.post("logs", chunks=chunks).json() == {"stored": 2}
    assert runner.post("logs", chunks=chunks).json() == {"stored": 0}, "resent chunks are not stored twice"
    assert runner.post("metrics", metrics=[{"name": "loss", "value": 0.5, "step": 1}]).json() == {"stored": 1}
    assert_error(runner.post("logs", chunks=[{"stream": "app", "offset": 0, "data": "x"}]), 422)
    for servers_own in ("queue_timeout", "submit_failed", "worker_lost", "input_failed"):
        assert_error(runner.finish(status="failed", exit_code=1, end_reason=servers_own), 422, "invalid")
    assert Job.objects.get(pk=runner.job_id).status == "running", "a refused finish ends nothing"
    response = runner.finish(status="failed", exit_code=143, end_reason="timed_out", error="Time limit reached")
    assert response.json()["end_reason"] == "timed_out"
    job = Job.objects.get(pk=runner.job_id)
    assert (job.status, job.exit_code, job.error) == ("failed", 143, "Time limit reached")
    assert "".join(job.log_chunks.filter(stream="stdout").values_list("data", flat=True)) == "epoch 1\n"
    # The token ended with the Job: a resent finish is refused at the door.
    assert runner.finish(status="failed", exit_code=143).status_code == 401


def test_outputs_are_declared_and_uploaded_like_a_workers(world, pair, settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path)
    _, runner, _ = pair
    runner.start()
    runner.heartbeat("running")
    report_bytes = b"accuracy 0.93\n"
    digest = hashlib.sha256(report_bytes).hexdigest()
    result = {"version": 2, "complete": True, "metrics": [{"name": "eval.accuracy", "value": 0.93, "step": 1}],
              "artifacts": [{"path": "report.txt", "sha256": digest, "size": len(report_bytes)}]}
    files = [{"path": "report.txt", "size": len(report_bytes), "sha256": digest, "kind": "file"},
             {"path": "result.json", "size": 10, "sha256": "0" * 64, "kind": "file"}]
    response = runner.post("outputs", result=json.dumps(result), files=files, manifest=None)
    assert response.status_code == 200, response.content
    assert response.json() == {"upload": ["report.txt"]}
    assert_error(runner.finish(), 409, "artifacts_incomplete")
    url = f"/api/runner/jobs/{runner.job_id}/artifacts/report.txt"
    refused = runner.client.put(f"{url}?runner_id={uuid.uuid4()}", report_bytes,
                                content_type="application/octet-stream")
    assert_error(refused, 409, "runner_conflict")
    uploaded = runner.client.put(f"{url}?runner_id={runner.runner_id}", report_bytes,
                                 content_type="application/octet-stream")
    assert uploaded.status_code == 200 and uploaded.json()["complete"] is True, uploaded.content
    assert runner.finish().json()["status"] == "finished"


def test_calls_before_start_and_without_a_runner_id_are_refused(world, pair):
    _, runner, _ = pair
    assert_error(runner.heartbeat(), 409, "runner_not_started")
    assert_error(runner.client.post(f"/api/runner/jobs/{runner.job_id}/start", {"hostname": "n"}, format="json"),
                 422, "invalid")
    assert_error(runner.finish(status="done"), 422, "invalid")


def test_a_job_token_reaches_only_its_own_job_and_never_the_submit_endpoints(world, site, pair):
    item, runner, other = pair
    foreign = Runner(other.job_id, item["jobs"][0]["token"])
    assert_error(foreign.start(), 403, "job_token_forbidden")
    client = runner.client
    assert_error(client.get(f"/api/sites/{site.pk}/submit"), 403, "job_token_forbidden")
    assert_error(client.post(f"/api/sites/{site.pk}/submissions/claim", {}, format="json"), 403)
    assert_error(client.post("/api/launcher/submissions/claim", {"computer": site.pk}, format="json"), 403)
    # People's and service tokens are not a job token.
    for token in (world.member_token(world.member), world.worker_token):
        assert_error(bearer(token).post(f"/api/runner/jobs/{runner.job_id}/start",
                                        {"runner_id": str(uuid.uuid4())}, format="json"), 403,
                     "job_token_required")


def test_a_runner_before_the_report_still_starts(world, site, lclient):
    """Hosts without a scheduler start the runner while the job shell runs, before the report."""
    queue(site, world.member, world.project)
    item = claim(lclient, site)[0]
    runner = Runner(item["job_ids"][0], item["jobs"][0]["token"])
    assert runner.start().status_code == 200
    assert report(lclient, item["job_ids"]).json()["jobs"][0]["status"] == "waiting_resources"
    assert Submission.objects.get(job_id=runner.job_id).status == "submitted"


def test_a_stopped_manual_job_without_a_runner_ends_at_once_and_its_runner_is_refused(world, host_keys, launcher):
    target = site_of(world.member, host_keys, launcher, name="bobs-pc", submission="manual")
    job = queue(target, world.member, world.project, status="waiting_manual")[0]
    client = bearer(world.member_token(world.member))
    item = client.post(f"/api/sites/{target.pk}/submissions/claim", {}, format="json").json()["items"][0]
    client.post(f"/api/sites/{target.pk}/submissions/report", {"job_ids": [job.pk], "outcome": "submitted"},
                format="json")
    assert client.post(f"/api/jobs/{job.pk}/stop").json()["status"] == "canceled"
    assert Runner(job.pk, item["jobs"][0]["token"]).start().status_code == 401
