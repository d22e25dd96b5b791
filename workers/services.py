"""Worker presence."""
from __future__ import annotations

import re
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from mado.errors import ServiceError
from workers.models import Worker

WORKER_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_CANDIDATES = 50
# last_seen_at is written at most this often unless something else changed (REFERENCE §1).
TOUCH_RESOLUTION = timedelta(seconds=15)


def validate_worker_id(worker_id) -> str:
    if not isinstance(worker_id, str) or not WORKER_ID_PATTERN.match(worker_id):
        raise ServiceError(
            "worker_id must be 1–64 letters, digits, '.', '_' or '-', starting with a letter or digit.",
            "invalid_worker_id", fields={"worker_id": ["Invalid worker id."]},
        )
    return worker_id


def hello(principal, data: dict) -> Worker:
    missing = [name for name in ("worker_id", "version", "hostname") if data.get(name) in (None, "")]
    if missing:
        raise ServiceError(f"Send {', '.join(missing)} in the hello body.", "missing_fields",
                           fields={name: ["This field is required."] for name in missing})
    worker_id = validate_worker_id(data["worker_id"])
    values = {
        "project": principal.project,
        "version": str(data["version"])[:64],
        "hostname": str(data["hostname"])[:255],
        "parallel_jobs": _int(data.get("parallel_jobs", 2), "parallel_jobs", 1, 256),
        "target_ids": _target_ids(data.get("target_ids")),
        "capabilities": _strings(data.get("capabilities", []), "capabilities", 32),
        "ssh_key_candidates": _paths(data.get("ssh_key_candidates", []), "ssh_key_candidates"),
        "known_hosts_candidates": _paths(data.get("known_hosts_candidates", []), "known_hosts_candidates"),
        "last_seen_at": timezone.now(),
    }
    with transaction.atomic():
        worker, created = Worker.objects.select_for_update().get_or_create(
            token=principal.token, worker_id=worker_id, defaults=values)
        if not created:
            if not worker.is_online:
                values["started_at"] = timezone.now()
            for field, value in values.items():
                setattr(worker, field, value)
            worker.save()
    return worker


def touch(principal, worker_id) -> Worker:
    """A claim call refreshes presence; it creates a bare presence row for a worker that skipped hello."""
    worker_id = validate_worker_id(worker_id)
    now = timezone.now()
    worker, created = Worker.objects.get_or_create(
        token=principal.token, worker_id=worker_id, defaults={"project": principal.project, "last_seen_at": now})
    if not created and worker.last_seen_at < now - TOUCH_RESOLUTION:
        Worker.objects.filter(pk=worker.pk).update(last_seen_at=now)
        worker.last_seen_at = now
    return worker


def _int(value, name: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ServiceError(f"{name} must be a whole number from {low} to {high}.", "invalid", fields={name: ["Out of range."]})
    return value


def _target_ids(value):
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
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
