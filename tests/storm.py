"""The claim-storm harness: worker threads claim and complete through the real services while a
watcher thread checks, over and over, that the rules hold. Used by the ordinary and the cluster storms."""
from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable

from django.db import connection

from jobs import services


def claim_and_complete(worker, errors: list, rng: random.Random, idle_rounds: int) -> None:
    """Claim, hold at most two jobs, complete them in claim order; stop after `idle_rounds` empty claims."""
    held = []
    idle = 0
    try:
        while idle < idle_rounds:
            claimed = services.claim_job(worker, [j.pk for j in held])
            if claimed is not None:
                idle = 0
                held.append(claimed[0])
            if held and (claimed is None or len(held) >= 2 or rng.random() < 0.5):
                job = held.pop(0)
                services.complete(worker, job.pk, lease_id=job.lease_id, status="finished", exit_code=0)
            if claimed is None and not held:
                idle += 1
                time.sleep(0.01)  # an empty queue: let the other workers' transactions through
    except BaseException as error:  # surfaced by run_storm's caller
        errors.append(error)
    finally:
        connection.close()


def run_storm(workers, violations: Callable[[], list[str]], idle_rounds: int = 3, drain: bool = False):
    """Every worker in its own thread until the queue stays empty; `violations` runs in a loop meanwhile.
    With `drain`, one worker then claims alone whatever the storm left. Returns (problems, errors,
    seconds, number of checks)."""
    problems: list[str] = []
    errors: list[BaseException] = []
    done = threading.Event()
    checks = Counter()

    def watch():
        try:
            while not done.is_set():
                problems.extend(violations())
                checks["n"] += 1
        finally:
            connection.close()

    watcher = threading.Thread(target=watch)
    threads = [threading.Thread(target=claim_and_complete, args=(w, errors, random.Random(i), idle_rounds))
               for i, w in enumerate(workers)]
    started = time.monotonic()
    watcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    if drain:
        claim_and_complete(workers[0], errors, random.Random(99), idle_rounds)
    done.set()
    watcher.join(10)
    return problems, errors, time.monotonic() - started, checks["n"]
