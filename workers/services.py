"""Worker presence."""
from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from mado.errors import ServiceError
from mado.services import SYSTEM, audit
from mado.validation import BIGINT_MAX, NAME_PATTERN, as_int
from workers.models import ONLINE_WINDOW, Worker

MAX_CANDIDATES = 50
# last_seen_at is written at most this often unless something else changed (REFERENCE §1).
TOUCH_RESOLUTION = timedelta(seconds=15)


class WorkerStopped(Exception):
    """A claim of a worker that said goodbye while its long-poll waited (worker/goodbye): the long-poll
    ends now with nothing, rather than holding the server's thread until its wait is over. A worker already
    stopped when its request came is answered as before, after the wait: a client that claims on without a
    hello does not spin."""

    reason = "worker_stopped"


def stopped_meanwhile(worker: Worker, stopped_now) -> bool:
    """Whether `worker` (as the request found it) said goodbye since: `stopped_now` is its stopped_at as
    read under the claim's lock. Raises WorkerStopped then; False when it is not stopped."""
    if stopped_now is None:
        return False
    if worker.stopped_at is None:
        raise WorkerStopped()
    return True


def validate_worker_id(worker_id) -> str:
    if not isinstance(worker_id, str) or not NAME_PATTERN.match(worker_id):
        raise ServiceError(
            "worker_id must be 1–64 letters, digits, '.', '_' or '-', starting with a letter or digit.",
            "invalid_worker_id", fields={"worker_id": ["Invalid worker id."]},
        )
    return worker_id


def hello(principal, data: dict) -> Worker:
    problems = {name: ["Required: a non-empty string."] for name in ("worker_id", "version", "hostname")
                if not isinstance(data.get(name), str) or not data[name].strip()}
    if problems:
        raise ServiceError(f"Send {', '.join(problems)} as non-empty strings in the hello body.", "missing_fields",
                           fields=problems)
    worker_id = validate_worker_id(data["worker_id"])
    values = {
        "token": principal.token,
        "project": principal.project,
        "version": data["version"][:64],
        "hostname": data["hostname"][:255],
        "parallel_jobs": _int(data.get("parallel_jobs", 2), "parallel_jobs", 1, 256),
        "target_ids": _target_ids(data.get("target_ids")),
        "capabilities": _strings(data.get("capabilities", []), "capabilities", 32),
        "ssh_key_candidates": _paths(data.get("ssh_key_candidates", []), "ssh_key_candidates"),
        "known_hosts_candidates": _paths(data.get("known_hosts_candidates", []), "known_hosts_candidates"),
        "last_seen_at": timezone.now(),
        "stopped_at": None,
    }
    with transaction.atomic():
        # Bound to the token's service account: the same name said by another account is another worker.
        worker, created = Worker.objects.select_for_update().get_or_create(
            account=principal.token.user, worker_id=worker_id, defaults=values)
        if not created:
            if not worker.is_online:
                values["started_at"] = timezone.now()
            for field, value in values.items():
                setattr(worker, field, value)
            worker.save()
    return worker


def touch(principal, worker_id) -> Worker:
    """A claim call refreshes presence. A worker must have said hello first (seed 001: claims and
    resumes without the required presence fields are refused with 422)."""
    worker_id = validate_worker_id(worker_id)
    return _seen(Worker.objects.filter(account=principal.token.user, worker_id=worker_id).first())


def unread(principal, worker_id) -> Worker:
    """The request's worker before it is read: its job claim reads it under the claim's own lock
    (`read_locked`), so that finding the worker and locking it are one query (issue 19)."""
    return Worker(account=principal.token.user, project=principal.project, worker_id=validate_worker_id(worker_id))


def read_locked(worker: Worker) -> None:
    """Inside a transaction: read the row of an `unread` worker into it, locked FOR UPDATE, and refresh
    its presence as `touch` does."""
    found = _seen(Worker.objects.select_for_update().filter(account=worker.account, worker_id=worker.worker_id)
                  .first())
    for field in Worker._meta.concrete_fields:
        setattr(worker, field.attname, getattr(found, field.attname))
    worker._state.adding = False


def _seen(worker: Worker | None) -> Worker:
    if worker is None:
        raise ServiceError("Send worker/hello with worker_id, version and hostname before claiming.",
                           "hello_required")
    now = timezone.now()
    if worker.last_seen_at < now - TOUCH_RESOLUTION:
        Worker.objects.filter(pk=worker.pk).update(last_seen_at=now)
        worker.last_seen_at = now
    return worker


def sweep_presence() -> list[tuple[str, int]]:
    """The periodic runner's presence rule: a worker not seen for ONLINE_WINDOW (or stopped by
    goodbye) is announced offline once, and online once when it is seen again; each announcement is an
    audit row (`worker.offline`, `worker.online`) that notifications follow. A worker that flaps sends
    one of each per flap, not one per hello. Returns the (action, worker id) pairs announced."""
    gone = Q(last_seen_at__lt=timezone.now() - ONLINE_WINDOW) | Q(stopped_at__isnull=False)
    announced = []
    for online, which in ((False, gone), (True, ~gone)):
        for worker in Worker.objects.filter(which, reported_online=not online).select_related("project")[:500]:
            with transaction.atomic():
                # Conditional on the flag and the presence: a second runner, or a hello landing
                # meanwhile, makes this match nothing, so a transition is announced once.
                if not Worker.objects.filter(which, pk=worker.pk, reported_online=not online).update(
                        reported_online=online):
                    continue
                action = "worker.online" if online else "worker.offline"
                audit(SYSTEM, action, worker, project=worker.project, after={
                    "worker_id": worker.worker_id, "hostname": worker.hostname,
                    "last_seen_at": worker.last_seen_at.isoformat(), "stopped": worker.stopped_at is not None,
                })
            announced.append((action, worker.pk))
    return announced


def _int(value, name: str, low: int, high: int) -> int:
    number = as_int(value, low=low, high=high)
    if number is None or not isinstance(value, int):
        raise ServiceError(f"{name} must be a whole number from {low} to {high}.", "invalid", fields={name: ["Out of range."]})
    return number


def _target_ids(value):
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > 1000 or \
            not all(as_int(v, low=1, high=BIGINT_MAX) is not None and isinstance(v, int) for v in value):
        raise ServiceError("target_ids must be a list of computer ids, or null for every computer.", "invalid",
                           fields={"target_ids": ["List of positive integers or null."]})
    return sorted(set(value))


def _strings(value, name: str, limit: int) -> list[str]:
    if not isinstance(value, list) or len(value) > limit or not all(isinstance(v, str) and len(v) <= 64 for v in value):
        raise ServiceError(f"{name} must be a list of at most {limit} short strings.", "invalid",
                           fields={name: ["Invalid list."]})
    return value


def _paths(value, name: str) -> list[str]:
    if not isinstance(value, list) or len(value) > MAX_CANDIDATES:
        raise ServiceError(f"{name} must be a list of at most {MAX_CANDIDATES} paths.", "too_many_candidates",
                           fields={name: [f"At most {MAX_CANDIDATES}."]})
    for path in value:
        if not isinstance(path, str) or not path.startswith("/") or len(path) > 1024 or "\n" in path or "\0" in path:
            raise ServiceError(f"{name} must hold absolute paths only (no file contents).", "invalid_candidate",
                               fields={name: ["Absolute paths only."]})
    return value
