"""Edit computer in real Chromium (issues 14 and 15): the worker for this connection and the working
directory's completion for a computer added with *Continue without checking* (seed 002: "The working
directory and Python executable complete as in step 2 of adding"), and the fields that queued or running
Jobs lock, shown disabled with the reason beside them."""
from __future__ import annotations

import os

import pytest

from computers.models import ComputeTarget
from tests.browser import chromium_page  # noqa: F401  (fixture)
from tests.computer_fixtures import ScriptedWorker, good_result
from tests.test_browser_add_computer import fill_step_1, http_worker, sign_in_and_open_add  # noqa: F401

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = pytest.mark.browser
WORKER_LABEL = "lab-worker-1 (lab, worker-host)"


def sign_in(browser):
    from playwright.sync_api import expect

    page = browser.page
    browser.goto("/login/?next=/settings/computers/")
    page.fill("#id_username", "root")
    page.fill("#id_password", "root-pass-123")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("h1")).to_have_text("Computers")
    return page


def open_edit(browser, name: str):
    from playwright.sync_api import expect

    page = browser.page
    browser.goto("/settings/computers/")
    page.locator(f'tr[data-computer="{name}"]').get_by_role("link", name="Edit computer").click()
    dialog = page.locator("dialog#dialog")
    expect(dialog.locator("#dialog-title")).to_have_text(f"Edit computer {name}")
    return dialog


def test_a_computer_added_without_checking_edits_with_the_online_worker_and_lists_typed_directories(
    transactional_db, live_server, world, chromium_page, http_worker  # noqa: F811
):
    from playwright.sync_api import expect

    browser = chromium_page
    worker = http_worker(check_status="succeeded", check_result=good_result())
    page, dialog = sign_in_and_open_add(browser, live_server)
    fill_step_1(dialog, "gpu-host-5")
    dialog.get_by_role("button", name="Continue without checking").click()
    expect(dialog.locator('.steps li[aria-current="step"]')).to_have_text("2. Settings after connecting")
    dialog.locator("#id_enabled").uncheck()
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    target = ComputeTarget.objects.get(name="gpu-host-5")
    assert target.last_check_worker is None and not target.checks.exists()

    dialog = open_edit(browser, "gpu-host-5")
    # The only online worker is already chosen, as in step 1 of adding.
    expect(dialog.locator("#id_worker option:checked")).to_have_text(WORKER_LABEL)
    dialog.get_by_role("tab", name="Settings after connecting").click()
    workdir = dialog.locator("#id_working_dir")
    reading = dialog.locator("#working_dir-assist .reading")

    # /tmp/ does not exist on the worker's machine here: the field says so.
    workdir.fill("/tmp/")
    expect(reading).to_contain_text("The worker is listing directories…")
    worker.release("reads")
    expect(dialog.locator("#working_dir-assist .read-error")).to_have_text("This directory does not exist",
                                                                          timeout=8_000)
    # /data/ is listed: its directories become candidates.
    workdir.fill("/data/")
    expect(reading).to_contain_text("The worker is listing directories…")
    worker.release("reads")
    expect(dialog.locator('#working_dir-options option[value="/data/mmt-jobs/"]')).to_have_count(1, timeout=8_000)
    expect(dialog.locator("#working_dir-assist .read-error")).to_have_count(0)
    browser.screenshot("computers-edit-unchecked-listing.png")
    workdir.fill("/data/mmt-jobs")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    target.refresh_from_db()
    assert target.working_dir == "/data/mmt-jobs"
    assert worker.reads == ["/tmp/", "/data/"] and worker.errors == []
    assert browser.js_errors == []


def test_with_two_workers_online_typing_a_directory_says_to_choose_one_then_lists_it(
    transactional_db, live_server, world, chromium_page, http_worker  # noqa: F811
):
    from playwright.sync_api import expect

    from tests.computer_fixtures import make_computer

    make_computer(world.global_admin, "gpu-host-6", visibility="public")
    browser = chromium_page
    worker = http_worker(check_status="succeeded", check_result=good_result())
    assert ScriptedWorker(world.worker_token, "lab-worker-2").hello().status_code == 200
    sign_in(browser)
    dialog = open_edit(browser, "gpu-host-6")
    expect(dialog.locator("#id_worker option:checked")).to_have_text("—")  # two online: none chosen for you
    dialog.get_by_role("tab", name="Settings after connecting").click()
    workdir = dialog.locator("#id_working_dir")
    workdir.fill("/data/")
    expect(dialog.locator("#working_dir-assist .read-error")).to_contain_text(
        "Choose an online worker in Worker for this connection (Connection tab) to list this directory")
    dialog.get_by_role("tab", name="Connection").click()
    dialog.locator("#id_worker").select_option(label=WORKER_LABEL)
    dialog.get_by_role("tab", name="Settings after connecting").click()
    workdir.fill("/data")
    workdir.fill("/data/")
    expect(dialog.locator("#working_dir-assist .reading")).to_contain_text("The worker is listing directories…")
    worker.release("reads")
    expect(dialog.locator('#working_dir-options option[value="/data/mmt-jobs/"]')).to_have_count(1, timeout=8_000)
    assert worker.reads == ["/data/"] and worker.errors == []
    assert browser.js_errors == []


def test_fields_locked_by_queued_jobs_are_disabled_with_the_reason_and_the_rest_saves(
    transactional_db, live_server, world, chromium_page, http_worker  # noqa: F811
):
    from playwright.sync_api import expect

    from jobs.services import create_job
    from mado.services import Actor
    from tests.job_fixtures import gpu_computer, job_request

    target = gpu_computer(world.global_admin, "gpu-host-7", gpus=("0", "1"), concurrency=2)
    job = create_job(Actor(user=world.member), world.project, job_request(target))
    browser = chromium_page
    http_worker(check_status="succeeded", check_result=good_result())
    sign_in(browser)
    dialog = open_edit(browser, "gpu-host-7")
    reason = f"Cannot change while Jobs {job.pk} are queued or running on this computer."
    expect(dialog.locator(".notice.locked")).to_contain_text(f"Jobs {job.pk} are queued or running")

    # Connection tab: the destination is disabled, each with the reason beside it; the name is not.
    for name in ("host", "port", "ssh_user", "ssh_key_path", "known_hosts_path"):
        expect(dialog.locator(f"#id_{name}")).to_be_disabled()
        expect(dialog.locator(f'[data-locked="{name}"]')).to_have_text(reason)
    expect(dialog.locator("#id_name")).to_be_enabled()
    expect(dialog.locator("#id_visibility")).to_be_enabled()
    expect(dialog.get_by_role("button", name="Check again")).to_be_enabled()

    # Settings tab: runtimes, GPUs and dataset settings are disabled; the rest can change.
    dialog.get_by_role("tab", name="Settings after connecting").click()
    for locator in ('input[name="runtimes"][value="python"]', "#id_gpu_ids", "#id_dataset_transfer",
                    "#id_dataset_cache_limit_gib"):
        expect(dialog.locator(locator)).to_be_disabled()
    for name in ("runtimes", "gpu_ids", "dataset_transfer", "dataset_cache_limit_gib"):
        expect(dialog.locator(f'[data-locked="{name}"]')).to_have_text(reason)
    for name in ("working_dir", "python_path", "cpu_arch", "concurrency", "enabled"):
        expect(dialog.locator(f"#id_{name}")).to_be_enabled()
    browser.screenshot("computers-edit-locked.png")

    # Saving what may change works; the locked values stay as they are.
    dialog.locator("#id_concurrency").fill("1")
    dialog.locator("#id_working_dir").fill("/data/other")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    target.refresh_from_db()
    assert target.concurrency == 1 and target.working_dir == "/data/other"
    assert target.host == "gpu-host-1.example.internal" and target.gpu_ids == ["0", "1"]
    assert target.runtimes == ["python", "docker"] and target.dataset_cache_limit_gib == 100
    assert browser.js_errors == []
