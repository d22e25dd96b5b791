"""Small helpers shared by the test directories."""
from __future__ import annotations

import time


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.05, what: str = "condition"):
    """Poll `predicate` until it returns something true; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
