"""The Jobs list with a thousand Jobs: the page shows 50 of them and costs the same number of queries
whatever the number of Jobs, their statuses and computers (issue 19: pages with many rows)."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from jobs.models import Job
from tests.job_fixtures import JobWorker, gpu_computer

pytestmark = pytest.mark.django_db

STATUSES = ["queued", "claimed", "running", "finished", "failed", "canceled"]


def add_jobs(world, targets, count: int, start: int = 0) -> None:
    people = [world.member, world.project_admin]
    Job.objects.bulk_create(
        Job(project=world.project, created_by=people[i % 2], target=targets[i % len(targets)], runtime="python",
            command=["python", f"train_{i}.py"], name=f"run-{i:04d}", status=STATUSES[i % len(STATUSES)],
            heartbeat_at=timezone.now(), gpu_ids=["0"] if i % 3 == 0 else [])
        for i in range(start, start + count))


def list_queries(client, url: str) -> tuple[int, str]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200
    return len(queries.captured_queries), response.content.decode()


@pytest.mark.parametrize("who", ["member", "project_admin"])
def test_the_jobs_list_costs_the_same_queries_for_10_jobs_as_for_1000(client, world, who):
    assert JobWorker(world.worker_token, "lab-worker-1").hello().status_code == 200
    targets = [gpu_computer(world.global_admin, f"node-{i}") for i in range(20)]
    add_jobs(world, targets, 10)
    client.force_login(getattr(world, who))
    url = reverse("jobs", args=[world.project.slug])
    ten, page = list_queries(client, url)
    assert page.count("<tr data-job=") == 10

    add_jobs(world, targets, 990, start=10)
    first, page = list_queries(client, url)
    assert page.count("<tr data-job=") == 50
    last, page = list_queries(client, url + "?page=20")
    assert page.count("<tr data-job=") == 50 and "run-0000" in page  # newest first: the oldest on the last page
    fragment, _ = list_queries(client, url + "?fragment=list")
    # Never more than with 10 (fewer where the page needs no GPU reservations for its waiting reasons).
    assert max(first, last, fragment) <= ten, (ten, first, last, fragment)
