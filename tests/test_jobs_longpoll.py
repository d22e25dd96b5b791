"""A worker waiting in claim receives a new job at once (PostgreSQL LISTEN/NOTIFY)."""
from __future__ import annotations

import threading
import time

import pytest
from django.db import connection
from rest_framework.test import APIClient

from mado.models import AuditEvent
from tests.job_fixtures import JobWorker, gpu_computer, job_request
from tests.support import wait_for
from workers import longpoll


def listeners() -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                       "AND query = 'LISTEN \"mado_jobs\"'")
        return {row[0] for row in cursor.fetchall()}


@pytest.mark.django_db(transaction=True)
def test_a_waiting_claim_is_woken_by_the_new_job_not_by_its_fallback(world, monkeypatch):
    # The fallback wake-up moved past the claim's own wait: only the notification can deliver the job in time.
    monkeypatch.setattr(longpoll, "MISSED_NOTIFY_SECONDS", 60.0)
    box = gpu_computer(world.global_admin)
    worker = JobWorker(world.worker_token, "waiter")
    worker.hello()
    got = {}

    def wait_in_claim():
        got["item"] = worker.claim(wait=20)
        got["at"] = time.monotonic()
        connection.close()

    thread = threading.Thread(target=wait_in_claim)
    before = listeners()
    thread.start()
    wait_for(lambda: listeners() - before, timeout=20, what="the claim parked in its long-poll")
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
