from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy


class JobStatus(models.TextChoices):
    QUEUED = "queued", _("Queued")
    CLAIMED = "claimed", _("Claimed")
    RUNNING = "running", _("Running")
    FINISHED = "finished", _("Finished")
    # Its own context: "Failed" of a check item is "NG" in Japanese, a failed Job is not.
    FAILED = "failed", pgettext_lazy("job status", "Failed")
    CANCELED = "canceled", _("Canceled")


ACTIVE_STATUSES = (JobStatus.QUEUED, JobStatus.CLAIMED, JobStatus.RUNNING)
HELD_STATUSES = (JobStatus.CLAIMED, JobStatus.RUNNING)
TERMINAL_STATUSES = (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED)


class EndReason(models.TextChoices):
    EXIT_CODE = "exit_code", _("Exited")
    CANCELED = "canceled", _("Canceled")
    TIMED_OUT = "timed_out", _("Timed out")
    WORKER_LOST = "worker_lost", _("Worker lost")
    SUBMIT_FAILED = "submit_failed", _("Submission failed")
    QUEUE_TIMEOUT = "queue_timeout", _("Queue timeout")
    INVALID_RESULT = "invalid_result", _("Invalid result.json")
    START_FAILED = "start_failed", _("Could not start")


class Stream(models.TextChoices):
    STDOUT = "stdout", "stdout"
    STDERR = "stderr", "stderr"
    APP = "app", "app"  # what the job's own code sends with its job token


class ClusterMode(models.TextChoices):
    SINGLE_NODE = "single-node", _("Single node")
    MULTI_NODE = "multi-node", _("Multi node")
