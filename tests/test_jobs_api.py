"""Jobs on the server: creation, claim, leased calls, completion, stop, job tokens, locks."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.models import GpuReservation, Job, LogChunk, Metric
from mado.models import AuditEvent, JobToken
from tests.conftest import assert_error, bearer
from tests.job_fixtures import JobWorker, gpu_computer, job_request


def session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def create(world, target, user=None, **extra):
    response = session(user or world.member).post("/api/projects/lab/jobs", job_request(target, **extra), format="json")
    assert response.status_code == 201, response.content
    return response.json()


class TestCreation:
    def test_a_member_creates_a_queued_job_and_it_is_audited(self, world, gpu_box):
        body = create(world, gpu_box, gpu_ids=["0", "1"])
        assert body["status"] == "queued" and body["gpu_ids"] == ["0", "1"] and body["created_by"] == "bob"
        assert AuditEvent.objects.filter(action="job.create", object_id=str(body["id"])).exists()

    def test_a_private_computer_of_someone_else_is_not_available(self, world):
        private = gpu_computer(world.global_admin, "root-box", visibility="private")
        body = assert_error(session(world.member).post("/api/projects/lab/jobs", job_request(private), format="json"),
                            422, "target_not_available")
        assert "not available" in body["error"]
        assert not Job.objects.exists()

    def test_the_owners_service_account_may_use_the_owners_private_computer(self, world):
        alices = gpu_computer(world.project_admin, "alice-box", visibility="private")
        token = world.token(world.alices_account.user, ["read", "jobs:write"], kind="service")
        assert bearer(token).post("/api/projects/lab/jobs", job_request(alices), format="json").status_code == 201

    @pytest.mark.parametrize("extra,field,text", [
        ({"gpu_ids": ["7"]}, "gpu_ids", "has no GPU 7"),
        ({"runtime": "apptainer"}, "runtime", "supports python, docker"),
        ({"runtime": "docker"}, "image", "needs an image"),
        ({"command": []}, "command", "list of arguments"),
        ({"env": {"MMT_API_TOKEN": "x"}}, "env", "set by Mado"),
        ({"requirements": "--index-url http://evil\ntorch"}, "requirements", "pip options"),
        ({"walltime_seconds": 0}, "walltime_seconds", "between 1 second and 30 days"),
        ({"parameters": [1, 2]}, "parameters", "JSON object"),
    ])
    def test_bad_requests_get_422_saying_what_to_fix(self, world, gpu_box, extra, field, text):
        response = session(world.member).post("/api/projects/lab/jobs", job_request(gpu_box, **extra), format="json")
        body = assert_error(response, 422, "invalid_job")
        assert field in body["fields"] and text in body["error"]

    def test_a_disabled_computer_is_refused(self, world, gpu_box):
        gpu_box.enabled = False
        gpu_box.save()
        assert_error(session(world.member).post("/api/projects/lab/jobs", job_request(gpu_box), format="json"),
                     422, "computer_disabled")

    def test_viewers_cannot_create_jobs_and_tokens_need_jobs_write(self, world, gpu_box):
        assert_error(session(world.viewer).post("/api/projects/lab/jobs", job_request(gpu_box), format="json"), 403)
        read_only = world.token(world.member, ["read"])
        assert_error(bearer(read_only).post("/api/projects/lab/jobs", job_request(gpu_box), format="json"), 403,
                     "missing_scope")

    def test_a_command_string_is_split_like_a_shell(self, world, gpu_box):
        body = create(world, gpu_box, command="python train.py --lr '0.1 0.2'")
        assert body["command"] == ["python", "train.py", "--lr", "0.1 0.2"]


class TestClaim:
    def test_a_worker_claims_a_job_with_a_lease_a_job_token_and_reserved_gpus(self, world, gpu_box, job_worker):
        job = create(world, gpu_box, gpu_ids=["1"])
        item = job_worker.claim()
        assert item["id"] == job["id"] and item["lease_id"] and item["job_token"].startswith("mado_mtj_")
        assert item["computer"]["working_dir"] == "/data/mmt" and item["api_url"]
        assert list(GpuReservation.objects.values_list("gpu_id", flat=True)) == ["1"]
        assert Job.objects.get(pk=job["id"]).status == "claimed"
        assert item["job_token"] not in str(list(JobToken.objects.values()))

    def test_jobs_asking_for_busy_gpus_wait_and_others_pass_them(self, world, gpu_box, job_worker):
        first = create(world, gpu_box, gpu_ids=["0", "1"])
        second = create(world, gpu_box, gpu_ids=["1", "2"])
        third = create(world, gpu_box, gpu_ids=["3"])
        a = job_worker.claim()
        b = job_worker.claim(active=[a["id"]])
        assert a["id"] == first["id"] and b["id"] == third["id"]
        assert job_worker.claim(active=[a["id"], b["id"]]) is None
        assert job_worker.complete(a).status_code == 200
        c = job_worker.claim(active=[b["id"]])
        assert c["id"] == second["id"]

    def test_concurrency_caps_the_jobs_running_on_a_computer(self, world, job_worker):
        box = gpu_computer(world.global_admin, "cpu-box", gpus=(), concurrency=2)
        for _ in range(3):
            create(world, box)
        a = job_worker.claim()
        b = job_worker.claim(active=[a["id"]])
        assert b is not None and job_worker.claim(active=[a["id"], b["id"]]) is None

    def test_a_lost_claim_answer_is_recovered_with_the_same_lease_never_a_second_job(self, world, gpu_box,
                                                                                     job_worker):
        create(world, gpu_box)
        create(world, gpu_box)
        first = job_worker.claim()
        replay = job_worker.claim(active=[])
        assert replay["id"] == first["id"] and replay["lease_id"] == first["lease_id"]
        assert bearer(replay["job_token"]).get("/api/auth/token").json()["kind"] == "job"
        assert_error(bearer(first["job_token"]).get("/api/auth/token"), 401), "the lost answer's token is ended"
        assert Job.objects.filter(status="claimed").count() == 1

    def test_active_job_ids_of_another_worker_are_refused(self, world, gpu_box, job_worker):
        create(world, gpu_box)
        item = job_worker.claim()
        other = JobWorker(world.worker_token, "lab-worker-2")
        other.hello()
        response = other.post("/api/worker/claim", {"active_job_ids": [item["id"]]})
        assert_error(response, 409, "unknown_active_jobs")

    def test_resume_returns_held_jobs_with_their_leases(self, world, gpu_box, job_worker):
        create(world, gpu_box)
        item = job_worker.claim()
        known = job_worker.post("/api/worker/resume", {"active_job_ids": [item["id"]]}).json()["items"]
        assert known[0]["lease_id"] == item["lease_id"] and known[0]["job_token"] is None
        unknown = job_worker.post("/api/worker/resume", {"active_job_ids": []}).json()["items"]
        assert unknown[0]["job_token"].startswith("mado_mtj_")

    def test_workers_only_get_jobs_of_computers_in_their_target_ids(self, world, gpu_box):
        other_box = gpu_computer(world.global_admin, "other-box")
        create(world, other_box)
        picky = JobWorker(world.worker_token, "picky", target_ids=[gpu_box.pk])
        picky.hello()
        assert picky.claim() is None
        create(world, gpu_box)
        assert picky.claim()["computer"]["id"] == gpu_box.pk

    def test_a_worker_serves_its_projects_jobs_where_its_service_account_may_run_them(self, world):
        """The seeds' rule: alice's worker (her own service account) runs the project's jobs on root's
        Public computer and on alice's Private one, never on root's Private one."""
        roots_public = gpu_computer(world.global_admin, "root-public", visibility="public")
        roots_private = gpu_computer(world.global_admin, "root-private", visibility="private")
        alices_private = gpu_computer(world.project_admin, "alice-private", visibility="private")
        public_job = create(world, roots_public)
        create(world, roots_private, user=world.global_admin)
        alices_job = create(world, alices_private, user=world.project_admin)
        token = world.token(world.alices_account.user, ["read", "worker:execute"], kind="service")
        worker = JobWorker(token, "alices-worker")
        worker.hello()
        assert worker.claim()["id"] == public_job["id"]
        assert worker.claim(active=[public_job["id"]])["id"] == alices_job["id"]
        assert worker.claim(active=[public_job["id"], alices_job["id"]]) is None, \
            "root's Private computer runs only root's and root's service accounts' jobs"


def test_the_unique_constraint_alone_rejects_a_second_reservation_of_a_gpu(world, gpu_box):
    a = create(world, gpu_box)
    b = create(world, gpu_box)
    GpuReservation.objects.create(target=gpu_box, gpu_id="0", job_id=a["id"])
    with pytest.raises(IntegrityError), transaction.atomic():
        GpuReservation.objects.create(target=gpu_box, gpu_id="0", job_id=b["id"])


class TestLeasedCalls:
    def test_the_first_running_heartbeat_starts_the_job_and_answers_cancel_requested(self, world, gpu_box,
                                                                                   job_worker):
        create(world, gpu_box)
        item = job_worker.claim()
        assert job_worker.heartbeat(item, "running").json() == {"cancel_requested": False, "status": "running"}
        assert Job.objects.get(pk=item["id"]).started_at is not None

    def test_logs_are_stored_once_in_order_even_when_resent(self, world, gpu_box, job_worker):
        create(world, gpu_box)
        item = job_worker.claim()
        chunks = [{"stream": "stdout", "offset": 0, "data": "epoch 1\n"},
                  {"stream": "stderr", "offset": 0, "data": "warning\n"},
                  {"stream": "stdout", "offset": 8, "data": "epoch 2\n"}]
        job_worker.leased(item, "logs", chunks=chunks)
        job_worker.leased(item, "logs", chunks=chunks[1:])
        body = session(world.viewer).get(f"/api/jobs/{item['id']}/logs").json()
        assert [(c["stream"], c["data"]) for c in body["items"]] == [
            ("stdout", "epoch 1\n"), ("stderr", "warning\n"), ("stdout", "epoch 2\n")]
        later = session(world.viewer).get(f"/api/jobs/{item['id']}/logs?after={body['next']}").json()
        assert later["items"] == []

    def test_metrics_must_be_finite_with_integer_steps(self, world, gpu_box, job_worker):
        create(world, gpu_box)
        item = job_worker.claim()
        ok = job_worker.leased(item, "metrics", metrics=[{"name": "loss", "value": 0.5, "step": 1}])
        assert ok.status_code == 200 and Metric.objects.count() == 1
        for bad in [{"name": "loss", "value": "NaN", "step": 1}, {"name": "loss", "value": 1.0, "step": -1},
                    {"name": "loss", "value": 1.0, "step": 1.5}, {"name": "", "value": 1.0}]:
            assert_error(job_worker.leased(item, "metrics", metrics=[bad]), 422, "invalid_metric")

    def test_a_wrong_lease_is_409(self, world, gpu_box, job_worker):
        create(world, gpu_box)
        item = job_worker.claim()
        wrong = {**item, "lease_id": "00000000-0000-0000-0000-000000000000"}
        assert_error(job_worker.heartbeat(wrong), 409, "invalid_lease")
        assert_error(job_worker.complete(wrong), 409, "invalid_lease")

    def test_completion_releases_gpus_revokes_the_token_and_is_idempotent(self, world, gpu_box, job_worker):
        create(world, gpu_box, gpu_ids=["0", "1"])
        item = job_worker.claim()
        assert_error(job_worker.complete(item, status="finished", exit_code=3), 422, "inconsistent_completion")
        assert job_worker.complete(item, status="failed", exit_code=3).status_code == 200
        assert not GpuReservation.objects.exists()
        assert "ended" in assert_error(bearer(item["job_token"]).get("/api/auth/token"), 401)["error"]
        assert job_worker.complete(item, status="failed", exit_code=3).status_code == 200
        assert_error(job_worker.complete(item, status="canceled", exit_code=None), 409, "job_already_completed")
        assert_error(job_worker.heartbeat(item), 409, "job_ended")
        job = Job.objects.get(pk=item["id"])
        assert job.status == "failed" and job.end_reason == "exit_code" and job.exit_code == 3
        assert AuditEvent.objects.filter(action="job.complete", object_id=str(job.pk)).exists()

    def test_a_job_whose_heartbeat_is_older_than_60_seconds_is_unresponsive_but_keeps_its_gpus(self, world, gpu_box,
                                                                                             job_worker):
        create(world, gpu_box, gpu_ids=["2"])
        item = job_worker.claim()
        Job.objects.filter(pk=item["id"]).update(heartbeat_at=timezone.now() - timedelta(seconds=61))
        body = session(world.viewer).get(f"/api/jobs/{item['id']}").json()
        assert body["unresponsive"] is True and body["status"] == "claimed"
        assert GpuReservation.objects.filter(job_id=item["id"]).exists()


class TestStop:
    def test_a_queued_job_stops_at_once(self, world, gpu_box):
        job = create(world, gpu_box)
        body = session(world.member).post(f"/api/jobs/{job['id']}/stop").json()
        assert body["status"] == "canceled"

    def test_a_running_job_gets_cancel_requested_and_ends_canceled(self, world, gpu_box, job_worker):
        job = create(world, gpu_box)
        item = job_worker.claim()
        job_worker.heartbeat(item, "running")
        session(world.project_admin).post(f"/api/jobs/{job['id']}/stop")
        assert job_worker.heartbeat(item).json()["cancel_requested"] is True
        job_worker.complete(item, status="canceled", exit_code=None)
        body = session(world.member).get(f"/api/jobs/{job['id']}").json()
        assert body["status"] == "canceled" and body["end_reason"] == "canceled"
        assert AuditEvent.objects.filter(action="job.stop_request").exists()

    def test_only_the_creator_and_project_admins_may_stop(self, world, gpu_box):
        job = create(world, gpu_box)
        assert_error(session(world.viewer).post(f"/api/jobs/{job['id']}/stop"), 403, "stop_forbidden")
        other_member = world.token(world.viewer, ["read"])
        assert_error(bearer(other_member).post(f"/api/jobs/{job['id']}/stop"), 403, "missing_scope")
        assert session(world.viewer).get(f"/api/jobs/{job['id']}").json()["can_stop"] is False
        assert_error(session(world.outsider).get(f"/api/jobs/{job['id']}"), 404)


class TestJobTokens:
    @pytest.fixture
    def running(self, world, gpu_box, job_worker):
        create(world, gpu_box)
        other = create(world, gpu_box)
        item = job_worker.claim()
        job_worker.heartbeat(item, "running")
        return item, other

    def test_a_job_token_writes_its_own_jobs_logs_and_metrics(self, world, running):
        item, _ = running
        client = bearer(item["job_token"])
        assert client.post(f"/api/jobs/{item['id']}/metrics", {"metrics": [{"name": "acc", "value": 0.9, "step": 2}]},
                           format="json").status_code == 200
        assert client.post(f"/api/jobs/{item['id']}/logs", {"chunks": [{"stream": "app", "offset": 0,
                                                                        "data": "hi"}]}, format="json").status_code == 200
        assert client.get(f"/api/jobs/{item['id']}").status_code == 200

    def test_the_jobs_own_logs_never_collide_with_the_workers_and_stored_counts_new_chunks(self, world, running,
                                                                                          job_worker):
        item, _ = running
        client = bearer(item["job_token"])
        assert_error(client.post(f"/api/jobs/{item['id']}/logs", {"chunks": [{"stream": "stdout", "offset": 0,
                                                                             "data": "forged"}]}, format="json"), 422)
        client.post(f"/api/jobs/{item['id']}/logs", {"chunks": [{"stream": "app", "offset": 0, "data": "hi"}]},
                    format="json")
        first = job_worker.leased(item, "logs", chunks=[{"stream": "stdout", "offset": 0, "data": "real\n"}])
        again = job_worker.leased(item, "logs", chunks=[{"stream": "stdout", "offset": 0, "data": "real\n"}])
        assert first.json() == {"stored": 1} and again.json() == {"stored": 0}
        texts = [c["data"] for c in session(world.viewer).get(f"/api/jobs/{item['id']}/logs").json()["items"]]
        assert texts == ["hi", "real\n"]

    def test_a_global_admins_job_token_does_not_act_as_a_global_admin(self, world, gpu_box, job_worker):
        create(world, gpu_box, user=world.global_admin)
        item = job_worker.claim()
        client = bearer(item["job_token"])
        body = client.get(f"/api/computers/{gpu_box.pk}").json()
        assert "host" not in body and body["manageable"] is False
        assert_error(client.get("/api/workers"), 403)

    def test_a_job_token_may_not_write_elsewhere(self, world, running):
        item, other = running
        client = bearer(item["job_token"])
        metric = {"metrics": [{"name": "acc", "value": 0.9, "step": 2}]}
        assert_error(client.post(f"/api/jobs/{other['id']}/metrics", metric, format="json"), 403,
                     "job_token_forbidden")
        assert_error(client.post(f"/api/jobs/{item['id']}/stop"), 403, "job_token_forbidden")
        assert_error(client.post("/api/projects/lab/tokens", {"scopes": ["read"]}, format="json"), 403,
                     "job_token_forbidden")
        assert_error(client.post("/api/worker/claim", {"worker_id": "x", "active_job_ids": []}, format="json"), 403)
        assert_error(client.post("/api/projects/lab/jobs", {}, format="json"), 403, "job_token_forbidden")

    def test_other_tokens_cannot_write_into_a_running_job(self, world, running):
        item, _ = running
        member_token = world.token(world.member, ["read", "jobs:write"])
        assert_error(bearer(member_token).post(f"/api/jobs/{item['id']}/metrics", {"metrics": []}, format="json"),
                     403, "job_token_required")

    def test_a_job_token_cannot_read_another_project(self, world, running):
        from tests.job_fixtures import gpu_computer as make

        item, _ = running
        from mado.models import Membership

        Membership.objects.create(project=world.other_project, user=world.member, role="member")
        box = make(world.global_admin, "other-project-box")
        elsewhere = session(world.member).post("/api/projects/other/jobs", job_request(box), format="json").json()
        assert_error(bearer(item["job_token"]).get(f"/api/jobs/{elsewhere['id']}"), 403, "job_token_forbidden")
        assert_error(bearer(item["job_token"]).post(f"/api/jobs/{elsewhere['id']}/metrics", {"metrics": []},
                                                   format="json"), 403, "job_token_forbidden")

    def test_after_completion_the_job_token_gets_401(self, world, running, job_worker):
        item, _ = running
        job_worker.complete(item)
        assert_error(bearer(item["job_token"]).post(f"/api/jobs/{item['id']}/metrics", {"metrics": []},
                                                   format="json"), 401)


def test_computer_settings_are_locked_while_a_job_is_queued(world, gpu_box):
    job = create(world, gpu_box)
    body = assert_error(session(world.global_admin).patch(f"/api/computers/{gpu_box.pk}", {"gpu_ids": ["0"]},
                                                          format="json"), 409, "computer_in_use")
    assert str(job["id"]) in body["error"]
    assert session(world.global_admin).patch(f"/api/computers/{gpu_box.pk}", {"enabled": False},
                                              format="json").status_code == 200


def test_log_chunks_resent_are_never_duplicated_by_the_database(world, gpu_box):
    job = Job.objects.get(pk=create(world, gpu_box)["id"])
    LogChunk.objects.create(job=job, stream="stdout", offset=0, data="a")
    with pytest.raises(IntegrityError), transaction.atomic():
        LogChunk.objects.create(job=job, stream="stdout", offset=0, data="a")



def test_the_jobs_list_costs_the_same_number_of_queries_for_5_and_45_jobs(world, gpu_box):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def count(path):
        with CaptureQueriesContext(connection) as ctx:
            assert session(world.viewer).get(path).status_code == 200
        return len(ctx.captured_queries)

    for _ in range(5):
        create(world, gpu_box)
    few_api, few_page = count("/api/projects/lab/jobs"), count("/projects/lab/jobs/")
    for _ in range(40):
        create(world, gpu_box)
    assert count("/api/projects/lab/jobs") == few_api
    assert count("/projects/lab/jobs/") == few_page


def test_the_jobs_list_pages_with_a_cursor(world, gpu_box, monkeypatch):
    from jobs import api

    monkeypatch.setattr(api, "JOB_PAGE", 3)
    ids = [create(world, gpu_box)["id"] for _ in range(5)]
    first = session(world.viewer).get("/api/projects/lab/jobs").json()
    assert [j["id"] for j in first["items"]] == ids[::-1][:3] and first["next"] == ids[2]
    second = session(world.viewer).get(f"/api/projects/lab/jobs?before={first['next']}").json()
    assert [j["id"] for j in second["items"]] == ids[1::-1] and second["next"] is None
