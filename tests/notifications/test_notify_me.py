"""“Notify me when it ends” on the Create job form (and `notify_me` in the jobs API): the creator gets one
e-mail, through a real SMTP server, when that Job finishes or fails — none for a Job without the box,
none for another person's Job; an account without an e-mail address is refused with what to do."""
from __future__ import annotations

from django.test import Client

from jobs.models import Job
from notifications import delivery
from notifications.models import NotificationRule
from tests.conftest import assert_error
from tests.job_fixtures import JobWorker, gpu_computer, job_request


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def create_on_form(user, target, name: str, *, notify: bool):
    form = {"name": name, "computer": str(target.pk), "runtime": "python", "command": "python train.py",
            "parameters": "{}", "cluster_size": "1", "cluster_mode": "single-node"}
    if notify:
        form["notify_me"] = "on"
    return signed_in(user).post("/projects/lab/jobs/new", form)


def run_to_the_end(worker: JobWorker, status: str, exit_code: int) -> None:
    item = worker.claim()
    assert item is not None
    assert worker.heartbeat(item, status="running").status_code == 200
    assert worker.complete(item, status=status, exit_code=exit_code).status_code == 200


def test_the_creator_who_ticked_the_box_gets_one_mail_when_the_job_ends(transactional_db, world, smtp_server):
    for user, address in ((world.member, "bob@example.org"), (world.project_admin, "alice@example.org")):
        user.email = address
        user.save()
    target = gpu_computer(world.global_admin, concurrency=1)
    worker = JobWorker(world.worker_token, "lab-worker-1")
    assert worker.hello().status_code == 200

    page = signed_in(world.member).get("/projects/lab/jobs/new")
    assert b'name="notify_me"' in page.content and b"Notify me when it ends" in page.content
    for user, name, notify in ((world.member, "bobs-ticked", True), (world.member, "bobs-plain", False),
                               (world.project_admin, "alices-ticked", True)):
        answer = create_on_form(user, target, name, notify=notify)
        assert answer.status_code == 302, answer.content
    # One job at a time (concurrency 1), oldest first: bob's ticked one fails, the others finish.
    run_to_the_end(worker, "failed", 3)
    run_to_the_end(worker, "finished", 0)
    run_to_the_end(worker, "finished", 0)
    assert set(Job.objects.values_list("name", "status")) == {
        ("bobs-ticked", "failed"), ("bobs-plain", "finished"), ("alices-ticked", "finished")}

    delivery.deliver_due()  # what the periodic runner's notifications.deliver does

    to_bob = [m for m in smtp_server.messages if m["To"] == "bob@example.org"]
    to_alice = [m for m in smtp_server.messages if m["To"] == "alice@example.org"]
    assert len(smtp_server.messages) == 2, [m["Subject"] for m in smtp_server.messages]
    assert len(to_bob) == 1 and "Job bobs-ticked failed" in to_bob[0]["Subject"]
    assert "Exit code: 3" in to_bob[0].get_content()
    assert len(to_alice) == 1 and "Job alices-ticked finished" in to_alice[0]["Subject"]
    ticked = Job.objects.get(name="bobs-ticked")
    rule = NotificationRule.objects.get(job=ticked)
    assert (rule.created_by, rule.email_to, sorted(rule.events)) == (
        world.member, "bob@example.org", ["job.failed", "job.finished"])
    assert rule.deliveries.get().status == "delivered"


def test_without_an_e_mail_address_the_box_is_refused_and_no_job_is_created(world):
    target = gpu_computer(world.global_admin)
    answer = create_on_form(world.member, target, "unmailable", notify=True)
    assert answer.status_code == 200
    assert b"Add an e-mail address to your account first" in answer.content
    assert not Job.objects.exists() and not NotificationRule.objects.exists()
    # Unticked, the same job is created.
    assert create_on_form(world.member, target, "unmailable", notify=False).status_code == 302


def test_the_api_takes_notify_me_and_refuses_what_is_not_a_boolean(world, api):
    world.member.email = "bob@example.org"
    world.member.save()
    target = gpu_computer(world.global_admin)
    client = api(world.token(world.member, ["read", "jobs:write"]))
    answer = client.post("/api/projects/lab/jobs", job_request(target, notify_me=True), format="json")
    assert answer.status_code == 201, answer.content
    rule = NotificationRule.objects.get()
    assert rule.job_id == answer.json()["id"] and rule.email_to == "bob@example.org"
    refused = client.post("/api/projects/lab/jobs", job_request(target, notify_me="yes"), format="json")
    assert_error(refused, 422, "invalid")
    assert Job.objects.count() == 1
    plain = client.post("/api/projects/lab/jobs", job_request(target), format="json")
    assert plain.status_code == 201 and NotificationRule.objects.count() == 1
