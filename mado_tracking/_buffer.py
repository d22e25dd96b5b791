"""Metric points wait here and a background thread sends them in batches of up to 1000 (`runs/log-batch`).

A batch leaves the buffer only after the server answered 2xx, so a server that is away (no answer, 5xx, 429)
loses nothing: the same batch is sent again, with backoff, until it is taken. A 4xx is a permanent refusal:
the batch is dropped and the error is raised to the caller at its next SDK call (or at `end_run`).
Each point carries its own timestamp, so a batch sent again after a lost answer carries identical points,
which MLflow-compatible servers store once."""
from __future__ import annotations

import collections
import threading
import time

from ._http import Client, Retryable, TrackingError, encode_number

MAX_BATCH = 1000  # MLflow's limit of metrics in one log-batch


class MetricSender:
    def __init__(self, client: Client, run_id: str, *, batch_size: int = MAX_BATCH, interval: float = 1.0,
                 max_backoff: float = 5.0):
        self.client = client
        self.run_id = run_id
        self.batch_size = max(1, min(batch_size, MAX_BATCH))
        self.interval = interval
        self.max_backoff = max_backoff
        # An RLock: a SIGTERM handler runs on the main thread, possibly while that thread is inside log_metric.
        self.cond = threading.Condition(threading.RLock())
        self.pending: collections.deque = collections.deque()
        self.sending = 0  # points of the batch on the wire (still in `pending` until answered 2xx)
        self.errors: list[TrackingError] = []
        self.flushing = 0
        self.closed = False
        self.last_failure: str | None = None
        self.sent_points = 0
        self.failures = 0  # attempts that found the server away
        self.thread = threading.Thread(target=self._run, name=f"mado-tracking-metrics-{run_id[:8]}", daemon=True)
        self.thread.start()

    # -- the caller's side ---------------------------------------------------------------------------

    def add(self, points: list[dict]) -> None:
        with self.cond:
            if self.closed:
                raise TrackingError("This Run has ended: start a new one to log more metrics.", "INVALID_STATE")
            self.pending.extend(points)
            if len(self.pending) >= self.batch_size:
                self.cond.notify_all()

    def raise_errors(self) -> None:
        with self.cond:
            if self.errors:
                error, self.errors = self.errors[0], []
                raise error

    def unsent(self) -> int:
        with self.cond:
            return len(self.pending)

    def flush(self, timeout: float | None) -> bool:
        """Wait until every point logged so far was taken by the server (True) or `timeout` passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            self.flushing += 1
            self.cond.notify_all()
            try:
                while self.pending:
                    if not self.thread.is_alive():
                        return False
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self.cond.wait(0.5 if left is None else min(left, 0.5))
                return True
            finally:
                self.flushing -= 1

    def close(self, timeout: float | None) -> bool:
        delivered = self.flush(timeout)
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        return delivered

    # -- the background thread -----------------------------------------------------------------------

    def _run(self) -> None:
        delay = 0.2
        while True:
            with self.cond:
                waited_since = time.monotonic()
                while not self.closed and (not self.pending or (
                        len(self.pending) < self.batch_size and not self.flushing
                        and time.monotonic() - waited_since < self.interval)):
                    self.cond.wait(self.interval)
                    if not self.pending:
                        waited_since = time.monotonic()
                if not self.pending:
                    return  # closed and empty
                batch = [self.pending[i] for i in range(min(self.batch_size, len(self.pending)))]
                self.sending = len(batch)
            try:
                self.client.api_once("POST", "runs/log-batch", {
                    "run_id": self.run_id,
                    "metrics": [dict(point, value=encode_number(point["value"])) for point in batch],
                })
            except Retryable as exc:
                self.last_failure = str(exc)
                self.failures += 1
                with self.cond:
                    self.sending = 0
                    resume = time.monotonic() + delay  # a flush does not cut the backoff short: the server is away
                    while not self.closed and time.monotonic() < resume:
                        self.cond.wait(resume - time.monotonic())
                    if self.closed:
                        return  # gave up at close(): the caller was told how many points were not sent
                delay = min(delay * 2, self.max_backoff)
                continue
            except TrackingError as exc:
                error = TrackingError(
                    f"The server refused {len(batch)} metric points ({batch[0]['key']!r} at step {batch[0]['step']}, "
                    f"...): {exc.message}", exc.error_code, exc.status)
                with self.cond:
                    self._drop(len(batch))
                    self.errors.append(error)
                continue
            except Exception as exc:  # a bug or an answer that is not JSON: keep the points, try again later
                self.last_failure = repr(exc)
                self.failures += 1
                with self.cond:
                    self.sending = 0
                    self.cond.wait(delay)
                delay = min(delay * 2, self.max_backoff)
                continue
            delay = 0.2
            self.last_failure = None
            with self.cond:
                self._drop(len(batch))
                self.sent_points += len(batch)

    def _drop(self, count: int) -> None:
        for _ in range(count):
            self.pending.popleft()
        self.sending = 0
        self.cond.notify_all()
