"""Long-polling: hold a worker's claim request until there is something to claim or time runs out.

PostgreSQL wakes waiters with LISTEN/NOTIFY (DESIGN §13: ~0.1 ms delivery). Every worker keeps three
long-polls open (checks, reads, jobs), so what a waiting request holds decides how many workers a server
can carry: one process-wide listener (`Hub`: one thread, one connection LISTENing on every channel that
has waiters) serves all waiting requests of the process, and a waiting request gives its own database
connection back while it waits (decisions.md, "Many idle workers"). SQLite, the demo database, falls back
to short sleeps."""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import TypeVar

from django.db import connection, transaction

log = logging.getLogger(__name__)

T = TypeVar("T")
SQLITE_POLL_SECONDS = 0.2
MAX_WAIT_SECONDS = 30
# While the listener is down (PostgreSQL restarted, the connection cut) notifications can be missed:
# waiters claim again this often, so a missed notification costs a second, not the whole wait.
MISSED_NOTIFY_SECONDS = 1.0
# While the listener is up nothing is missed (the generation counter below catches a notification that
# arrives between a claim and the wait); waiters still look again this often, as a safety net for a change
# that makes something claimable without a notification. Every look is a claim by every idle worker's
# long-polls (600 for 200 workers), which is what idle workers cost a server, so it is not more often.
LISTENING_RECHECK_SECONDS = 10.0
# The listener closes its connection once no request has waited for this long: a process that serves no
# worker holds no connection, and a test database can be dropped.
IDLE_CLOSE_SECONDS = 1.0
# How often the listener comes out of its wait to LISTEN on a channel a new waiter asked for.
LISTENER_TICK_SECONDS = 0.1
RECONNECT_SECONDS = 1.0


def notify(channel: str, topic: str = "") -> None:
    """Wake the waiters of `channel` once the current transaction commits: those of `topic` (a job
    queued in a project wakes that project's workers only), or every waiter when no topic is given."""
    if connection.vendor != "postgresql":
        return

    def send():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [channel, topic])

    transaction.on_commit(send)


def wait_for(claim: Callable[[], T | None], wait: float, channel: str, topic: str = "") -> T | None:
    """`claim()` now, and again whenever `channel` is notified for `topic` (or for everyone), until it
    returns something or `wait` seconds have passed."""
    if wait <= 0:
        return claim()
    deadline = time.monotonic() + min(wait, MAX_WAIT_SECONDS)
    if connection.vendor == "postgresql":
        return _wait_postgresql(claim, deadline, channel, topic)
    item = claim()
    if item is not None:
        return item
    while time.monotonic() < deadline:
        time.sleep(min(SQLITE_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
        item = claim()
        if item is not None:
            return item
    return None


def _wait_postgresql(claim, deadline: float, channel: str, topic: str):
    with hub().waiting(channel, topic) as waiter:
        seen = waiter.generation_if_listening()
        item = claim()
        if item is not None:
            return item
        if seen is None:
            # Claim once more once the channel is listened to: a notification sent between the first claim
            # and LISTEN was never delivered. (With the channel listened to already, the generation taken
            # before the claim catches it, so the one claim is enough: half the claims of idle workers.)
            waiter.until_listening(deadline)
            seen = waiter.generation()
            item = claim()
        while item is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            _release_connection()
            seen = waiter.wait(seen, remaining)
            item = claim()
        return item


def _release_connection() -> None:
    """Give the request's database connection back while it waits: a waiting worker must not hold one
    (PostgreSQL's max_connections, not threads, would then decide how many workers a server carries).
    Inside a transaction (a test's, or a caller's atomic block) the connection is kept."""
    if not connection.in_atomic_block:
        connection.close()


class Hub:
    """The process's one LISTEN connection and the requests waiting on it. Every notification raises a
    generation number of its (channel, topic); a waiter remembers the numbers it saw before it claimed and
    wakes when its topic's or the channel-wide one changes, so a notification between its claim and its
    wait is not lost. One condition per channel: a job notification wakes job waiters only."""

    def __init__(self):
        self.lock = threading.Lock()
        self.conditions: dict[str, threading.Condition] = {}
        self.generations: dict[tuple[str, str], int] = {}
        self.waiters: dict[str, int] = {}
        self.opened: dict[str, int] = {}
        self.asleep: dict[str, int] = {}
        self.listening: set[str] = set()
        self.thread: threading.Thread | None = None

    # -- waiters (request threads) -----------------------------------------------------------------

    @contextmanager
    def waiting(self, channel: str, topic: str = ""):
        with self.lock:
            self.conditions.setdefault(channel, threading.Condition(self.lock))
            self.waiters[channel] = self.waiters.get(channel, 0) + 1
            self.opened[channel] = self.opened.get(channel, 0) + 1
            if self.thread is None:
                params = connection.get_connection_params()
                params.pop("cursor_factory", None)
                params.pop("context", None)
                self.thread = threading.Thread(target=self._listen, args=(params,), name="longpoll-listener",
                                               daemon=True)
                self.thread.start()
        try:
            yield Waiter(self, channel, topic)
        finally:
            with self.lock:
                self.waiters[channel] -= 1

    def parked(self, channel: str) -> tuple[int, int]:
        """(requests asleep on `channel` now, between two claims, with the channel listened to; waits ever
        opened on it): the tests watch a claim park."""
        with self.lock:
            asleep = self.asleep.get(channel, 0) if channel in self.listening else 0
            return asleep, self.opened.get(channel, 0)

    def label(self) -> str:
        """`mado-longpoll jobs=3/57 checks=3/12`: per channel, the requests waiting now / the waits opened
        since the process started (PostgreSQL keeps 63 characters of it)."""
        with self.lock:
            parts = [f"{channel.removeprefix('mado_')}={self.waiters[channel]}/{self.opened[channel]}"
                     for channel in sorted(self.waiters)]
        return " ".join(["mado-longpoll", *parts])

    def _wake_all(self) -> None:
        for condition in self.conditions.values():
            condition.notify_all()

    # -- the listener thread -----------------------------------------------------------------------

    def _listen(self, params: dict) -> None:
        import psycopg

        while True:
            try:
                with psycopg.connect(**params, autocommit=True) as listener:
                    if not self._serve(listener):
                        return
            except psycopg.Error as exc:
                log.warning("long-poll listener lost its database connection (%s); waiters poll every %.0f s "
                            "until it is back", exc, MISSED_NOTIFY_SECONDS)
            with self.lock:
                self.listening.clear()
                self._wake_all()
                if not self._wanted():
                    self.thread = None
                    return
            time.sleep(RECONNECT_SECONDS)

    def _serve(self, listener) -> bool:
        """LISTEN on what waiters ask for and hand out notifications; False once idle long enough."""
        idle_since = shown = None
        while True:
            with self.lock:
                wanted = self._wanted()
                if wanted:
                    idle_since = None
                elif idle_since is None:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= IDLE_CLOSE_SECONDS:
                    self.listening.clear()
                    self.thread = None
                    return False
                new = wanted - self.listening
            for channel in sorted(new):
                listener.execute(f'LISTEN "{channel}"')
            if new:
                with self.lock:
                    self.listening |= new
                    self._wake_all()
            label = self.label()
            if label != shown:
                # Operators (and bench/dispatch_latency.py) see in pg_stat_activity how many requests wait.
                listener.execute("SELECT set_config('application_name', %s, false)", [label])
                shown = label
            # Calling execute() inside the notifies() loop deadlocks: new channels wait for the next tick.
            for note in listener.notifies(timeout=LISTENER_TICK_SECONDS):
                with self.lock:
                    key = (note.channel, note.payload)
                    self.generations[key] = self.generations.get(key, 0) + 1
                    if note.channel in self.conditions:
                        self.conditions[note.channel].notify_all()

    def _wanted(self) -> set[str]:
        return {channel for channel, count in self.waiters.items() if count > 0}


class Waiter:
    def __init__(self, hub: Hub, channel: str, topic: str):
        self.hub, self.channel = hub, channel
        self.keys = {(channel, ""), (channel, topic)}
        self.condition = hub.conditions[channel]

    def generation(self) -> int:
        """Under the hub's lock: the sum of the generations this waiter wakes for."""
        with self.hub.lock:
            return self._generation()

    def generation_if_listening(self) -> int | None:
        """The generation, if the listener LISTENs on the channel now (so every later notification raises
        it); None if not yet."""
        with self.hub.lock:
            return self._generation() if self.channel in self.hub.listening else None

    def _generation(self) -> int:
        return sum(self.hub.generations.get(key, 0) for key in self.keys)

    def until_listening(self, deadline: float) -> None:
        """Until the listener LISTENs on the channel, at most MISSED_NOTIFY_SECONDS (the claims that follow
        poll at that pace while it does not)."""
        until = min(deadline, time.monotonic() + MISSED_NOTIFY_SECONDS)
        with self.hub.lock:
            self.condition.wait_for(lambda: self.channel in self.hub.listening,
                                    timeout=max(0.0, until - time.monotonic()))

    def wait(self, seen: int, remaining: float) -> int:
        """Until a notification newer than `seen`, or the recheck interval; returns the generation now."""
        hub = self.hub
        with hub.lock:
            listening = self.channel in hub.listening
            timeout = min(remaining, LISTENING_RECHECK_SECONDS if listening else MISSED_NOTIFY_SECONDS)
            hub.asleep[self.channel] = hub.asleep.get(self.channel, 0) + 1
            try:
                self.condition.wait_for(lambda: self._generation() != seen
                                        or (listening and self.channel not in hub.listening), timeout=timeout)
            finally:
                hub.asleep[self.channel] -= 1
            return self._generation()


_hub: Hub | None = None
_hub_pid = 0
_hub_lock = threading.Lock()


def hub() -> Hub:
    """The process's hub; a forked child (gunicorn's workers) starts its own."""
    global _hub, _hub_pid
    with _hub_lock:
        if _hub is None or _hub_pid != os.getpid():
            _hub, _hub_pid = Hub(), os.getpid()
        return _hub
