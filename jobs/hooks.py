"""What the apps above jobs add to the creation of a Job. jobs may not import them (DESIGN §2), so each
registers a callback here in its AppConfig.ready(), with the names of the create_job options it reads
(notifications: `notify_me`, "Notify me when it ends").

create_job calls every callback inside its transaction, after the Job and its audit row are written, as
callback(actor, job, options) with only the options that callback named and the caller gave. A callback
that raises ServiceError refuses the whole creation: the Job is rolled back and the error (with its
fields) reaches the form or the API caller."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class AfterCreate:
    name: str
    callback: Callable[..., object]
    options: tuple[str, ...]


_after_create: dict[str, AfterCreate] = {}


def register_after_create(name: str, callback: Callable[..., object], *, options: tuple[str, ...] = ()) -> None:
    """Add a callback. The same name again replaces it (ready() may run twice in tests)."""
    _after_create[name] = AfterCreate(name, callback, tuple(options))


def offers(option: str) -> bool:
    """Whether some installed app reads this create_job option (the form shows its field only then)."""
    return any(option in hook.options for hook in _after_create.values())


def run_after_create(actor, job, data: dict) -> None:
    for hook in list(_after_create.values()):
        hook.callback(actor, job, {name: data[name] for name in hook.options if name in data})


# The end of a Job ----------------------------------------------------------------------------------
# jobs.services._finish calls every callback as callback(job) inside the transaction that ends the job,
# after the job row is saved (job.status, job.finished_at set). tracking closes the Job's Run here.

_after_end: dict[str, Callable[..., object]] = {}


def register_after_end(name: str, callback: Callable[..., object]) -> None:
    """Add a callback run when a Job ends. The same name again replaces it."""
    _after_end[name] = callback


def run_after_end(job) -> None:
    for callback in list(_after_end.values()):
        callback(job)


# The start of a Job --------------------------------------------------------------------------------
# Where a Job becomes running (a worker's first running heartbeat, a site runner's start), jobs calls
# every callback(job) inside that transaction, after the job row is saved. tracking starts the Run here.

_after_start: dict[str, Callable[..., object]] = {}


def register_after_start(name: str, callback: Callable[..., object]) -> None:
    """Add a callback run when a Job starts running. The same name again replaces it."""
    _after_start[name] = callback


def run_after_start(job) -> None:
    for callback in list(_after_start.values()):
        callback(job)


# The claim payload ---------------------------------------------------------------------------------
# What the apps above jobs add to the job a worker or site runner receives (jobs.serializers.
# worker_job_payload): callback(job) -> dict of extra fields (tracking: run_id, experiment_id). `reads`
# names the Job's one-to-one relations the callback follows: a claim selects them along with its job
# (jobs.services._pick), so the payload costs the claim no query.

_claim_payload: dict[str, Callable[..., dict]] = {}
_claim_reads: dict[str, tuple[str, ...]] = {}


def register_claim_payload(name: str, callback: Callable[..., dict], *, reads: tuple[str, ...] = ()) -> None:
    _claim_payload[name] = callback
    _claim_reads[name] = tuple(reads)


def claim_reads() -> list[str]:
    """The relations a claim selects along with its job for the payload callbacks."""
    return sorted({relation for reads in _claim_reads.values() for relation in reads})


def claim_payload(job) -> dict:
    extra: dict = {}
    for callback in list(_claim_payload.values()):
        extra.update(callback(job) or {})
    return extra


# Metrics recorded ----------------------------------------------------------------------------------
# Where jobs stores metric points (result.json `metrics`, and points a worker posts), it calls every
# callback(job, points) inside that transaction, after its own rows are written; `points` are the
# jobs.models.Metric rows (name, value, step, timestamp). tracking makes them its Run's metrics.

_metrics_recorded: dict[str, Callable[..., object]] = {}


def register_metrics_recorded(name: str, callback: Callable[..., object]) -> None:
    """Add a callback run when a Job's metric points are stored. The same name again replaces it."""
    _metrics_recorded[name] = callback


def run_metrics_recorded(job, points) -> None:
    if not points:
        return
    for callback in list(_metrics_recorded.values()):
        callback(job, points)
