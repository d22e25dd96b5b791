"""How long a job waits for GPUs busy outside Mado is a computer setting (issue 22, seed 002: "it retries
for a set time (computer setting, default 10 minutes) before giving the claim back. The computer can
turn this off."): gpu_busy_wait_seconds, 600 by default, 0 = off, at most a day. Set through the API and
the Edit dialog with the same refusals, shown in the details' Settings, sent to the worker in the claim;
the worker's MMT_WORKER_GPU_BUSY_WAIT decides only when a claim has no such field (an older server).
Against PostgreSQL through the API, the pages and the worker API."""
from __future__ import annotations

import html as htmllib
import re

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from computers.models import ComputeTarget
from tests.conftest import assert_error
from tests.job_fixtures import job_request
from worker_agent import gpu_remote

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


def admin_api(world) -> APIClient:
    client = APIClient()
    client.force_login(world.global_admin)
    return client


def test_a_new_computer_waits_ten_minutes_and_the_api_shows_and_changes_it(world, gpu_box):
    client = admin_api(world)
    assert client.get(f"/api/computers/{gpu_box.pk}").json()["gpu_busy_wait_seconds"] == 600
    answer = client.patch(f"/api/computers/{gpu_box.pk}", {"gpu_busy_wait_seconds": 0}, format="json")
    assert answer.status_code == 200 and answer.json()["gpu_busy_wait_seconds"] == 0
    gpu_box.refresh_from_db()
    assert gpu_box.gpu_busy_wait_seconds == 0


@pytest.mark.parametrize("value", [86401, -1, "soon", 2.5, True])
def test_a_wait_outside_0_to_a_day_is_refused_with_what_to_fix(world, gpu_box, value):
    body = assert_error(admin_api(world).patch(f"/api/computers/{gpu_box.pk}", {"gpu_busy_wait_seconds": value},
                                               format="json"), 422, "invalid_computer")
    assert "from 0 (no check) to 86,400 seconds" in body["error"]
    gpu_box.refresh_from_db()
    assert gpu_box.gpu_busy_wait_seconds == 600


def edit_form(target, **changes) -> dict:
    form = {"name": target.name, "visibility": target.visibility, "host": target.host, "port": str(target.port),
            "ssh_user": target.ssh_user, "ssh_key_path": target.ssh_key_path,
            "known_hosts_path": target.known_hosts_path, "working_dir": target.working_dir,
            "python_path": target.python_path, "cpu_arch": target.cpu_arch, "runtimes": target.runtimes,
            "gpu_ids": "\n".join(target.gpu_ids), "concurrency": str(target.concurrency),
            "dataset_transfer": target.dataset_transfer, "dataset_cache_limit_gib": "100", "enabled": "on",
            "action": "save"}
    return {**form, **changes}


def text(response) -> str:
    return re.sub(r"\s+", " ", htmllib.unescape(response.content.decode()))


def test_the_edit_dialog_shows_saves_and_refuses_the_wait_and_the_details_show_it(world, gpu_box):
    client = Client()
    client.force_login(world.global_admin)
    ComputeTarget.objects.filter(pk=gpu_box.pk).update(gpu_busy_wait_seconds=90)
    dialog = text(client.get(reverse("computer-edit", args=[gpu_box.pk]), **HTMX))
    assert "Wait for GPUs busy outside Mado (seconds)" in dialog
    assert re.search(r'name="gpu_busy_wait_seconds" value="90"', dialog), "the computer's value, not the default"

    refused = text(client.post(reverse("computer-edit", args=[gpu_box.pk]),
                               edit_form(gpu_box, gpu_busy_wait_seconds="100000"), **HTMX))
    assert "The wait for GPUs busy outside Mado is from 0 (no check) to 86,400 seconds (a day)." in refused
    gpu_box.refresh_from_db()
    assert gpu_box.gpu_busy_wait_seconds == 90

    client.post(reverse("computer-edit", args=[gpu_box.pk]), edit_form(gpu_box, gpu_busy_wait_seconds="0"), **HTMX)
    gpu_box.refresh_from_db()
    assert gpu_box.gpu_busy_wait_seconds == 0
    details = text(client.get(reverse("computer-detail", args=[gpu_box.pk])))
    assert "Wait for GPUs busy outside Mado</dt><dd>Off: jobs start at once</dd>" in details

    client.post(reverse("computer-edit", args=[gpu_box.pk]), edit_form(gpu_box, gpu_busy_wait_seconds="600"), **HTMX)
    details = text(client.get(reverse("computer-detail", args=[gpu_box.pk])))
    assert "Wait for GPUs busy outside Mado</dt><dd>600 seconds</dd>" in details


def test_the_claim_carries_the_computers_wait(world, job_worker, gpu_box):
    ComputeTarget.objects.filter(pk=gpu_box.pk).update(gpu_busy_wait_seconds=45)
    member = Client()
    member.force_login(world.member)
    created = member.post("/api/projects/lab/jobs", job_request(gpu_box, gpu_ids=["1"]),
                          content_type="application/json")
    assert created.status_code == 201, created.content
    item = job_worker.claim()
    assert item["computer"]["gpu_busy_wait_seconds"] == 45


@pytest.mark.parametrize("computer, expected", [
    ({"gpu_busy_wait_seconds": 45}, (45.0, "the computer's setting")),
    ({"gpu_busy_wait_seconds": 0}, (0.0, "the computer's setting")),
    ({}, (7.0, "MMT_WORKER_GPU_BUSY_WAIT")),  # a server from before the field
    ({"gpu_busy_wait_seconds": None}, (7.0, "MMT_WORKER_GPU_BUSY_WAIT")),
    ({"gpu_busy_wait_seconds": -3}, (7.0, "MMT_WORKER_GPU_BUSY_WAIT")),
])
def test_the_worker_waits_the_computers_time_and_its_own_setting_only_without_one(computer, expected):
    assert gpu_remote.busy_wait_for(computer, 7.0) == expected
