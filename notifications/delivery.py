"""Sending deliveries: webhooks (signed JSON POST) and e-mail (Django's SMTP backend), with retries.

Order and exactly-once: a rule's deliveries are sent one at a time in id order by whoever holds the
rule's PostgreSQL advisory lock (a second periodic runner, or a *Send test* in a web request, skips a
rule it cannot lock). A delivery that fails and will be retried stays the head of its rule's queue, so
nothing overtakes it. Each payload carries its idempotency key (`id`, also `X-Mado-Delivery`), the same
on every retry: a receiver that got a delivery but whose answer was lost sees the key again.

Nothing else is held up: every rule drains in its own thread (at most MAX_THREADS at a time), and the
periodic loop does not wait for them, so a receiver that never answers costs its own rule the timeout.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import smtplib
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from urllib.parse import urlsplit

import requests
from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.db import connection, connections
from django.utils import timezone

from notifications import messages
from notifications.choices import TEST_EVENT, Channel, DeliveryStatus
from notifications.models import Delivery

log = logging.getLogger("mado.notifications")

MAX_THREADS = 8
DRAIN_BUDGET_SECONDS = 60  # one rule's thread gives its slot back after this long, then the next round goes on
MAX_BACKOFF = timedelta(hours=1)

_executor: ThreadPoolExecutor | None = None
_in_flight: set[int] = set()
_guard = threading.Lock()


class DeliveryError(Exception):
    def __init__(self, message: str, *, permanent: bool = False):
        super().__init__(message)
        self.message = message
        self.permanent = permanent


def webhook_host(url: str) -> str:
    """host:port of a URL, for logs and error messages (a URL's path and query may hold a secret)."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return f"{parts.hostname}:{port}"
    except ValueError:
        return "the webhook host"


# The loop ---------------------------------------------------------------------------------------

def deliver_due(*, wait: bool = True) -> int:
    """Start draining every rule with a delivery due; with wait=False (the periodic loop) return at
    once. The number of rules started."""
    due = (Delivery.objects.filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=timezone.now())
           .values_list("rule_id", flat=True).distinct())
    started = []
    for rule_id in list(due[:1000]):
        with _guard:
            if rule_id in _in_flight:
                continue  # still draining from an earlier round
            _in_flight.add(rule_id)
        started.append(_pool().submit(_drain_in_thread, rule_id))
    if wait:
        for future in started:
            future.result()
    return len(started)


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _guard:
        if _executor is None:
            _executor = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="mado-deliver")
        return _executor


def _drain_in_thread(rule_id: int) -> None:
    try:
        drain_rule(rule_id)
    except Exception:
        log.exception("draining the deliveries of notification rule %s failed", rule_id)
    finally:
        with _guard:
            _in_flight.discard(rule_id)
        connections.close_all()  # this thread's connections only


def drain_rule(rule_id: int) -> int:
    """Send the rule's due deliveries in order until one must wait; the number that ended."""
    if not _lock(rule_id):
        return 0  # someone else is sending this rule's deliveries right now
    try:
        ended = 0
        deadline = time.monotonic() + DRAIN_BUDGET_SECONDS
        while time.monotonic() < deadline:
            head = (Delivery.objects.select_related("rule", "rule__project")
                    .filter(rule_id=rule_id, status=DeliveryStatus.PENDING).order_by("id").first())
            if head is None or head.next_attempt_at > timezone.now():
                break
            if not attempt(head):
                break  # it waits for its retry, and everything after it with it
            ended += 1
        return ended
    finally:
        _unlock(rule_id)


def attempt(delivery: Delivery) -> bool:
    """One try. True when the delivery ended (delivered, or given up), False when it will be retried."""
    rule = delivery.rule
    try:
        if rule.channel == Channel.WEBHOOK:
            post_webhook(delivery)
        else:
            send_email(delivery)
        error = None
    except DeliveryError as refused:
        error = refused
    except Exception as unexpected:  # never let one delivery stop the loop
        log.exception("delivery %s of rule %s failed unexpectedly", delivery.pk, rule.pk)
        error = DeliveryError(f"Internal error while sending ({type(unexpected).__name__}); see the server log.")
    now = timezone.now()
    attempts = delivery.attempts + 1
    fields = {"attempts": attempts, "last_attempt_at": now}
    if error is None:
        fields.update(status=DeliveryStatus.DELIVERED, delivered_at=now, next_attempt_at=None, last_error="")
    else:
        delay = backoff(attempts)
        window = timedelta(hours=settings.NOTIFICATION_RETRY_HOURS)
        give_up = error.permanent or delivery.event == TEST_EVENT or now + delay > delivery.created_at + window
        message = error.message
        if give_up and not error.permanent and delivery.event != TEST_EVENT:
            message += f" Given up after {attempts} attempts in {settings.NOTIFICATION_RETRY_HOURS} h."
        fields.update(last_error=message[:1000])
        if give_up:
            fields.update(status=DeliveryStatus.FAILED, next_attempt_at=None)
        else:
            fields.update(next_attempt_at=now + delay)
        log.info("delivery %s (%s) of rule %s: %s", delivery.key, delivery.event, rule.pk, message)
    Delivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.PENDING).update(**fields)
    for name, value in fields.items():
        setattr(delivery, name, value)
    return error is None or fields["status"] == DeliveryStatus.FAILED


def backoff(attempts: int) -> timedelta:
    """Exponential: base, 2×base, 4×base … capped at an hour (base 30 s: 30 s, 1 min, 2 min … 1 h)."""
    seconds = settings.NOTIFICATION_RETRY_BASE_SECONDS * 2 ** min(attempts - 1, 30)
    return min(timedelta(seconds=seconds), MAX_BACKOFF)


# Channels ---------------------------------------------------------------------------------------

def body_of(delivery: Delivery) -> bytes:
    return json.dumps(delivery.payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def post_webhook(delivery: Delivery) -> None:
    rule = delivery.rule
    body = body_of(delivery)
    where = webhook_host(rule.webhook_url)
    timeout = settings.NOTIFICATION_WEBHOOK_TIMEOUT_SECONDS
    headers = {"Content-Type": "application/json", "User-Agent": f"Mado-Compute/{settings.VERSION}",
               "X-Mado-Signature": signature(rule.secret, body), "X-Mado-Event": delivery.event,
               "X-Mado-Delivery": str(delivery.key)}
    try:
        with requests.Session() as session:
            response = session.post(rule.webhook_url, data=body, headers=headers, timeout=timeout,
                                    allow_redirects=False)
    except requests.exceptions.ConnectTimeout:
        raise DeliveryError(f"{where} did not accept a connection within {timeout:g} s: check the URL's host and "
                            "port, and that no firewall drops the Mado server's connections.") from None
    except requests.exceptions.Timeout:
        raise DeliveryError(f"{where} did not answer within {timeout:g} s: make the receiver answer 2xx at once "
                            "and do its work afterwards.") from None
    except requests.exceptions.SSLError:
        raise DeliveryError(f"The TLS handshake with {where} failed: check the receiver's certificate (it must be "
                            "valid for its host name).") from None
    except requests.exceptions.ConnectionError as error:
        text = str(error)
        if "Name or service not known" in text or "NameResolutionError" in text or "getaddrinfo" in text:
            raise DeliveryError(f"The host of {where} does not resolve: check the webhook URL.") from None
        raise DeliveryError(f"Could not connect to {where}: check the URL, and that the receiver runs and can be "
                            "reached from the Mado server.") from None
    except requests.exceptions.RequestException as error:
        raise DeliveryError(f"The request to {where} failed ({type(error).__name__}): check the webhook URL.") from None
    code = response.status_code
    response.close()
    if 200 <= code < 300:
        return
    if 300 <= code < 400:
        raise DeliveryError(f"{where} answered {code} (a redirect, not followed): put the final URL in the rule.",
                            permanent=True)
    if 400 <= code < 500 and code not in (408, 425, 429):
        raise DeliveryError(f"{where} refused the delivery with {code}: check the URL, and that the receiver "
                            "verifies X-Mado-Signature with this rule's secret.", permanent=True)
    raise DeliveryError(f"{where} answered {code}; retrying with backoff.")


def send_email(delivery: Delivery) -> None:
    rule = delivery.rule
    subject, text = messages.render(rule, delivery.event, delivery.payload)
    where = f"{settings.EMAIL_HOST}:{settings.EMAIL_PORT}"
    mail = EmailMessage(subject, text, settings.DEFAULT_FROM_EMAIL, rule.recipients,
                        headers={"X-Mado-Delivery": str(delivery.key), "X-Mado-Event": delivery.event})
    try:
        mail.connection = get_connection(settings.NOTIFICATION_EMAIL_BACKEND, fail_silently=False,
                                         timeout=settings.EMAIL_TIMEOUT)
        mail.send()
    except smtplib.SMTPAuthenticationError as error:
        raise DeliveryError(f"The mail server {where} refused the sign-in ({error.smtp_code}): check MADO_EMAIL_USER "
                            "and MADO_EMAIL_PASSWORD.") from None
    except smtplib.SMTPRecipientsRefused as error:
        codes = sorted({code for code, _ in error.recipients.values()})
        raise DeliveryError(f"The mail server {where} refused the recipients ({', '.join(map(str, codes))}): check "
                            "the rule's addresses, and that the server relays mail for them from MADO_EMAIL_FROM.",
                            permanent=all(code >= 500 for code in codes)) from None
    except smtplib.SMTPSenderRefused as error:
        raise DeliveryError(f"The mail server {where} refused the sender ({error.smtp_code}): set MADO_EMAIL_FROM to "
                            "an address it accepts.", permanent=error.smtp_code >= 500) from None
    except smtplib.SMTPDataError as error:
        raise DeliveryError(f"The mail server {where} refused the message ({error.smtp_code}): check its logs and "
                            "MADO_EMAIL_FROM.", permanent=error.smtp_code >= 500) from None
    except smtplib.SMTPNotSupportedError:
        raise DeliveryError(f"The mail server {where} does not offer STARTTLS: set MADO_EMAIL_USE_TLS=false, or use "
                            "its TLS port.", permanent=False) from None
    except (smtplib.SMTPException, OSError, socket.timeout) as error:
        raise DeliveryError(f"Could not send through the mail server {where} ({type(error).__name__}): check "
                            "MADO_EMAIL_HOST and MADO_EMAIL_PORT, and that the server runs.") from None


# Per-rule lock ----------------------------------------------------------------------------------

def _key(rule_id: int) -> list[int]:
    return [0x6D61646F, rule_id]  # ('mado', rule): the two-key form, apart from mado.periodic's keys


def _lock(rule_id: int) -> bool:
    if connection.vendor != "postgresql":
        with _guard:  # SQLite (the demo): one process; threads of it are told apart here
            if rule_id in _local_locks:
                return False
            _local_locks.add(rule_id)
            return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", _key(rule_id))
        return bool(cursor.fetchone()[0])


def _unlock(rule_id: int) -> None:
    if connection.vendor != "postgresql":
        with _guard:
            _local_locks.discard(rule_id)
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s, %s)", _key(rule_id))


_local_locks: set[int] = set()
