"""Worker presence: who polls the API, with what, and when it was last seen."""
from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from mado.models import ApiToken, Project

ONLINE_WINDOW = timedelta(seconds=120)


class WorkerQuerySet(models.QuerySet):
    def online(self):
        return self.filter(last_seen_at__gte=timezone.now() - ONLINE_WINDOW, stopped_at__isnull=True)


class Worker(models.Model):
    """One worker: a row bound to its service account and keyed by (service account, worker_id). The
    name is only a label: another service account saying the same name is another worker, and checks,
    reads and computers refer to this row, never to the name. A new token of the same service account
    (reinstall, token rotation) keeps the row; `token` is the one it last said hello with."""

    account = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="workers",
                                help_text=_("The service account whose token the worker uses."))
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
    # Set by worker/goodbye (a worker stopping): it is offline at once and takes nothing more until
    # its next hello.
    stopped_at = models.DateTimeField(null=True, blank=True)
    # The presence last announced (worker.online / worker.offline audit rows, which notifications
    # follow): flipped only by workers.services.sweep_presence in the periodic runner, so each
    # transition is recorded once, however many hellos a flapping worker sends.
    reported_online = models.BooleanField(default=True)

    objects = WorkerQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["account", "worker_id"], name="worker_unique_per_account")]
        ordering = ["worker_id"]

    def __str__(self) -> str:
        return self.worker_id

    def save(self, *args, **kwargs):
        if self.account_id is None and self.token_id is not None:
            self.account_id = self.token.user_id  # a worker belongs to its token's service account
        super().save(*args, **kwargs)

    @property
    def label(self) -> str:
        """The name with what tells two workers of the same name apart: project and host."""
        where = ", ".join(part for part in (self.project.slug, self.hostname) if part)
        return f"{self.worker_id} ({where})" if where else self.worker_id

    @property
    def is_online(self) -> bool:
        return self.stopped_at is None and self.last_seen_at >= timezone.now() - ONLINE_WINDOW

    @property
    def reports_candidates(self) -> bool:
        return "key_candidates" in (self.capabilities or [])

