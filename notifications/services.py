"""The only writers of notification rules and deliveries: rules created, enabled, disabled and deleted
(each audited), events queued as deliveries, test deliveries."""
from __future__ import annotations

import logging
import secrets
import uuid
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.utils import timezone, translation
from django.utils.translation import gettext

from mado import access as identity
from mado.choices import Role
from mado.errors import Forbidden, ServiceError
from mado.services import Actor, audit
from notifications import delivery as sender
from notifications import events as event_rules
from notifications.choices import JOB_EVENTS, TEST_EVENT, Channel, Event
from notifications.models import Delivery, NotificationRule

log = logging.getLogger("mado.notifications")

MAX_RECIPIENTS = 20


# Rules ------------------------------------------------------------------------------------------

def create_rule(actor: Actor, project, *, name: str, events: list[str], channel: str, computer=None,
                only_my_jobs: bool = False, email_to: str = "", webhook_url: str = "",
                language: str = "") -> tuple[NotificationRule, str]:
    """A new rule and, for a webhook, its signing secret (returned here once, never shown again)."""
    user = actor.user
    if not identity.has_role(user, project, Role.MEMBER):
        raise Forbidden("Only members and admins of the Project can add notification rules.", "role_required")
    admin = identity.has_role(user, project, Role.ADMIN)
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise ServiceError("Give the rule a name of 1–100 characters.", "invalid", fields={"name": ["Required."]})
    events = _clean_events(events)
    if channel not in Channel.values:
        raise ServiceError("Choose e-mail or webhook as the channel.", "invalid", fields={"channel": ["Invalid."]})
    if not admin:
        # A member's rule is about their own jobs and goes to their own address only.
        if channel != Channel.EMAIL or not set(events) <= set(JOB_EVENTS):
            raise Forbidden("Members can add e-mail rules about their own jobs only; ask a Project admin for "
                            "worker, check and webhook rules.", "rule_admin_required", fields={"events": [
                                "Job events only."]})
        if not user.email:
            raise ServiceError("Add an e-mail address to your account first: member rules mail you only.",
                               "email_missing", fields={"email_to": ["Your account has no e-mail address."]})
        only_my_jobs, email_to = True, user.email
    secret = ""
    if channel == Channel.EMAIL:
        email_to = ", ".join(_clean_recipients(email_to))
        webhook_url = ""
    else:
        webhook_url = clean_webhook_url(webhook_url)
        email_to = ""
        secret = "mws_" + secrets.token_urlsafe(32)
    languages = {code for code, _ in settings.LANGUAGES}
    language = language if language in languages else settings.LANGUAGE_CODE
    with transaction.atomic():
        rule = NotificationRule.objects.create(
            project=project, name=name, events=events, channel=channel, computer=computer,
            only_my_jobs=bool(only_my_jobs), created_by=user, email_to=email_to, webhook_url=webhook_url,
            secret=secret, language=language)
        audit(actor, "notification_rule.create", rule, project=project, after=_snapshot(rule))
    return rule, secret


def after_job_created(actor: Actor, job, options: dict) -> None:
    """jobs.hooks callback, inside create_job's transaction: `notify_me: true` subscribes the creator."""
    notify_me = options.get("notify_me", False)
    if not isinstance(notify_me, bool):
        raise ServiceError("notify_me is true (mail me when this Job ends) or false.", "invalid",
                           fields={"notify_me": ["true or false."]})
    if notify_me:
        subscribe_to_job(actor, job)


def subscribe_to_job(actor: Actor, job) -> NotificationRule:
    """"Notify me when it ends": a rule about this one Job, mailing job.finished and job.failed to the
    address of the actor's account, in the language they use now. The creator's own: the caller checked
    that they may create the Job (member role)."""
    user = actor.user
    if user is None or not user.email:
        raise ServiceError("Add an e-mail address to your account first (Django admin, or ask an administrator), "
                           "or create the Job without “Notify me when it ends”: it mails the address of your "
                           "account.", "email_missing", fields={"notify_me": ["Your account has no e-mail address."]})
    languages = {code for code, _ in settings.LANGUAGES}
    language = translation.get_language() or ""
    language = language if language in languages else settings.LANGUAGE_CODE
    with translation.override(language):
        name = gettext("When %(job)s ends") % {"job": job.display_name}
    with transaction.atomic():
        rule = NotificationRule.objects.create(
            project=job.project, name=name[:100], events=[Event.JOB_FINISHED, Event.JOB_FAILED],
            channel=Channel.EMAIL, only_my_jobs=True, created_by=user, email_to=user.email, job=job,
            language=language)
        audit(actor, "notification_rule.create", rule, project=job.project, after=_snapshot(rule))
    return rule


def set_enabled(actor: Actor, rule: NotificationRule, enabled: bool) -> NotificationRule:
    with transaction.atomic():
        changed = NotificationRule.objects.filter(pk=rule.pk, enabled=not enabled).update(enabled=enabled)
        rule.enabled = enabled
        if changed:
            audit(actor, "notification_rule.enable" if enabled else "notification_rule.disable", rule,
                  project=rule.project)
    return rule


def delete_rule(actor: Actor, rule: NotificationRule) -> None:
    with transaction.atomic():
        audit(actor, "notification_rule.delete", rule, project=rule.project, before=_snapshot(rule))
        rule.delete()


def send_test(actor: Actor, rule: NotificationRule) -> Delivery:
    """Queue a test delivery, then try it at once when nothing of the rule is queued before it (a
    delivery never overtakes an earlier one). One attempt, no retries: the log says what to fix."""
    with transaction.atomic():
        delivery = _queue(rule, TEST_EVENT, f"test:{uuid.uuid4()}", {
            "test": True, "rule": rule.name, "occurred_at": timezone.now().isoformat(),
            "project": {"slug": rule.project.slug, "name": rule.project.name},
            "url": event_rules.absolute(f"/projects/{rule.project.slug}/settings/notifications/{rule.pk}/"),
        })
        audit(actor, "notification_rule.test", rule, project=rule.project, after={"delivery": str(delivery.key)})
    sender.drain_rule(rule.pk)
    delivery.refresh_from_db()
    return delivery


# Events -----------------------------------------------------------------------------------------

def on_audit_event(sender, instance, created, raw=False, **kwargs):
    if not created or raw or instance.action not in event_rules.ACTIONS:
        return
    try:
        found = event_rules.events_of(instance)
    except Exception:  # a notification must never break the transition that wrote the row
        log.exception("could not read notification events from audit row %s", instance.pk)
        return
    if found:
        for event, subject in found:
            queue_event(instance, event, subject)


def queue_event(audit_row, event: str, subject: dict) -> int:
    """One delivery per matching rule, in the transaction that wrote the audit row."""
    rules = event_rules.matching_rules(event, subject)
    for rule in rules:
        body = {"test": False, "occurred_at": audit_row.at.isoformat(), "url": subject["url"],
                "project": {"slug": rule.project.slug, "name": rule.project.name},
                subject["kind"]: subject[subject["kind"]]}
        _queue(rule, event, f"audit:{audit_row.pk}:{event}", body, at=audit_row.at, ignore_conflicts=True)
    return len(rules)


def _queue(rule, event: str, source: str, body: dict, *, at=None, ignore_conflicts=False) -> Delivery:
    key = uuid.uuid4()
    payload = {"id": str(key), "event": event, **body}
    delivery = Delivery(rule=rule, event=event, source=source, key=key, payload=payload,
                        next_attempt_at=at or timezone.now(), created_at=at or timezone.now())
    Delivery.objects.bulk_create([delivery], ignore_conflicts=ignore_conflicts)
    return delivery


# Validation -------------------------------------------------------------------------------------

def _clean_events(events) -> list[str]:
    if not isinstance(events, (list, tuple)) or not events:
        raise ServiceError("Choose at least one event.", "invalid", fields={"events": ["Choose at least one."]})
    unknown = [e for e in events if e not in Event.values]
    if unknown:
        raise ServiceError(f"Unknown events: {', '.join(map(str, unknown[:5]))}; choose from "
                           f"{', '.join(Event.values)}.", "invalid", fields={"events": ["Unknown event."]})
    return [e for e in Event.values if e in events]  # one order, no repeats


def _clean_recipients(raw: str) -> list[str]:
    addresses = [a.strip() for a in (raw or "").replace(";", ",").split(",") if a.strip()]
    if not addresses:
        raise ServiceError("Give at least one e-mail address.", "invalid", fields={"email_to": ["Required."]})
    if len(addresses) > MAX_RECIPIENTS:
        raise ServiceError(f"At most {MAX_RECIPIENTS} addresses per rule.", "invalid",
                           fields={"email_to": ["Too many."]})
    for address in addresses:
        try:
            validate_email(address)
        except ValidationError:
            raise ServiceError(f"{address[:100]} is not an e-mail address; separate addresses with commas.",
                               "invalid", fields={"email_to": ["Not an e-mail address."]}) from None
    return addresses


def clean_webhook_url(raw: str) -> str:
    url = (raw or "").strip()
    invalid = {"webhook_url": ["Use an http:// or https:// URL."]}
    if not url:
        raise ServiceError("Give the webhook URL, starting with https:// or http://.", "invalid", fields=invalid)
    if len(url) > 1000 or any(ch.isspace() or not ch.isprintable() for ch in url):
        raise ServiceError("The webhook URL must be one line of at most 1000 characters, without spaces.", "invalid",
                           fields=invalid)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError:
        raise ServiceError("The webhook URL is not a valid URL; check its host and port.", "invalid",
                           fields=invalid) from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ServiceError(f"Webhooks are sent over HTTP only: use an https:// or http:// URL, not "
                           f"{parts.scheme or 'a URL without a scheme'}:.", "invalid_webhook_url", fields=invalid)
    if not parts.hostname:
        raise ServiceError("The webhook URL has no host name; write it as https://host/path.", "invalid_webhook_url",
                           fields=invalid)
    return url


def _snapshot(rule: NotificationRule) -> dict:
    # No secret and no full URL (webhook URLs often carry a token in their path).
    return {"name": rule.name, "events": rule.events, "channel": rule.channel, "computer": rule.computer_id,
            "only_my_jobs": rule.only_my_jobs, "job": rule.job_id, "recipients": len(rule.recipients),
            "webhook_host": sender.webhook_host(rule.webhook_url) if rule.webhook_url else None, "language": rule.language}
