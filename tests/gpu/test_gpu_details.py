"""A computer's details and its GPUs (issue 22): the difference between its registered GPU IDs and what
the last connection check found (a computer added before its GPUs, a card added or replaced), fixed
with Save selected settings; and the GPU board's row for this computer, which Job holds each GPU now,
polled on its own. Rendered by Django's test client against PostgreSQL."""
from __future__ import annotations

import html as htmllib
import re

import pytest
from django.urls import reverse

from computers.models import ComputeTarget, ConnectionCheck
from computers.services import _clean_result
from tests.computer_fixtures import good_result
from tests.job_fixtures import JobWorker, gpu_computer, job_request

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


def checked(target, gpus, status="ok"):
    """A succeeded connection check of `target` that found `gpus` (index, uuid)."""
    result = good_result()
    result["gpus"] = [{"index": i, "uuid": uuid, "name": "NVIDIA A100", "memory_mib": 81920} for i, uuid in gpus]
    result["items"] = [dict(item, status=status) if item["key"] == "gpu" else item for item in result["items"]]
    return ConnectionCheck.objects.create(target=target, status="succeeded", result=_clean_result(result, target))


def details(client, user, target) -> str:
    client.force_login(user)
    response = client.get(reverse("computer-detail", args=[target.pk]))
    assert response.status_code == 200
    return re.sub(r"\s+", " ", htmllib.unescape(response.content.decode()))


def test_the_details_show_gpus_the_last_check_found_that_differ_from_the_registered_ones(client, world):
    box = gpu_computer(world.global_admin, gpus=("0", "1"))
    checked(box, [(0, "GPU-aaaa"), (1, "GPU-bbbb"), (2, "GPU-cccc")])
    page = details(client, world.global_admin, box)
    assert "The last connection check found GPUs 0, 1, 2; registered: 0, 1." in page
    assert '<a href="#suggested-settings">Select the GPUs under Suggested settings and press Save selected ' \
           'settings.</a>' in page and "Save selected settings</button>" in page
    client.defaults["HTTP_ACCEPT_LANGUAGE"] = "ja"
    assert "前回の接続確認で見つかった GPU: 0, 1, 2。登録済み: 0, 1。" in details(client, world.global_admin, box)
    del client.defaults["HTTP_ACCEPT_LANGUAGE"]
    viewer_page = details(client, world.viewer, box)
    assert "The last connection check found GPUs 0, 1, 2; registered: 0, 1." in viewer_page
    assert "#suggested-settings" not in viewer_page, "only its managers can change it"

    client.force_login(world.global_admin)
    saved = client.post(reverse("computer-apply-suggested", args=[box.pk]), {"gpu_ids": ["0", "1", "2"]}, **HTMX)
    assert "Saved the selected settings." in saved.content.decode()
    assert 'id="gpu-difference"' not in saved.content.decode()
    box.refresh_from_db()
    assert box.gpu_ids == ["0", "1", "2"]


def test_a_replaced_card_registered_by_uuid_and_a_computer_added_before_its_gpus(client, world):
    replaced = gpu_computer(world.global_admin, name="uuid-box", gpus=("GPU-aaaa", "GPU-bbbb"))
    checked(replaced, [(0, "GPU-aaaa"), (1, "GPU-dddd")])
    assert ("The last connection check found GPUs 0, 1; registered: GPU-aaaa, GPU-bbbb."
            in details(client, world.global_admin, replaced))

    same = gpu_computer(world.global_admin, name="same-box", gpus=("0", "GPU-bbbb"))
    checked(same, [(0, "GPU-aaaa"), (1, "GPU-bbbb")])
    assert 'id="gpu-difference"' not in details(client, world.global_admin, same), "by index or UUID, they agree"

    early = gpu_computer(world.global_admin, name="early-box", gpus=())
    checked(early, [(0, "GPU-aaaa")])
    assert "The last connection check found GPUs 0; none are registered." in details(client, world.global_admin, early)

    gone = gpu_computer(world.global_admin, name="gone-box", gpus=("0",))
    checked(gone, [], status="none")
    page = details(client, world.global_admin, gone)
    assert "The last connection check found no GPUs; registered: 0. Change the GPU IDs with Edit computer." in page

    unread = gpu_computer(world.global_admin, name="unread-box", gpus=("0",))
    checked(unread, [], status="not_checked")
    assert 'id="gpu-difference"' not in details(client, world.global_admin, unread), "GPUs not read: no claim"


def test_the_details_show_which_job_holds_each_gpu_polled_for_this_computer_alone(client, world):
    box = gpu_computer(world.global_admin, gpus=("0", "1"))
    gpu_computer(world.global_admin, name="other-box", gpus=("0",))
    ComputeTarget.objects.create(owner=world.global_admin, name="cpu-only", kind="ssh", visibility="public",
                                 enabled=True, gpu_ids=[], concurrency=1)
    worker = JobWorker(world.worker_token, "lab-worker-1")
    assert worker.hello().status_code == 200
    client.force_login(world.member)
    created = client.post("/api/projects/lab/jobs", job_request(box, gpu_ids=["1"], name="resnet"),
                          content_type="application/json")
    assert created.status_code == 201
    job_id = worker.claim()["id"]

    page = details(client, world.viewer, box)
    block = re.search(r'<section id="computer-gpus" class="panel">(.*?)</div> </section>', page).group(1)
    poll = reverse("gpu-board") + f"?fragment=board&computer={box.pk}"
    assert f'hx-get="{poll}" hx-trigger="every 10s"' in block
    assert f'<a href="/projects/lab/jobs/{job_id}/">#{job_id} resnet</a>' in block and "bob" in block
    assert re.search(r'<tr data-gpu="0" class="gpu-free">.*?Free', block)
    assert "other-box" not in block

    fragment = re.sub(r"\s+", " ", client.get(poll, **HTMX).content.decode())
    assert fragment.startswith('<div id="gpu-board"') and f"#{job_id} resnet" in fragment
    assert "other-box" not in fragment and "<h2>" not in fragment

    assert 'id="computer-gpus"' not in details(client, world.viewer, ComputeTarget.objects.get(name="cpu-only"))
    client.force_login(world.outsider)  # every signed-in user sees every computer, not every project's Jobs
    hidden = client.get(poll, **HTMX).content.decode()
    assert "A Job of a project you cannot view" in hidden and "resnet" not in hidden
