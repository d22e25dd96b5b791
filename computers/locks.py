"""While queued/claimed/running jobs reference a computer, its connection, runtimes, GPUs and dataset
settings stay as they are (seed 002 "Change or disable a target")."""
from __future__ import annotations

from collections.abc import Callable

LOCKED_FIELDS = ["kind", "host", "port", "ssh_user", "ssh_key_path", "known_hosts_path", "runtimes", "gpu_ids",
                 "dataset_transfer", "dataset_cache_limit_gib"]


# The jobs app says which of its Jobs hold a computer or a compute group (JobsConfig.ready()): computers
# may not import jobs (DESIGN §2). Without it, nothing holds anything.
_holders: dict[str, Callable] = {}


def register_holders(*, of_computer: Callable, of_group: Callable) -> None:
    """of_computer(target) and of_group(group) -> a queryset of the active Jobs that hold it."""
    _holders.update(computer=of_computer, group=of_group)


def active_jobs(target):
    """Jobs that hold the computer (queued, claimed, running, waiting)."""
    holders = _holders.get("computer")
    return holders(target) if holders else []


def active_group_jobs(group):
    """Jobs that are to be placed on the compute group's computers, or run there."""
    holders = _holders.get("group")
    return holders(group) if holders else []


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
