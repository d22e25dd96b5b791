"""README tour step 6 (issue 15, item 1): the demo's Local computer is checked by the demo's worker.

*Check connection* in a computer's details names the worker of the last check; the demo's `local` computer
has none, so its check goes only to a worker whose MMT_WORKER_TARGET_IDS include the computer (seed 002).
`manage.py demo` writes the Local computer's id to var/, and `make run` starts `local-worker` with it; an
online worker started that way takes the check, and without one the page says so at once."""
from __future__ import annotations

import re
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.urls import reverse

from computers.models import ComputeTarget, ConnectionCheck
from demo.management.commands.demo import TARGET_IDS_FILE
from tests.computer_fixtures import ScriptedWorker
from worker_agent.config import parse_target_ids

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}
MAKEFILE = Path(__file__).resolve().parent.parent / "Makefile"


@pytest.fixture
def demo(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    settings.DEV_MODE = True
    call_command("demo", stdout=StringIO())
    return tmp_path


def demo_worker(var: Path) -> ScriptedWorker:
    """`local-worker` as `make run` starts it: the demo's token, and the target ids the demo wrote."""
    token = (var / "worker-token").read_text().strip()
    target_ids = parse_target_ids((var / TARGET_IDS_FILE).read_text())
    return ScriptedWorker(token, "local-worker", target_ids=target_ids)


def test_the_demo_worker_serves_the_local_computer_by_id(demo):
    local = ComputeTarget.objects.get(name="local")
    assert parse_target_ids((demo / TARGET_IDS_FILE).read_text()) == [local.pk]
    # Running the demo again keeps the file right.
    call_command("demo", stdout=StringIO())
    assert parse_target_ids((demo / TARGET_IDS_FILE).read_text()) == [local.pk]


def test_make_run_starts_the_demo_worker_with_the_target_ids_the_demo_writes():
    text = MAKEFILE.read_text()
    run = re.search(r"^run:.*?(?=^\S)", text, re.MULTILINE | re.DOTALL).group(0)
    worker_start = run[run.index("manage.py demo"):run.index("mado-tracking-worker run")]
    assert f'MMT_WORKER_TARGET_IDS="$$(cat $(CURDIR)/var/{TARGET_IDS_FILE})"' in worker_start
    assert "MADO_DEV_MODE=true" in worker_start and "MMT_ALLOW_LOCAL_EXECUTOR=true" in worker_start


def test_check_connection_in_the_local_computers_details_reaches_the_online_demo_worker(client, demo):
    from django.contrib.auth.models import User

    local = ComputeTarget.objects.get(name="local")
    assert local.last_check_worker is None, "the check names no worker: the target ids decide"
    worker = demo_worker(demo)
    assert worker.hello().status_code == 200
    client.force_login(User.objects.get(username="admin"))
    panel = client.post(reverse("computer-check-request", args=[local.pk]), **HTMX).content.decode()
    assert "Waiting for the worker to start checking…" in panel
    item = worker.claim_check()
    assert item is not None and item["computer"]["id"] == local.pk
    assert ConnectionCheck.objects.get(pk=item["id"]).claimed_by.worker_id == "local-worker"


def test_without_the_demo_worker_online_the_details_say_so_at_once(client, demo):
    from django.contrib.auth.models import User

    local = ComputeTarget.objects.get(name="local")
    client.force_login(User.objects.get(username="admin"))
    panel = client.post(reverse("computer-check-request", args=[local.pk]), **HTMX).content.decode()
    assert "No online worker handles local" in panel
    assert f"MMT_WORKER_TARGET_IDS includes {local.pk}" in panel and f"--target-ids {local.pk}" in panel
    assert "Waiting for the worker" not in panel
    assert not local.checks.exists(), "nothing waits 5 minutes for a worker that cannot come"
