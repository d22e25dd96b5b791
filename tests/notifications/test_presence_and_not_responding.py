"""The periodic rules that record a transition once: a flapping worker announces one offline and one
online per flap; a silent job is announced Not responding once per silence; the registry runs each task
under its advisory lock, so a second runner skips a task the first holds."""
from __future__ import annotations

from datetime import timedelta
from io import StringIO

from django.core.management import call_command
from django.db import connections
from django.utils import timezone

from jobs import services as job_services
from jobs.models import Job
from mado import periodic
from mado.models import AuditEvent
from mado.services import Actor
from notifications import services
from notifications.models import Delivery
from tests.job_fixtures import JobWorker, gpu_computer, job_request
from workers import services as worker_services
from workers.models import Worker


def test_a_flapping_worker_announces_one_offline_and_one_online_per_flap(world):
    services.create_rule(Actor(world.project_admin), world.project, name="flaps", channel="email",
                         events=["worker.offline", "worker.online"], email_to="ops@example.org")
    worker = JobWorker(world.worker_token, "flappy")
    worker.hello()
    for _ in range(3):  # three flaps, each swept many times
        Worker.objects.filter(worker_id="flappy").update(last_seen_at=timezone.now() - timedelta(seconds=121))
        for _ in range(4):
            worker_services.sweep_presence()
        worker.hello()
        for _ in range(4):
            worker_services.sweep_presence()
    events = list(Delivery.objects.order_by("id").values_list("event", flat=True))
    assert events == ["worker.offline", "worker.online"] * 3


def test_a_worker_seen_within_the_window_is_not_announced(world):
    services.create_rule(Actor(world.project_admin), world.project, name="quiet", channel="email",
                         events=["worker.offline"], email_to="ops@example.org")
    JobWorker(world.worker_token, "steady").hello()
    Worker.objects.filter(worker_id="steady").update(last_seen_at=timezone.now() - timedelta(seconds=100))
    assert worker_services.sweep_presence() == []
    assert not Delivery.objects.exists()


def test_a_silent_job_is_announced_not_responding_once_per_silence(world):
    target = gpu_computer(world.global_admin)
    services.create_rule(Actor(world.project_admin), world.project, name="stuck", channel="email",
                         events=["job.not_responding"], email_to="ops@example.org")
    job = job_services.create_job(Actor(world.member), world.project, job_request(target))
    worker = JobWorker(world.worker_token)
    worker.hello()
    item = worker.claim()
    assert worker.heartbeat(item, status="running").status_code == 200
    Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=61))
    assert job_services.report_unresponsive() == [job.pk]
    assert job_services.report_unresponsive() == []
    assert worker.heartbeat(item, status="running").status_code == 200  # it recovers …
    assert job_services.report_unresponsive() == []
    # … and goes quiet again: time moves on for both the first report and the recovery heartbeat.
    Job.objects.filter(pk=job.pk).update(unresponsive_reported_at=timezone.now() - timedelta(seconds=120),
                                         heartbeat_at=timezone.now() - timedelta(seconds=90))
    assert job_services.report_unresponsive() == [job.pk]
    assert AuditEvent.objects.filter(action="job.not_responding", object_id=str(job.pk)).count() == 2
    assert Delivery.objects.filter(event="job.not_responding").count() == 2


def test_every_app_registers_its_rule_and_once_runs_them_all(world):
    names = {task.name for task in periodic.tasks()}
    assert {"workers.presence", "jobs.not_responding", "jobs.requeue_unstarted", "computers.expire_stale",
            "notifications.deliver"} <= names
    out = StringIO()
    call_command("mado_periodic", "--once", stdout=out)
    assert f"Ran {len(names)} of {len(names)} tasks" in out.getvalue()


def test_a_task_held_by_another_runner_is_skipped(transactional_db):
    task = periodic.Task("test.held", lambda: ran.append(1), every_seconds=1)
    ran: list[int] = []
    other = connections.create_connection("default")  # a second runner's session
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [task.lock_key])
        assert periodic.run_task(task) is False and ran == []
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [task.lock_key])
        assert periodic.run_task(task) is True and ran == [1]
    finally:
        other.close()


def test_a_failing_task_does_not_stop_the_others(transactional_db):
    def broken():
        raise RuntimeError("boom")

    ran = []
    assert periodic.run_task(periodic.Task("test.broken", broken, every_seconds=1)) is True
    assert periodic.run_task(periodic.Task("test.fine", lambda: ran.append(1), every_seconds=1)) is True
    assert ran == [1]


def test_an_expired_check_and_a_canceled_job_reach_the_rules_that_ask_for_them(world):
    from computers import services as computer_services
    from computers.models import ConnectionCheck

    public = gpu_computer(world.global_admin, name="public-box")
    private_elsewhere = gpu_computer(world.outsider, name="mallorys-box", visibility="private")
    services.create_rule(Actor(world.project_admin), world.project, name="checks", channel="email",
                         events=["check.failed"], email_to="ops@example.org")
    services.create_rule(Actor(world.project_admin), world.project, name="cancels", channel="email",
                         events=["job.canceled"], email_to="ops@example.org", computer=public)
    old = timezone.now() - timedelta(minutes=6)
    for target in (public, private_elsewhere):
        check = ConnectionCheck.objects.create(target=target, requested_by=target.owner)
        ConnectionCheck.objects.filter(pk=check.pk).update(created_at=old)
    computer_services.expire_stale(force=True)  # the periodic rule: both end as expired
    job = job_services.create_job(Actor(world.member), world.project, job_request(public))
    job_services.request_stop(Actor(world.member), job)  # queued: canceled at once
    sent = sorted((d.rule.name, d.event, d.payload.get("computer", d.payload.get("job", {})).get("name"))
                  for d in Delivery.objects.select_related("rule"))
    # The private computer of someone outside the project is not this project's business.
    assert sent == [("cancels", "job.canceled", job.display_name), ("checks", "check.failed", "public-box")]
