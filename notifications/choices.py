from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class Event(models.TextChoices):
    WORKER_OFFLINE = "worker.offline", _("A worker goes offline")
    WORKER_ONLINE = "worker.online", _("A worker comes back online")
    JOB_FAILED = "job.failed", _("A job failed")
    JOB_FINISHED = "job.finished", _("A job finished")
    JOB_NOT_RESPONDING = "job.not_responding", _("A job is not responding")
    JOB_CANCELED = "job.canceled", _("A job was canceled")
    CHECK_FAILED = "check.failed", _("A connection check failed")
    SITE_SUBMIT_FAILED = "site.submit_failed", _("A site submission failed")


JOB_EVENTS = (Event.JOB_FAILED, Event.JOB_FINISHED, Event.JOB_NOT_RESPONDING, Event.JOB_CANCELED,
              Event.SITE_SUBMIT_FAILED)
TEST_EVENT = "test"


class Channel(models.TextChoices):
    EMAIL = "email", _("E-mail")
    WEBHOOK = "webhook", _("Webhook")


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", _("Pending")
    DELIVERED = "delivered", _("Delivered")
    FAILED = "failed", _("Given up")
