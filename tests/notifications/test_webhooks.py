"""Signed webhooks to a real HTTP receiver (http.server in a thread) that verifies X-Mado-Signature:
retries after 500s with the same idempotency key, and a burst of 100 failed jobs delivered in order,
exactly once each, also with two senders draining the rule at the same time."""
from __future__ import annotations

import threading

from django.db import connections

from jobs import services as job_services
from mado.services import Actor
from notifications import delivery, services
from notifications.models import Delivery
from tests.job_fixtures import JobWorker, gpu_computer, job_request
from tests.support import wait_for


def webhook_rule(world, receiver, events, **extra):
    rule, secret = services.create_rule(Actor(world.project_admin), world.project, name="hook", channel="webhook",
                                        events=events, webhook_url=receiver.url, **extra)
    assert secret.startswith("mws_") and len(secret) > 40
    receiver.secret = secret
    return rule


def fail_jobs(world, target, count: int) -> list[int]:
    worker = JobWorker(world.worker_token)
    assert worker.hello().status_code == 200
    ids = []
    for n in range(count):
        job = job_services.create_job(Actor(world.member), world.project, job_request(target, name=f"run-{n:03d}"))
        item = worker.claim()
        assert item["id"] == job.pk
        assert worker.heartbeat(item, status="running").status_code == 200
        assert worker.complete(item, status="failed", exit_code=1, error=f"boom {n}").status_code == 200
        ids.append(job.pk)
    return ids


def test_a_receiver_that_answers_500_twice_gets_the_event_exactly_once_signed(
        transactional_db, world, receiver, settings):
    settings.NOTIFICATION_RETRY_BASE_SECONDS = 0.2
    hook = receiver(answers=[500, 500])
    rule = webhook_rule(world, hook, ["job.failed"])
    [job_id] = fail_jobs(world, gpu_computer(world.global_admin), 1)

    wait_for(lambda: delivery.deliver_due() is not None and len(hook.accepted) == 1, timeout=20,
             what="the third attempt to be accepted")
    for _ in range(3):
        delivery.deliver_due()  # nothing left to send
    assert [r["payload"]["job"]["id"] for r in hook.requests] == [job_id] * 3
    assert all(r["signed"] for r in hook.requests) and hook.bad_signatures == 0
    keys = {r["payload"]["id"] for r in hook.requests}
    assert len(keys) == 1, "a retry carries the same idempotency key"
    assert {r["headers"]["X-Mado-Delivery"] for r in hook.requests} == keys
    assert hook.requests[0]["headers"]["X-Mado-Event"] == "job.failed"
    payload = hook.accepted[0]
    assert payload["event"] == "job.failed" and payload["job"]["error"] == "boom 0"
    assert payload["job"]["exit_code"] == 1 and payload["project"]["slug"] == "lab"
    assert payload["url"].endswith(f"/projects/lab/jobs/{job_id}/")
    sent = Delivery.objects.get(rule=rule)
    assert (sent.status, sent.attempts, sent.last_error) == ("delivered", 3, "")


def test_a_burst_of_100_failed_jobs_reaches_the_webhook_in_order_exactly_once_each(
        transactional_db, world, receiver):
    hook = receiver()
    webhook_rule(world, hook, ["job.failed"])
    ids = fail_jobs(world, gpu_computer(world.global_admin), 100)
    assert Delivery.objects.count() == 100

    # Two senders at once (as two periodic runners would be): the rule's lock lets one send at a time.
    def drain():
        try:
            while delivery.drain_rule(Delivery.objects.first().rule_id):
                pass
        finally:
            connections.close_all()

    senders = [threading.Thread(target=drain) for _ in range(2)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(60)
    wait_for(lambda: delivery.deliver_due() is not None and len(hook.accepted) >= 100, timeout=60,
             what="100 deliveries")
    received = [p["job"]["id"] for p in hook.accepted]
    assert received == ids, "out of order, lost or repeated"
    assert len({p["id"] for p in hook.accepted}) == 100
    assert len(hook.requests) == 100 and hook.bad_signatures == 0
    assert set(Delivery.objects.values_list("status", flat=True)) == {"delivered"}


def test_a_member_rule_hears_only_about_their_own_jobs(transactional_db, world, smtp_server):
    world.member.email = "bob@example.org"
    world.member.save()
    services.create_rule(Actor(world.member), world.project, name="mine", channel="email",
                         events=["job.failed"], email_to="someone-else@example.org")
    target = gpu_computer(world.global_admin)
    worker = JobWorker(world.worker_token)
    worker.hello()
    for creator in (world.member, world.project_admin):
        job_services.create_job(Actor(creator), world.project, job_request(target))
        item = worker.claim()
        worker.heartbeat(item, status="running")
        worker.complete(item, status="failed", exit_code=2)
    [only] = Delivery.objects.all()
    assert only.payload["job"]["created_by"] == "bob"
    assert only.rule.email_to == "bob@example.org", "a member's rule mails the member only"
    delivery.deliver_due()
    mail = wait_for(lambda: smtp_server.messages, what="the mail")[0]
    assert mail["To"] == "bob@example.org" and "failed" in mail["Subject"]
