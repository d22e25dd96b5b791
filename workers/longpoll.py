"""Long-polling: hold a worker's claim request until there is something to claim or time runs out.

PostgreSQL wakes waiters with LISTEN/NOTIFY (DESIGN §13: ~0.1 ms delivery). The listener uses a
dedicated connection because calling execute() on a connection inside its notifies() loop deadlocks.
SQLite, the demo database, falls back to short sleeps."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from django.db import connection, transaction

T = TypeVar("T")
SQLITE_POLL_SECONDS = 0.2
MAX_WAIT_SECONDS = 30
# Wake at least this often so a missed notification costs a second, not the whole wait.
MISSED_NOTIFY_SECONDS = 1.0


def notify(channel: str) -> None:
    """Wake the waiters of `channel` once the current transaction commits."""
    if connection.vendor != "postgresql":
        return

    def send():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [channel])

    transaction.on_commit(send)


def wait_for(claim: Callable[[], T | None], wait: float, channel: str) -> T | None:
    item = claim()
    if item is not None or wait <= 0:
        return item
    deadline = time.monotonic() + min(wait, MAX_WAIT_SECONDS)
    if connection.vendor == "postgresql":
        return _wait_postgresql(claim, deadline, channel)
    while time.monotonic() < deadline:
        time.sleep(min(SQLITE_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        item = claim()
        if item is not None:
            return item
    return None


def _wait_postgresql(claim, deadline: float, channel: str):
    import psycopg

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel}"')
        # Claim once more after LISTEN: a notification sent between the first claim and LISTEN is lost.
        item = claim()
        while item is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            for _ in listener.notifies(timeout=min(remaining, MISSED_NOTIFY_SECONDS), stop_after=1):
                pass
            item = claim()
        return item
