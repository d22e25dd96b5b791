"""What goes wrong is logged on the delivery with what to fix, never a 500, and holds nothing else up:
a webhook URL that is not http(s), an unreachable host, a receiver that never answers, an SMTP server
that refuses, an SMTP server that is not there."""
from __future__ import annotations

import pytest
from django.test import Client

from mado.errors import ServiceError
from mado.services import Actor
from notifications import delivery, services
from notifications.models import Delivery, NotificationRule
from tests.notifications.conftest import free_port
from tests.support import wait_for


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize("url", ["ftp://example.org/hook", "file:///etc/passwd", "javascript:alert(1)",
                                 "example.org/hook", "http://", "https://exa mple.org/", "http://host:99999/"])
def test_a_webhook_url_that_is_not_http_is_refused_on_the_form_with_what_to_fix(world, url):
    with pytest.raises(ServiceError) as refused:
        services.create_rule(Actor(world.project_admin), world.project, name="x", channel="webhook",
                             events=["job.failed"], webhook_url=url)
    assert "webhook_url" in refused.value.fields
    answer = signed_in(world.project_admin).post("/projects/lab/settings/notifications/new", {
        "name": "x", "events": ["job.failed"], "channel": "webhook", "webhook_url": url, "language": "en"})
    assert answer.status_code == 200
    assert b"http" in answer.content and b"invalid" in answer.content
    assert not NotificationRule.objects.exists()


def test_an_unreachable_host_is_logged_on_send_test_and_the_page_answers(transactional_db, world):
    port = free_port()  # nothing listens there
    rule, _ = services.create_rule(Actor(world.project_admin), world.project, name="gone", channel="webhook",
                                   events=["job.failed"], webhook_url=f"http://127.0.0.1:{port}/hook?key=s3cret")
    answer = signed_in(world.project_admin).post(f"/projects/lab/settings/notifications/{rule.pk}/test",
                                                 HTTP_HX_REQUEST="true")
    assert answer.status_code == 200
    sent = Delivery.objects.get(rule=rule)
    assert sent.status == "failed" and sent.attempts == 1
    assert f"Could not connect to 127.0.0.1:{port}" in sent.last_error and "check the URL" in sent.last_error
    assert "s3cret" not in sent.last_error and "s3cret" not in answer.content.decode()
    assert "Could not connect" in answer.content.decode()


def test_a_receiver_that_never_answers_times_out_and_holds_no_other_rule_up(
        transactional_db, world, silent_port, receiver, settings):
    settings.NOTIFICATION_WEBHOOK_TIMEOUT_SECONDS = 2
    hung, _ = services.create_rule(Actor(world.project_admin), world.project, name="hung", channel="webhook",
                                   events=["worker.offline"], webhook_url=f"http://127.0.0.1:{silent_port}/")
    hook = receiver()
    healthy, hook.secret = services.create_rule(Actor(world.project_admin), world.project, name="ok",
                                                channel="webhook", events=["worker.offline"], webhook_url=hook.url)
    _offline_event(world)
    assert Delivery.objects.count() == 2
    delivery.deliver_due(wait=False)  # as the periodic loop does
    wait_for(lambda: hook.accepted, timeout=5, what="the healthy receiver's delivery")
    stuck = Delivery.objects.get(rule=hung)
    assert stuck.attempts == 0, "the healthy rule waited for the hung one"
    stuck = wait_for(lambda: (d := Delivery.objects.get(rule=hung)).attempts == 1 and d, timeout=10,
                     what="the hung receiver's timeout")
    assert stuck.status == "pending" and stuck.next_attempt_at is not None  # retried later, with backoff
    assert "did not answer within 2 s" in stuck.last_error
    assert Delivery.objects.get(rule=healthy).status == "delivered"


def test_an_smtp_server_that_refuses_the_recipients_is_logged_and_given_up(transactional_db, world, smtp_server):
    smtp_server.refuse_recipients = True
    rule, _ = services.create_rule(Actor(world.project_admin), world.project, name="mail", channel="email",
                                   events=["worker.offline"], email_to="nobody@example.org")
    sent = services.send_test(Actor(world.project_admin), rule)
    assert sent.status == "failed"
    assert "refused the recipients (550)" in sent.last_error and "addresses" in sent.last_error
    _offline_event(world)
    delivery.deliver_due()
    event = Delivery.objects.get(rule=rule, event="worker.offline")
    assert event.status == "failed" and event.attempts == 1, "a 5xx refusal is not retried"
    assert not smtp_server.messages


def test_an_smtp_server_that_is_not_there_is_retried_with_what_to_fix(transactional_db, world, settings):
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", free_port()
    rule, _ = services.create_rule(Actor(world.project_admin), world.project, name="mail", channel="email",
                                   events=["worker.offline"], email_to="ops@example.org")
    _offline_event(world)
    delivery.deliver_due()
    event = Delivery.objects.get(rule=rule)
    assert event.status == "pending" and event.attempts == 1 and event.next_attempt_at > event.created_at
    assert "MADO_EMAIL_HOST and MADO_EMAIL_PORT" in event.last_error


def test_member_rules_are_limited_to_their_own_jobs_by_mail_and_viewers_get_none(world):
    world.member.email = "bob@example.org"
    world.member.save()
    with pytest.raises(ServiceError) as refused:
        services.create_rule(Actor(world.member), world.project, name="x", channel="webhook",
                             events=["job.failed"], webhook_url="https://example.org/")
    assert refused.value.code == "rule_admin_required"
    with pytest.raises(ServiceError):
        services.create_rule(Actor(world.member), world.project, name="x", channel="email", events=["worker.offline"])
    assert signed_in(world.viewer).get("/projects/lab/settings/notifications/").status_code == 403
    assert signed_in(world.outsider).get("/projects/lab/settings/notifications/").status_code == 404
    answer = signed_in(world.member).post("/projects/lab/settings/notifications/new", {
        "name": "mine", "events": ["job.failed", "job.finished"], "language": "ja"})
    assert answer.status_code == 200, answer.content
    rule = NotificationRule.objects.get()
    assert (rule.channel, rule.only_my_jobs, rule.email_to, rule.language) == ("email", True, "bob@example.org", "ja")
    admin_rule, _ = services.create_rule(Actor(world.project_admin), world.project, name="admin's", channel="email",
                                         events=["job.failed"], email_to="ops@example.org")
    member = signed_in(world.member)
    assert member.get(f"/projects/lab/settings/notifications/{admin_rule.pk}/").status_code == 404
    assert b"admin&#x27;s" not in member.get("/projects/lab/settings/notifications/").content


def test_the_secret_is_shown_once_and_never_in_the_audit_trail(world):
    from mado.models import AuditEvent

    answer = signed_in(world.project_admin).post("/projects/lab/settings/notifications/new", {
        "name": "hook", "events": ["job.failed"], "channel": "webhook", "language": "en",
        "webhook_url": "https://hooks.example.org/T000/B000/XXXXsecretpath"})
    assert answer.status_code == 200 and answer["Cache-Control"] == "no-store"
    rule = NotificationRule.objects.get()
    assert rule.secret in answer.content.decode()
    page = signed_in(world.project_admin).get(f"/projects/lab/settings/notifications/{rule.pk}/").content.decode()
    assert rule.secret not in page and "XXXXsecretpath" not in page
    row = AuditEvent.objects.get(action="notification_rule.create")
    assert rule.secret not in str(row.after) and "XXXXsecretpath" not in str(row.after)


def _offline_event(world):
    from datetime import timedelta

    from django.utils import timezone

    from tests.job_fixtures import JobWorker
    from workers import services as worker_services
    from workers.models import Worker

    JobWorker(world.worker_token, "w-bad").hello()
    Worker.objects.filter(worker_id="w-bad").update(last_seen_at=timezone.now() - timedelta(minutes=3))
    assert worker_services.sweep_presence()
