"""Worker presence: who polls the API, with what, and when it was last seen."""
from __future__ import annotations

from datetime import timedelta

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from mado.models import ApiToken, Project

ONLINE_WINDOW = timedelta(seconds=120)


class WorkerQuerySet(models.QuerySet):
    def online(self):
        return self.filter(last_seen_at__gte=timezone.now() - ONLINE_WINDOW)


class Worker(models.Model):
    """One running worker, keyed by (token, worker_id): reinstalling with a new token makes a new row."""

    token = models.ForeignKey(ApiToken, on_delete=models.CASCADE, related_name="workers")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="workers")
    worker_id = models.CharField(_("worker ID"), max_length=64)
    version = models.CharField(max_length=64, blank=True)
    hostname = models.CharField(max_length=255, blank=True)
    parallel_jobs = models.PositiveIntegerField(default=2)
    target_ids = models.JSONField(null=True, blank=True, help_text=_("Computer IDs it handles; empty means all."))
    capabilities = models.JSONField(default=list, blank=True)
    ssh_key_candidates = models.JSONField(default=list, blank=True)
    known_hosts_candidates = models.JSONField(default=list, blank=True)
    active_jobs = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now, db_index=True)

    objects = WorkerQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["token", "worker_id"], name="worker_unique_per_token")]
        ordering = ["worker_id"]

    def __str__(self) -> str:
        return self.worker_id

    @property
    def is_online(self) -> bool:
        return self.last_seen_at >= timezone.now() - ONLINE_WINDOW

    @property
    def reports_candidates(self) -> bool:
        return "key_candidates" in (self.capabilities or [])

