"""A worker waiting in claim receives a new job at once (PostgreSQL LISTEN/NOTIFY)."""
from __future__ import annotations

import threading
import time

import pytest
from django.db import connection
from rest_framework.test import APIClient

from mado import longpoll
from mado.models import AuditEvent
from tests.job_fixtures import JobWorker, gpu_computer, job_request
from tests.support import wait_for


def parked_claims() -> int:
    """Job claims waiting in the live server's long-poll (it runs in this process)."""
    return longpoll.hub().parked("mado_jobs")[0]


@pytest.mark.django_db(transaction=True)
def test_a_waiting_claim_is_woken_by_the_new_job_not_by_its_fallback(world, monkeypatch):
    # The fallback wake-ups moved past the claim's own wait: only the notification can deliver the job in time.
    monkeypatch.setattr(longpoll, "MISSED_NOTIFY_SECONDS", 60.0)
    monkeypatch.setattr(longpoll, "LISTENING_RECHECK_SECONDS", 60.0)
    box = gpu_computer(world.global_admin)
    worker = JobWorker(world.worker_token, "waiter")
    worker.hello()
    got = {}

    def wait_in_claim():
        got["item"] = worker.claim(wait=20)
        got["at"] = time.monotonic()
        connection.close()

    thread = threading.Thread(target=wait_in_claim)
    thread.start()
    wait_for(parked_claims, timeout=20, what="the claim parked in its long-poll")
    client = APIClient()
    client.force_login(world.member)
    created_at = time.monotonic()
    assert client.post("/api/projects/lab/jobs", job_request(box), format="json").status_code == 201
    thread.join(25)
    latency_ms = (got["at"] - created_at) * 1000
    print(f"long-poll claim latency after job creation: {latency_ms:.1f} ms")
    assert got["item"] is not None
    assert latency_ms < 10_000, "the notification woke it, not the end of its 20 s wait"
    assert AuditEvent.objects.filter(action="job.claim", object_id=str(got["item"]["id"])).exists()


@pytest.mark.django_db(transaction=True)
def test_waiting_claims_share_one_listener_hold_no_connection_and_a_new_job_wakes_only_its_projects(
        world, monkeypatch):
    """Every worker keeps a claim long-poll open, so what a waiting claim holds decides how many workers
    a server carries: twelve waiting claims hold one database session between them (the process's
    listener), and a job queued in `lab` wakes lab's workers, not those of another project."""
    from jobs import services as job_services
    from mado import services
    from mado.choices import Role, TokenKind
    from tests.conftest import WORKER_SCOPES
    from tests.support import database_now, other_sessions

    monkeypatch.setattr(longpoll, "MISSED_NOTIFY_SECONDS", 60.0)
    monkeypatch.setattr(longpoll, "LISTENING_RECHECK_SECONDS", 60.0)
    box = gpu_computer(world.global_admin)
    account = services.create_service_account(services.Actor(world.global_admin), world.other_project,
                                              name="other-worker", role=Role.ADMIN)
    other_token = world.token(account.user, WORKER_SCOPES, project=world.other_project, kind=TokenKind.SERVICE)
    workers = [JobWorker(world.worker_token, f"lab-{i}") for i in range(4)]
    workers += [JobWorker(other_token, f"other-{i}") for i in range(8)]
    for worker in workers:
        assert worker.hello().status_code == 200
    claims: list[str] = []
    real_claim = job_services.claim_job
    monkeypatch.setattr(job_services, "claim_job",
                        lambda worker, active: claims.append(worker.worker_id) or real_claim(worker, active))
    got: dict[str, object] = {}

    def wait_in_claim(worker):
        got[worker.worker_id] = worker.claim(wait=8)
        connection.close()

    since = database_now()
    threads = [threading.Thread(target=wait_in_claim, args=(worker,)) for worker in workers]
    for thread in threads:
        thread.start()
    wait_for(lambda: parked_claims() == len(workers), timeout=30, what="twelve claims parked in their long-polls")
    sessions = other_sessions(since)
    assert len(sessions) == 1, f"one listener for all the waiting claims, no connection each: {sessions}"

    claims.clear()
    client = APIClient()
    client.force_login(world.member)
    assert client.post("/api/projects/lab/jobs", job_request(box), format="json").status_code == 201
    wait_for(lambda: [item for item in got.values() if item is not None], timeout=20, what="the job claimed")
    woken = list(claims)  # before the waits end: each claims once more when its 8 s are up
    # Its end frees room: lab's waiting workers look again, the other project's (nothing queued) do not.
    winner = next(worker for worker in workers if got.get(worker.worker_id))
    item = got[winner.worker_id]
    claims.clear()
    assert winner.heartbeat(item, status="running").status_code == 200
    assert winner.complete(item).status_code == 200
    wait_for(lambda: claims, timeout=20, what="the waiting claims woken by the job's end")
    woken_by_end = list(claims)
    for thread in threads:
        thread.join(20)
    winners = [worker_id for worker_id, item in got.items() if item is not None]
    assert len(winners) == 1 and winners[0].startswith("lab-"), got
    assert woken and all(worker_id.startswith("lab-") for worker_id in woken), \
        f"the job woke only lab's workers: {woken}"
    assert all(worker_id.startswith("lab-") for worker_id in woken_by_end), woken_by_end


@pytest.mark.django_db(transaction=True)
def test_a_worker_saying_goodbye_ends_its_open_long_polls_at_once(world, monkeypatch):
    """What a SIGTERM'd worker leaves on the server: its claim, check and read long-polls end when it says
    goodbye, with the reason, instead of holding a server thread until their wait is over."""
    monkeypatch.setattr(longpoll, "LISTENING_RECHECK_SECONDS", 60.0)  # only the goodbye's wake-up ends them
    worker = JobWorker(world.worker_token, "leaving")
    worker.hello()
    answers = {}

    def long_poll(kind):
        answers[kind] = worker.post(f"/api/worker/{kind}", {"wait": 30}).json()
        connection.close()

    threads = [threading.Thread(target=long_poll, args=(kind,)) for kind in ("claim", "checks/claim", "reads/claim")]
    for thread in threads:
        thread.start()
    wait_for(lambda: parked_claims() and longpoll.hub().parked("mado_checks")[0]
             and longpoll.hub().parked("mado_reads")[0], timeout=20, what="the three long-polls parked")
    assert worker.post("/api/worker/goodbye", {}).status_code == 200
    for thread in threads:
        thread.join(20)
    assert answers == {kind: {"item": None, "reason": "worker_stopped"} for kind in ("claim", "checks/claim",
                                                                                     "reads/claim")}

    # Already stopped when it asks: answered after its wait as before (a client claiming on does not spin).
    assert worker.post("/api/worker/claim", {"wait": 0}).json() == {"item": None}
    worker.hello()
    assert worker.post("/api/worker/claim", {"wait": 0}).json() == {"item": None}, "back after its hello"
