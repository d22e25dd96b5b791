"""Seed 001's `worker.offline` rule end to end: a real SMTP server (aiosmtpd), the live server taking
the worker's hello over HTTP, and the periodic runner as its own process. The worker's silence is made
by moving its last hello back in the database (the product's window stays 120 s)."""
from __future__ import annotations

import time
from datetime import timedelta

import requests
from django.utils import timezone

from mado.models import AuditEvent
from mado.services import Actor
from notifications import services
from notifications.models import Delivery
from tests.support import wait_for
from workers.models import Worker


def hello(live_server, token: str):
    answer = requests.post(f"{live_server.url}/api/worker/hello", timeout=10, json={
        "worker_id": "gpu-box-worker", "version": "0.1.0", "hostname": "gpu-box", "parallel_jobs": 2},
        headers={"Authorization": f"Bearer {token}", "Connection": "close"})
    assert answer.status_code == 200, answer.text


def test_the_worker_offline_mail_arrives_within_150_s_of_the_last_hello_and_the_online_mail_after_it_returns(
        transactional_db, live_server, world, smtp_server, periodic_process):
    services.create_rule(Actor(world.project_admin), world.project, name="GPU box down", channel="email",
                         events=["worker.offline", "worker.online"], email_to="ops@example.org, lab@example.org",
                         language="en")
    hello(live_server, world.worker_token)
    worker = Worker.objects.get(worker_id="gpu-box-worker")
    runner = periodic_process(MADO_EMAIL_HOST="127.0.0.1", MADO_EMAIL_PORT=smtp_server.port,
                              MADO_PUBLIC_URL="https://mado.example.org")
    # Django's start-up in the runner process is not the rule's time: wait until its loop runs.
    wait_for(lambda: "Periodic runner started" in runner.output(), timeout=60, what="the periodic runner to start")
    # The last hello was 121 s ago: one second past the window.
    last_hello = timezone.now() - timedelta(seconds=121)
    Worker.objects.filter(pk=worker.pk).update(last_seen_at=last_hello)
    started = time.monotonic()

    mails = wait_for(lambda: smtp_server.with_subject("is offline"), timeout=150 - 121,
                     what=f"the worker.offline mail (runner said: {runner.output()[-2000:]})")
    assert time.monotonic() - started <= 150 - 121
    mail = mails[0]
    assert mail["Subject"] == "[Mado] Worker gpu-box-worker is offline"
    assert set(a.strip() for a in mail["To"].split(",")) == {"ops@example.org", "lab@example.org"}
    text = mail.get_content()
    assert "gpu-box" in text and "has not been seen since" in text
    assert "https://mado.example.org/projects/lab/compute/" in text  # a link to the worker's page

    hello(live_server, world.worker_token)  # it comes back
    back = wait_for(lambda: smtp_server.with_subject("back online"), timeout=30,
                    what=f"the worker.online mail (runner said: {runner.output()[-2000:]})")
    assert back[0]["Subject"] == "[Mado] Worker gpu-box-worker is back online"
    # Many sweeps ran between the two mails: each transition was announced once.
    assert len(smtp_server.with_subject("is offline")) == 1
    assert AuditEvent.objects.filter(action="worker.offline", object_id=str(worker.pk)).count() == 1
    assert AuditEvent.objects.filter(action="worker.online", object_id=str(worker.pk)).count() == 1
    # The runner records the delivery after the SMTP server took the mail: wait for that write.
    expected = [("worker.offline", "delivered"), ("worker.online", "delivered")]
    wait_for(lambda: sorted(Delivery.objects.values_list("event", "status")) == expected, timeout=30,
             what=f"both deliveries recorded as delivered (now {list(Delivery.objects.values_list('event', 'status'))})")
    assert "Traceback" not in runner.output()


def test_the_mail_is_in_the_rules_language(transactional_db, world, smtp_server):
    from notifications import delivery
    from workers import services as worker_services

    services.create_rule(Actor(world.project_admin), world.project, name="落ちた", channel="email",
                         events=["worker.offline"], email_to="ops@example.org", language="ja")
    from tests.job_fixtures import JobWorker

    JobWorker(world.worker_token, "w-ja").hello()
    Worker.objects.filter(worker_id="w-ja").update(last_seen_at=timezone.now() - timedelta(minutes=5))
    worker_services.sweep_presence()
    delivery.deliver_due()
    mail = wait_for(lambda: smtp_server.messages, what="the mail")[0]
    from django.utils.translation import gettext, override

    with override("ja"):
        expected = gettext("Worker %(worker)s is offline") % {"worker": "w-ja"}
    assert mail["Subject"] == f"[Mado] {expected}"
    with override("ja"):
        assert gettext("Open: %(url)s") % {"url": ""} in mail.get_content()
