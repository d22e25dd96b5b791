"""A worker waiting in claim receives a new job at once (PostgreSQL LISTEN/NOTIFY)."""
from __future__ import annotations

import threading
import time

import pytest
from django.db import connection
from rest_framework.test import APIClient

from mado.models import AuditEvent
from tests.job_fixtures import JobWorker, gpu_computer, job_request


@pytest.mark.django_db(transaction=True)
def test_a_waiting_claim_receives_a_newly_created_job_within_200_ms(world):
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
    time.sleep(0.2)  # the worker is now parked in its long-poll (its 1 s fallback wake-up would come at ~1 s)
    client = APIClient()
    client.force_login(world.member)
    created_at = time.monotonic()
    assert client.post("/api/projects/lab/jobs", job_request(box), format="json").status_code == 201
    thread.join(25)
    latency_ms = (got["at"] - created_at) * 1000
    print(f"long-poll claim latency after job creation: {latency_ms:.1f} ms")
    assert got["item"] is not None
    assert latency_ms < 500, "generous bound: the notification woke it, not the 1 s fallback nor the end of the wait"
    assert AuditEvent.objects.filter(action="job.claim", object_id=str(got["item"]["id"])).exists()
