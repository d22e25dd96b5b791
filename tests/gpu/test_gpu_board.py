"""The GPU board (Computers → GPUs, jobs.gpu_board): every enabled computer's registered GPUs with the
Job holding each one (link, creator, since), its utilisation and memory now from the Job's latest
system metrics, or free; polled every 10 s; Jobs of projects the reader cannot view stay anonymous.
Rendered by Django's test client against PostgreSQL, with a real claim through the worker API."""
from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from computers.models import ComputeTarget
from jobs import services
from jobs.models import Job
from mado.services import Actor
from tests.job_fixtures import JobWorker, gpu_computer, job_request

pytestmark = pytest.mark.django_db


@pytest.fixture
def worker(world):
    worker = JobWorker(world.worker_token, "lab-worker-1")
    assert worker.hello().status_code == 200
    return worker


def row(page: str, computer: str, gpu: str) -> str:
    section = re.search(rf'<section class="gpu-computer" data-computer="{computer}">(.*?)</section>', page, re.S)
    assert section, f"{computer} is not on the board"
    cell = re.search(rf'<tr data-gpu="{gpu}"[^>]*>(.*?)</tr>', section.group(1), re.S)
    assert cell, f"GPU {gpu} of {computer} is not on the board"
    return re.sub(r"\s+", " ", cell.group(1))


def board(client, user) -> str:
    client.force_login(user)
    response = client.get(reverse("gpu-board"))
    assert response.status_code == 200
    return response.content.decode()


def test_the_board_shows_who_holds_each_gpu_with_its_readings_and_the_free_ones(client, world, worker):
    box = gpu_computer(world.global_admin, gpus=("0", "1"))
    ComputeTarget.objects.create(owner=world.global_admin, name="cpu-only", kind="ssh", visibility="public",
                                 enabled=True, gpu_ids=[], concurrency=1)
    ComputeTarget.objects.filter(pk=gpu_computer(world.global_admin, name="retired-box").pk).update(enabled=False)
    job = services.create_job(Actor(world.member), world.project, job_request(box, gpu_ids=["1"], name="resnet"))
    item = worker.claim()
    assert item["id"] == job.pk and worker.heartbeat(item, "running").status_code == 200
    points = [{"name": "system/gpu/1/utilization", "value": v, "step": s} for s, v in ((1, 20), (2, 81))]
    points += [{"name": "system/gpu/1/memory", "value": 40000, "step": 2}]
    assert worker.leased(item, "metrics", metrics=points).status_code == 200

    page = board(client, world.viewer)
    assert 'hx-trigger="every 10s"' in page, "the board polls every 10 s"
    held = row(page, "gpu-host-1", "1")
    detail = reverse("job-detail", args=["lab", job.pk])
    assert f'<a href="{detail}">#{job.pk} resnet</a>' in held and "bob" in held and " ago" in held
    assert "81 %" in held and "40000 MiB" in held, "the latest readings, not the first"
    assert "Free" in row(page, "gpu-host-1", "0")
    assert 'data-computer="cpu-only"' not in page and 'data-computer="retired-box"' not in page, \
        "computers without GPUs and disabled ones are left out"

    fragment = client.get(reverse("gpu-board") + "?fragment=board", HTTP_HX_REQUEST="true").content.decode()
    assert fragment.startswith('<div id="gpu-board"') and "<html" not in fragment

    outsider_view = row(board(client, world.outsider), "gpu-host-1", "1")
    assert "A Job of a project you cannot view" in outsider_view and "resnet" not in outsider_view

    assert worker.complete(item).status_code == 200
    assert Job.objects.get(pk=job.pk).status == "finished"
    assert "Free" in row(board(client, world.viewer), "gpu-host-1", "1"), "an ended Job frees its GPU on the board"


def test_the_board_costs_the_same_few_queries_for_many_computers(client, world):
    client.force_login(world.viewer)
    for i in range(30):
        gpu_computer(world.global_admin, name=f"box-{i:02d}", gpus=("0", "1", "2", "3"))
    with CaptureQueriesContext(connection) as few:
        client.get(reverse("gpu-board") + "?fragment=board", HTTP_HX_REQUEST="true")
    for i in range(30, 60):
        gpu_computer(world.global_admin, name=f"box-{i:02d}", gpus=("0", "1", "2", "3"))
    with CaptureQueriesContext(connection) as many:
        page = client.get(reverse("gpu-board") + "?fragment=board", HTTP_HX_REQUEST="true").content.decode()
    assert page.count('class="gpu-free"') == 240
    assert len(many) == len(few), [q["sql"][:120] for q in many.captured_queries]


def test_the_board_speaks_japanese(client, world):
    gpu_computer(world.global_admin, gpus=("0",))
    client.defaults["HTTP_ACCEPT_LANGUAGE"] = "ja"
    page = board(client, world.viewer)
    assert "空き" in row(page, "gpu-host-1", "0") and "使用率" in page and "予約はこのアプリの Job の間でのみ有効です。" in page


def test_private_computers_are_on_the_board_only_for_those_who_may_use_or_manage_them(client, world):
    roots = gpu_computer(world.global_admin, name="roots-private", gpus=("0", "7"), visibility="private")
    retired = gpu_computer(world.global_admin, name="roots-retired", gpus=("5",), visibility="private")
    ComputeTarget.objects.filter(pk=retired.pk).update(enabled=False)
    bobs = gpu_computer(world.member, name="bobs-box", gpus=("3",), visibility="private")

    outsider_page = board(client, world.outsider)
    assert 'data-computer="roots-private"' not in outsider_page and 'data-computer="bobs-box"' not in outsider_page
    one = client.get(reverse("gpu-board") + f"?fragment=board&computer={retired.pk}", HTTP_HX_REQUEST="true")
    assert 'data-gpu="5"' not in one.content.decode(), "nor asked for by id"
    assert client.get(reverse("computer-detail", args=[roots.pk])).status_code == 404, "as on its details page"

    bobs_page = board(client, world.member)
    assert "Free" in row(bobs_page, "bobs-box", "3") and 'data-computer="roots-private"' not in bobs_page
    admins_page = board(client, world.global_admin)
    assert "Free" in row(admins_page, "roots-private", "7") and "Free" in row(admins_page, "bobs-box", "3")
