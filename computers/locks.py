"""While queued/claimed/running jobs reference a computer, its connection, runtimes, GPUs and dataset
settings stay as they are (seed 002 "Change or disable a target")."""
from __future__ import annotations

from django.apps import apps
from django.db.models import Q

LOCKED_FIELDS = ["kind", "host", "port", "ssh_user", "ssh_key_path", "known_hosts_path", "runtimes", "gpu_ids",
                 "dataset_transfer", "dataset_cache_limit_gib"]


def active_jobs(target):
    """Jobs that hold the computer. Empty until the jobs app defines Job."""
    try:
        job_model = apps.get_model("jobs", "Job")
    except LookupError:
        return []
    from jobs.choices import ACTIVE_STATUSES

    # A cluster job holds every computer one of its replicas runs on, not only main1's.
    return job_model.objects.filter(Q(target=target) | Q(replicas__target=target),
                                    status__in=ACTIVE_STATUSES).distinct()


def locked_changes(target, changes: dict, jobs=None) -> list[str]:
    """The locked fields `changes` would alter while `jobs` (default: the active jobs) exist."""
    altered = [field for field in LOCKED_FIELDS if field in changes and changes[field] != getattr(target, field)]
    if not altered:
        return []
    jobs = active_jobs(target) if jobs is None else jobs
    return altered if list(jobs[:1]) else []


def describe_jobs(jobs) -> str:
    ids = [str(job.pk) for job in list(jobs[:5])]
    return ", ".join(ids)
