"""A worker is a row of its service account (issue 13): a name another service account says is another
worker, and nothing meant for one goes to the other. Plus the claim path's ends: claims that nobody
runs go back to the queue, a stopping worker drains, a job's end wakes a waiting claim with a plain
answer, and a Project admin may mark a Not responding job as lost."""
from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from rest_framework.test import APIClient

from jobs import services as job_services
from jobs.models import GpuReservation, Job, JobEvent
from mado import services
from mado.choices import Role, TokenKind
from mado.models import AuditEvent, JobToken
from tests.computer_fixtures import ScriptedWorker, make_computer
from tests.conftest import WORKER_SCOPES, assert_error
from tests.job_fixtures import JobWorker, gpu_computer, job_request
from workers.models import Worker


def session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def foreign_worker_token(world) -> str:
    """A worker token of project `other`, whose admin (mallory) set up its service account."""
    account = services.create_service_account(services.Actor(world.outsider), world.other_project,
                                              name="borrower", role=Role.ADMIN)
    return world.token(account.user, WORKER_SCOPES, project=world.other_project, kind=TokenKind.SERVICE)


class TestBorrowedName:
    def test_a_worker_saying_anothers_name_gets_neither_its_check_nor_its_read(self, world):
        computer = make_computer(world.global_admin, "shared-gpu", visibility="public")
        admins = ScriptedWorker(world.worker_token, "wa")
        admins.hello(hostname="admin-host")
        borrower = ScriptedWorker(foreign_worker_token(world), "wa")
        borrower.hello(hostname="borrower-host")  # said last: the most recently seen "wa"
        rows = {w.project.slug: w for w in Worker.objects.filter(worker_id="wa").select_related("project")}
        assert set(rows) == {"lab", "other"}, "the same name from another service account is another worker"
        ours = rows["lab"]

        admin = session(world.global_admin)
        check = admin.post(f"/api/computers/{computer.pk}/checks", {"worker": ours.pk}, format="json")
        assert check.status_code == 201, check.content
        assert check.json()["requested_worker_id"] == ours.pk
        read = admin.post(f"/api/computers/{computer.pk}/reads", {"worker": ours.pk, "path": "/data/"}, format="json")
        assert read.status_code == 201, read.content

        assert borrower.claim_check() is None, "the borrowed name must not receive the check (host, user, key paths)"
        assert borrower.claim_read() is None, "nor the directory read"
        assert admins.claim_check()["id"] == check.json()["id"]
        assert admins.claim_read()["id"] == read.json()["id"]

    def test_a_bare_name_two_workers_share_is_refused_rather_than_guessed(self, world):
        computer = make_computer(world.global_admin, "shared-gpu", visibility="public")
        ScriptedWorker(world.worker_token, "wa").hello()
        ScriptedWorker(foreign_worker_token(world), "wa").hello()
        body = assert_error(session(world.global_admin).post(f"/api/computers/{computer.pk}/checks",
                                                             {"worker_id": "wa"}, format="json"), 400)
        assert "More than one online worker is named wa" in body["error"] and "lab" in body["error"]

    def test_the_next_check_follows_the_last_check_worker_row_not_its_name(self, world):
        computer = make_computer(world.global_admin, "shared-gpu", visibility="public")
        admins = ScriptedWorker(world.worker_token, "wa")
        admins.hello()
        admin = session(world.global_admin)
        ours = Worker.objects.get(worker_id="wa")
        admin.post(f"/api/computers/{computer.pk}/checks", {"worker": ours.pk}, format="json")
        admins.complete_check(admins.claim_check())
        borrower = ScriptedWorker(foreign_worker_token(world), "wa", target_ids=[computer.pk])
        borrower.hello()
        # An unnamed check goes to the last check worker: the row, whatever else says its name.
        second = admin.post(f"/api/computers/{computer.pk}/checks", {}, format="json").json()
        assert second["requested_worker_id"] == ours.pk
        assert borrower.claim_check() is None
        assert admins.claim_check()["id"] == second["id"]

    def test_the_dialog_lists_both_workers_apart_with_project_and_host(self, world):
        ScriptedWorker(world.worker_token, "wa").hello(hostname="admin-host")
        ScriptedWorker(foreign_worker_token(world), "wa").hello(hostname="borrower-host")
        page = session(world.global_admin).get("/settings/computers/new?kind=ssh").content.decode()
        assert "wa (lab, admin-host)" in page and "wa (other, borrower-host)" in page

    def test_a_new_token_of_the_same_service_account_keeps_the_worker(self, world):
        computer = make_computer(world.global_admin, "shared-gpu", visibility="public")
        ScriptedWorker(world.worker_token, "wa").hello()
        ours = Worker.objects.get(worker_id="wa")
        session(world.global_admin).post(f"/api/computers/{computer.pk}/checks", {"worker": ours.pk}, format="json")
        rotated = world.token(world.service_account.user, WORKER_SCOPES, kind=TokenKind.SERVICE)
        reinstalled = ScriptedWorker(rotated, "wa")
        reinstalled.hello()
        assert Worker.objects.filter(worker_id="wa").count() == 1, "reinstalling with a new token is the same worker"
        assert reinstalled.claim_check() is not None, "and it takes what was asked of it"


class TestClaimsNobodyRuns:
    def test_a_claimed_job_without_heartbeat_for_60_s_goes_back_to_the_queue(self, world):
        box = gpu_computer(world.global_admin, "box", visibility="public")
        first = JobWorker(world.worker_token, "gone")
        first.hello()
        session(world.member).post("/api/projects/lab/jobs", job_request(box, gpu_ids=["0"]), format="json")
        item = first.claim()
        assert GpuReservation.objects.filter(job_id=item["id"]).exists()
        Job.objects.filter(pk=item["id"]).update(heartbeat_at=timezone.now() - timedelta(seconds=59))
        assert job_services.requeue_unstarted(force=True) == [], "59 s is not yet gone"
        Job.objects.filter(pk=item["id"]).update(heartbeat_at=timezone.now() - timedelta(seconds=61))
        assert job_services.requeue_unstarted(force=True) == [item["id"]]

        job = Job.objects.get(pk=item["id"])
        assert job.status == "queued" and job.worker is None and job.lease_id is None
        assert not GpuReservation.objects.filter(job_id=job.pk).exists(), "its GPUs are free again"
        assert JobToken.objects.filter(job_id=job.pk, revoked_at__isnull=True).count() == 0
        assert AuditEvent.objects.filter(action="job.requeue", object_id=str(job.pk)).exists()
        assert "never started it" in JobEvent.objects.filter(job=job, kind="requeued").get().message
        assert first.heartbeat(item).status_code == 409, "the old lease is gone: it can never start the job"
        second = JobWorker(world.worker_token, "second")
        second.hello()
        assert second.claim()["id"] == job.pk

    def test_a_job_that_started_is_never_requeued(self, world):
        box = gpu_computer(world.global_admin, "box", visibility="public")
        worker = JobWorker(world.worker_token)
        worker.hello()
        session(world.member).post("/api/projects/lab/jobs", job_request(box), format="json")
        item = worker.claim()
        worker.heartbeat(item, "running")
        Job.objects.filter(pk=item["id"]).update(heartbeat_at=timezone.now() - timedelta(minutes=10))
        assert job_services.requeue_unstarted(force=True) == []
        assert Job.objects.get(pk=item["id"]).status == "running"

    def test_a_worker_saying_goodbye_releases_what_it_never_started_and_takes_nothing_more(self, world):
        box = gpu_computer(world.global_admin, "box", visibility="public")
        worker = JobWorker(world.worker_token, "stopping")
        worker.hello()
        for _ in range(3):
            session(world.member).post("/api/projects/lab/jobs", job_request(box), format="json")
        running = worker.claim()
        worker.heartbeat(running, "running")
        claimed = worker.claim(active=[running["id"]])
        answer = worker.post("/api/worker/goodbye", {})
        assert answer.status_code == 200 and answer.json()["released_job_ids"] == [claimed["id"]]
        assert Job.objects.get(pk=claimed["id"]).status == "queued"
        assert Job.objects.get(pk=running["id"]).status == "running", "a running job stays the worker's"
        assert not Worker.objects.get(worker_id="stopping").is_online
        assert worker.claim(active=[running["id"]]) is None, "a stopped worker is handed nothing"
        worker.hello()
        assert worker.claim(active=[running["id"]]) is not None, "its next hello brings it back"


class TestWakeUp:
    def test_a_job_ending_answers_a_waiting_claim_with_200_and_a_reason(self, world):
        box = gpu_computer(world.global_admin, "box", visibility="public")
        worker = JobWorker(world.worker_token)
        worker.hello()
        session(world.member).post("/api/projects/lab/jobs", job_request(box), format="json")
        item = worker.claim()
        worker.heartbeat(item, "running")
        worker.complete(item)
        response = worker.post("/api/worker/claim", {"active_job_ids": [item["id"]], "wait": 0})
        assert response.status_code == 200, response.content
        assert response.json() == {"item": None, "reason": "active_jobs_ended", "ended_job_ids": [item["id"]]}
        assert response["Cache-Control"] == "no-store"

    def test_a_job_this_worker_never_held_is_still_a_conflict(self, world):
        box = gpu_computer(world.global_admin, "box", visibility="public")
        worker = JobWorker(world.worker_token)
        worker.hello()
        other = session(world.member).post("/api/projects/lab/jobs", job_request(box), format="json").json()
        response = worker.post("/api/worker/claim", {"active_job_ids": [other["id"]], "wait": 0})
        assert_error(response, 409, "unknown_active_jobs")


class TestMarkAsLost:
    def claimed(self, world, *, silent_for: int):
        box = gpu_computer(world.global_admin, "box", visibility="public")
        worker = JobWorker(world.worker_token)
        worker.hello()
        session(world.member).post("/api/projects/lab/jobs", job_request(box, gpu_ids=["1"]), format="json")
        item = worker.claim()
        worker.heartbeat(item, "running")
        Job.objects.filter(pk=item["id"]).update(heartbeat_at=timezone.now() - timedelta(seconds=silent_for))
        return item["id"]

    def test_a_project_admin_marks_a_not_responding_job_as_lost(self, world):
        job_id = self.claimed(world, silent_for=90)
        response = session(world.project_admin).post(f"/api/jobs/{job_id}/lost")
        assert response.status_code == 200, response.content
        job = Job.objects.get(pk=job_id)
        assert (job.status, job.end_reason) == ("failed", "worker_lost")
        assert "may still be running" in job.error
        assert not GpuReservation.objects.filter(job_id=job_id).exists()
        assert AuditEvent.objects.filter(action="job.mark_lost", object_id=str(job_id)).exists()

    def test_members_may_not_and_a_responding_job_cannot_be_marked(self, world):
        job_id = self.claimed(world, silent_for=90)
        assert_error(session(world.member).post(f"/api/jobs/{job_id}/lost"), 403, "project_admin_required")
        Job.objects.filter(pk=job_id).update(heartbeat_at=timezone.now())
        assert_error(session(world.project_admin).post(f"/api/jobs/{job_id}/lost"), 409, "job_responding")
        assert Job.objects.get(pk=job_id).status == "running"
        assert GpuReservation.objects.filter(job_id=job_id).exists(), "GPUs are never released automatically"
