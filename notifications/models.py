"""Notification rules of a project and the log of their deliveries (docs/notifications.md)."""
from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from notifications.choices import Channel, DeliveryStatus


class NotificationRule(models.Model):
    project = models.ForeignKey("mado.Project", on_delete=models.CASCADE, related_name="notification_rules")
    name = models.CharField(_("Name"), max_length=100)
    events = models.JSONField(default=list)
    computer = models.ForeignKey("computers.ComputeTarget", on_delete=models.CASCADE, null=True, blank=True,
                                 related_name="+", help_text=_("Only events of this computer; empty means all."))
    only_my_jobs = models.BooleanField(default=False, help_text=_("Job events only for jobs its creator created."))
    # "Notify me when it ends" on the Create job form (services.subscribe_to_job): a rule about this one
    # Job only, gone with it. Empty: every job of the project (within the other filters).
    job = models.ForeignKey("jobs.Job", on_delete=models.CASCADE, null=True, blank=True, related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    channel = models.CharField(max_length=16, choices=Channel.choices)
    email_to = models.TextField(blank=True)  # comma-separated addresses
    webhook_url = models.CharField(max_length=1000, blank=True)
    # The HMAC key of X-Mado-Signature. Kept as such (the server must sign with it), shown once at
    # creation, never again, never logged or audited.
    secret = models.CharField(max_length=100, blank=True)
    language = models.CharField(max_length=8, default="en")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "id"]

    def __str__(self) -> str:
        return self.name

    @property
    def recipients(self) -> list[str]:
        return [address.strip() for address in self.email_to.split(",") if address.strip()]


class Delivery(models.Model):
    """One event for one rule. Deliveries of a rule go out one at a time in id order (the head of the
    rule's queue blocks the rest while it is retried), so a receiver sees events in the order they
    happened; `key` is the idempotency key sent with it, the same on every retry."""

    rule = models.ForeignKey(NotificationRule, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=32)
    # What produced it ("audit:<id>:<event>" or "test:<uuid>"): unique per rule, so the same audit row
    # can never queue a second delivery to the same rule.
    source = models.CharField(max_length=100)
    key = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.CharField(max_length=1000, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True, default=timezone.now)
    created_at = models.DateTimeField(default=timezone.now)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [models.UniqueConstraint(fields=["rule", "source"], name="one_delivery_per_rule_and_source")]
        indexes = [models.Index(fields=["status", "rule", "id"], name="delivery_queue_order")]

    def __str__(self) -> str:
        return f"{self.event} to {self.rule_id} ({self.status})"
