"""The GPU board's "busy outside the app" (issue 22 item 2, jobs.gpu_board): a claimed Job waiting for its
GPU names the process outside Mado (pid, user) from its worker's reason; a running Job whose probe counts
processes outside Mado beside it says how many; neither once the news is stale (the worker stopped
beating, the point is old, the Job started, or it was claimed again since); a cluster Job's replicas are
told apart by their metric names (system/<replica>/…) and the replica in the reason. Rendered by Django's
test client against PostgreSQL, with real claims, heartbeats and metrics through the worker API; the
reasons are the worker's own sentences (worker_agent.gpu_remote.busy_reason)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from jobs import services
from jobs.gpu_board import STALE_SECONDS
from jobs.models import Job
from mado.services import Actor
from tests.gpu.test_gpu_board import board, row
from tests.job_fixtures import JobWorker, gpu_computer, job_request
from worker_agent import gpu_remote

pytestmark = pytest.mark.django_db

BUSY = "Busy outside the app"


def outsider(pid: int, user: str | None, gpu_uuid: str = "GPU-1") -> gpu_remote.Process:
    return gpu_remote.Process(gpu_uuid, pid, 2048.0, user, None)


@pytest.fixture
def worker(world):
    worker = JobWorker(world.worker_token, "lab-worker-1")
    assert worker.hello().status_code == 200
    return worker


def claimed(world, worker, box, active=(), **fields):
    job = services.create_job(Actor(world.member), world.project, job_request(box, **fields))
    item = worker.claim(active=active)
    assert item["id"] == job.pk
    return job, item


def test_a_claimed_job_waiting_for_its_gpu_shows_who_uses_it_until_the_news_is_stale(client, world, worker):
    box = gpu_computer(world.global_admin, gpus=("0", "1", "2"))
    job, item = claimed(world, worker, box, gpu_ids=["1", "2"], name="resnet")
    reason = gpu_remote.busy_reason([("1", outsider(4242, "alice")), ("1", outsider(4343, None))])
    assert worker.leased(item, "heartbeat", waiting=reason).status_code == 200

    page = board(client, world.viewer)
    busy = row(page, "gpu-host-1", "1")
    assert BUSY in busy and "pid 4242, user alice" in busy and "pid 4343, user unknown" in busy
    assert "(the Job waits for it)" in busy and f"#{job.pk} resnet" in busy, "still shown as the Job's"
    assert 'class="gpu-held gpu-outside"' in page
    assert BUSY not in row(page, "gpu-host-1", "2"), "GPU 2 of the same Job has no process outside Mado"
    assert "Free" in row(page, "gpu-host-1", "0")
    hidden = row(board(client, world.outsider), "gpu-host-1", "1")
    assert BUSY in hidden and "A Job of a project you cannot view" in hidden and "resnet" not in hidden

    # The worker stopped beating for it: its last word is no longer news.
    Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=STALE_SECONDS + 1))
    assert BUSY not in row(board(client, world.viewer), "gpu-host-1", "1")
    assert worker.heartbeat(item).status_code == 200
    assert BUSY in row(board(client, world.viewer), "gpu-host-1", "1"), "it beats again: the reason stands"

    # Started: the process is gone (or the Job would still wait).
    assert worker.heartbeat(item, "running").status_code == 200
    started = row(board(client, world.viewer), "gpu-host-1", "1")
    assert BUSY not in started and f"#{job.pk} resnet" in started


def test_a_reason_from_an_earlier_claim_is_not_shown(client, world, worker):
    box = gpu_computer(world.global_admin, gpus=("0", "1"))
    job, item = claimed(world, worker, box, gpu_ids=["1"])
    reason = gpu_remote.busy_reason([("1", outsider(4242, "alice"))])
    assert worker.leased(item, "heartbeat", waiting=reason).status_code == 200
    assert worker.leased(item, "release", reason=reason + "; it waited 600 s").status_code == 200
    assert "Free" in row(board(client, world.viewer), "gpu-host-1", "1"), "given back: nobody holds it"

    other = JobWorker(world.worker_token, "lab-worker-2")
    assert other.hello().status_code == 200
    again = other.claim()
    assert again["id"] == job.pk
    held = row(board(client, world.viewer), "gpu-host-1", "1")
    assert f"#{job.pk}" in held and BUSY not in held, "the new claim has not looked yet"


def test_a_running_job_sharing_its_gpu_shows_how_many_processes_until_they_are_gone(client, world, worker):
    box = gpu_computer(world.global_admin, gpus=("0", "1"))
    job, item = claimed(world, worker, box, gpu_ids=["1"], name="shares")
    assert worker.heartbeat(item, "running").status_code == 200

    def send(step, count, age=0):
        at = (timezone.now() - timedelta(seconds=age)).isoformat()
        points = [{"name": "system/gpu/1/utilization", "value": 50, "step": step, "timestamp": at},
                  {"name": "system/gpu/1/outside_processes", "value": count, "step": step, "timestamp": at}]
        assert worker.leased(item, "metrics", metrics=points).status_code == 200

    send(1, 2)
    busy = row(board(client, world.viewer), "gpu-host-1", "1")
    assert BUSY in busy and "2 processes beside the Job" in busy and "50 %" in busy
    send(2, 0)
    assert BUSY not in row(board(client, world.viewer), "gpu-host-1", "1"), "the probe saw them go"
    send(3, 1, age=STALE_SECONDS + 5)
    assert BUSY not in row(board(client, world.viewer), "gpu-host-1", "1"), "an old sample is no news"
    send(4, 1)
    assert "1 process beside the Job" in row(board(client, world.viewer), "gpu-host-1", "1")

    client.defaults["HTTP_ACCEPT_LANGUAGE"] = "ja"
    japanese = row(board(client, world.viewer), "gpu-host-1", "1")
    assert "アプリ外で使用中" in japanese and "Job と並んで 1 個のプロセス" in japanese


def test_a_cluster_jobs_replicas_are_told_apart_on_the_board(client, world, worker):
    box = gpu_computer(world.global_admin, gpus=("0", "1", "2", "3"))
    job = services.create_job(Actor(world.member), world.project,
                              job_request(box, cluster_size=2, gpus_per_replica=2, name="pair"))
    item = worker.claim()
    assert [(r["name"], r["gpu_ids"]) for r in item["replicas"]] == [("main1", ["0", "1"]), ("sub1", ["2", "3"])]
    reason = gpu_remote.busy_reason([("2", outsider(777, "carol"))], replica="sub1", computer="gpu-host-1")
    assert reason == "GPU 2 of sub1 on gpu-host-1 is in use by a process outside Mado (pid 777, user carol)"
    assert worker.leased(item, "heartbeat", waiting=reason).status_code == 200
    page = board(client, world.viewer)
    assert "pid 777, user carol" in row(page, "gpu-host-1", "2")
    for gpu in ("0", "1", "3"):
        assert BUSY not in row(page, "gpu-host-1", gpu), f"GPU {gpu} is not the one sub1 waits for"

    assert worker.heartbeat(item, "running").status_code == 200
    now = timezone.now().isoformat()
    points = [{"name": f"system/{replica}/gpu/{gpu}/{name}", "value": value, "step": 1, "timestamp": now}
              for replica, gpu, name, value in (("main1", "0", "utilization", 11), ("sub1", "2", "utilization", 77),
                                                ("sub1", "2", "memory", 1234), ("sub1", "3", "outside_processes", 1))]
    assert worker.leased(item, "metrics", metrics=points).status_code == 200
    page = board(client, world.viewer)
    assert "11 %" in row(page, "gpu-host-1", "0") and "77 %" in row(page, "gpu-host-1", "2")
    assert "1234 MiB" in row(page, "gpu-host-1", "2") and "77 %" not in row(page, "gpu-host-1", "0")
    assert "1 process beside the Job" in row(page, "gpu-host-1", "3")
    assert BUSY not in row(page, "gpu-host-1", "2"), "started: the waiting reason is over"
    assert job.pk == item["id"]


def test_busy_news_costs_no_query_per_computer(client, world):
    """Claimed (waiting) and running Jobs on 2 or on 12 computers: the same number of queries."""
    client.force_login(world.viewer)

    def hold(count, start):
        for i in range(start, start + count):
            box = gpu_computer(world.global_admin, name=f"box-{i:02d}", gpus=("0", "1"))
            worker = JobWorker(world.worker_token, f"w-{i}")
            assert worker.hello().status_code == 200
            _, waiting = claimed(world, worker, box, gpu_ids=["0"])
            reason = gpu_remote.busy_reason([("0", outsider(100 + i, "alice"))])
            assert worker.leased(waiting, "heartbeat", waiting=reason).status_code == 200
            _, running = claimed(world, worker, box, active=[waiting["id"]], gpu_ids=["1"])
            assert worker.heartbeat(running, "running").status_code == 200
            assert worker.leased(running, "metrics", metrics=[
                {"name": "system/gpu/1/outside_processes", "value": 1, "step": 1}]).status_code == 200

    url = reverse("gpu-board") + "?fragment=board"
    hold(2, 0)
    with CaptureQueriesContext(connection) as few:
        client.get(url, HTTP_HX_REQUEST="true")
    hold(10, 2)
    with CaptureQueriesContext(connection) as many:
        page = client.get(url, HTTP_HX_REQUEST="true").content.decode()
    assert page.count("gpu-outside\"") == 24 and page.count("pid 1") == 12
    assert len(many) == len(few), [q["sql"][:120] for q in many.captured_queries]
