from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy


class JobStatus(models.TextChoices):
    QUEUED = "queued", _("Queued")
    CLAIMED = "claimed", _("Claimed")
    RUNNING = "running", _("Running")
    # Site computers (docs/sites-protocol.md): the phases between the queue and the run.
    WAITING_MANUAL = "waiting_manual", _("Waiting for manual submission")
    SUBMITTING = "submitting", _("Submitting")
    SUBMITTED = "submitted", _("Submitted")
    WAITING_RESOURCES = "waiting_resources", _("Waiting for resources")
    FINISHED = "finished", _("Finished")
    # Its own context: "Failed" of a check item is "NG" in Japanese, a failed Job is not.
    FAILED = "failed", pgettext_lazy("job status", "Failed")
    CANCELED = "canceled", _("Canceled")


ACTIVE_STATUSES = (JobStatus.QUEUED, JobStatus.CLAIMED, JobStatus.RUNNING, JobStatus.WAITING_MANUAL,
                   JobStatus.SUBMITTING, JobStatus.SUBMITTED, JobStatus.WAITING_RESOURCES)
HELD_STATUSES = (JobStatus.CLAIMED, JobStatus.RUNNING)
TERMINAL_STATUSES = (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED)
# What counts against a site's max active submissions: handed to its scheduler and not ended.
# Site phases that end by a deadline when nothing arrives (submit_failed, queue_timeout).
SITE_WAITING_STATUSES = (JobStatus.SUBMITTING, JobStatus.SUBMITTED)
SITE_ACTIVE_STATUSES = (JobStatus.SUBMITTING, JobStatus.SUBMITTED, JobStatus.WAITING_RESOURCES, JobStatus.RUNNING)


class EndReason(models.TextChoices):
    EXIT_CODE = "exit_code", _("Exited")
    CANCELED = "canceled", _("Canceled")
    TIMED_OUT = "timed_out", _("Timed out")
    WORKER_LOST = "worker_lost", _("Worker lost")
    SUBMIT_FAILED = "submit_failed", _("Submission failed")
    QUEUE_TIMEOUT = "queue_timeout", _("Queue timeout")
    INVALID_RESULT = "invalid_result", _("Invalid result.json")
    START_FAILED = "start_failed", _("Could not start")
    INPUT_FAILED = "input_failed", _("Input dataset not delivered")
    # A cluster job's sub failed before main1 ended; the job's end_replica names it.
    REPLICA_FAILED = "replica_failed", _("A replica failed")


class Stream(models.TextChoices):
    STDOUT = "stdout", "stdout"
    STDERR = "stderr", "stderr"
    APP = "app", "app"  # what the job's own code sends with its job token


class ClusterMode(models.TextChoices):
    SINGLE_NODE = "single-node", _("Single node")
    MULTI_NODE = "multi-node", _("Multi node")


MAX_CLUSTER_SIZE = 64
MAIN_REPLICA = "main1"


def replica_names(size: int) -> list[str]:
    """main1, sub1, sub2, …: the peer's names, in index order."""
    return [MAIN_REPLICA] + [f"sub{i}" for i in range(1, max(size, 1))]
