"""The registry of time-based rules, run by `manage.py mado_periodic` (docs/notifications.md, "The periodic
runner").

mado is the lowest layer, so it cannot know the rules of the apps above it: each app registers its own
in its AppConfig.ready() with `register(name, function, every_seconds=…)`. The runner calls each task at
most once per `every_seconds`, and only while it holds that task's PostgreSQL advisory lock, so two
runners started at once (a second host, a restart that overlaps) never run the same task at the same
time; the other one skips it until its next round. The tasks themselves are written to be safe anyway
(conditional UPDATEs, SKIP LOCKED): the lock only saves the duplicated work.
"""
from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from django.db import close_old_connections, connection

log = logging.getLogger("mado.periodic")


@dataclass
class Task:
    name: str
    function: Callable[[], object]
    every_seconds: float
    last_run: float = field(default=-1e18)  # time.monotonic() of the last attempt in this process

    @property
    def lock_key(self) -> int:
        # A stable signed 64-bit key per task name (Python's hash() differs between processes).
        return int.from_bytes(hashlib.sha256(f"mado.periodic:{self.name}".encode()).digest()[:8], "big", signed=True)


_registry: dict[str, Task] = {}


def register(name: str, function: Callable[[], object], *, every_seconds: float) -> None:
    """Add a task. Registering the same name again replaces it (ready() may run twice in tests)."""
    if every_seconds <= 0:
        raise ValueError("every_seconds must be positive")
    _registry[name] = Task(name, function, float(every_seconds))


def tasks() -> list[Task]:
    return list(_registry.values())


def run_task(task: Task) -> bool:
    """Run one task under its advisory lock. False when another runner holds it. An exception is
    logged, never raised: one broken rule must not stop the others."""
    task.last_run = time.monotonic()
    locked = _try_lock(task)
    if not locked:
        log.debug("periodic task %s is running elsewhere; skipped", task.name)
        return False
    try:
        task.function()
    except Exception:
        log.exception("periodic task %s failed", task.name)
    finally:
        _unlock(task)
    return True


def run_due(*, everything: bool = False) -> list[str]:
    """Run the tasks whose interval has passed (all of them with everything=True); their names."""
    ran = []
    now = time.monotonic()
    for task in tasks():
        if everything or now - task.last_run >= task.every_seconds:
            if not connection.in_atomic_block:  # (a test's transaction, or a caller's, is left alone)
                close_old_connections()  # a connection the database dropped is replaced, not reused
            if run_task(task):
                ran.append(task.name)
    return ran


def seconds_to_next() -> float:
    now = time.monotonic()
    waits = [task.last_run + task.every_seconds - now for task in tasks()]
    return max(0.0, min(waits)) if waits else 1.0


def _try_lock(task: Task) -> bool:
    if connection.vendor != "postgresql":
        return True  # SQLite (the demo): one runner, nothing to share a lock with
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [task.lock_key])
        return bool(cursor.fetchone()[0])


def _unlock(task: Task) -> None:
    if connection.vendor != "postgresql":
        return
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [task.lock_key])
    except Exception:  # the connection broke: the lock went with the session
        log.warning("could not release the lock of periodic task %s; it went with the connection", task.name)
