from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class SubmissionMethod(models.TextChoices):
    AUTOMATIC = "automatic", _("Automatic (a launcher logs in over SSH and submits)")
    MANUAL = "manual", _("Manual (the requester runs mado-tracking submit)")


class AccountKind(models.TextChoices):
    SHARED = "shared", _("Shared account")
    PERSONAL = "personal", _("Your own account")


class Template(models.TextChoices):
    """The built-in job shells a site starts from (sites/job_shells/<value>.sh)."""

    SLURM = "slurm", _("Slurm")
    PBS = "pbs", _("PBS")
    GRIDENGINE = "gridengine", _("Grid Engine")
    TCS = "tcs", _("Fujitsu TCS")
    DOCKER_HOST = "docker_host", _("Docker host (no scheduler)")
    APPTAINER_HOST = "apptainer_host", _("Apptainer host (no scheduler)")


class SubmissionStatus(models.TextChoices):
    CLAIMED = "claimed", _("Being submitted")
    SUBMITTED = "submitted", _("Submitted")
    FAILED = "failed", _("Submission failed")
    NOT_TRIED = "not_tried", _("Not tried (the login failed)")


# Limits (DESIGN §8, REFERENCE §5).
MAX_JUMP_HOSTS = 8
MAX_KNOWN_HOSTS_BYTES = 64 * 1024
MAX_VARIABLES = 64
MAX_JOB_SHELL_BYTES = 1024 * 1024
MIN_QUEUE_TIMEOUT = 60
MAX_QUEUE_TIMEOUT = 30 * 24 * 3600
DEFAULT_QUEUE_TIMEOUT = 7 * 24 * 3600  # supercomputer queues often hold jobs for days
MAX_ACTIVE_SUBMISSIONS = 1000
DEFAULT_MAX_ACTIVE_SUBMISSIONS = 10
SUBMIT_REPORT_TIMEOUT = 15 * 60
LAUNCHER_POLL_SECONDS = 10  # how often a launcher asks for its configuration, checks and cancellations
DEFAULT_WALLTIME_SECONDS = 3600
