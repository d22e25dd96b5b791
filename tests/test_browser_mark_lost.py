"""Mark as lost and "why is my Job waiting?" in real Chromium against the live server (issue 13): a
Project admin opens a Not responding Job, presses Mark as lost, reads what it does and what it does not
(its process may still run on the computer), confirms, and sees the Job end as Failed · Worker lost
without reloading the page; and the Jobs list says in each queued Job's row why it waits, and stops
saying it once a worker is there."""
from __future__ import annotations

import os
from datetime import timedelta

import pytest
from django.utils import timezone

from computers.models import ComputeTarget
from jobs import services
from jobs.models import Job
from mado.services import Actor
from tests.browser import chromium_page  # noqa: F401  (fixture)
from tests.job_fixtures import JobWorker, gpu_computer

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = pytest.mark.browser


def sign_in(browser, username: str, password: str) -> None:
    from playwright.sync_api import expect

    page = browser.page
    browser.goto("/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("h1")).to_have_text("Lab")


def make_job(world, target, **extra) -> Job:
    return services.create_job(Actor(world.member), world.project,
                               {"computer": target.pk, "runtime": "python", "command": ["python", "train.py"],
                                **extra})


def test_a_project_admin_marks_a_not_responding_job_as_lost_in_chromium(
    transactional_db, live_server, world, chromium_page  # noqa: F811
):
    from playwright.sync_api import expect

    box = gpu_computer(world.global_admin)
    worker = JobWorker(world.worker_token, "lab-worker-1")
    assert worker.hello().status_code == 200
    job = make_job(world, box, name="resnet-lost", gpu_ids=["0", "1"])
    item = worker.claim()
    assert item["id"] == job.pk
    # The worker went silent 90 seconds ago.
    Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=90))

    browser = chromium_page
    page = browser.page
    page.set_default_timeout(10_000)
    sign_in(browser, "alice", "alice-pass-123")
    browser.goto(f"/projects/lab/jobs/{job.pk}/")
    head = page.locator("#job-head")
    expect(head).to_contain_text("Claimed")
    expect(head).to_contain_text("No response")
    page.evaluate("window.__sameDocument = true")

    head.get_by_role("link", name="Mark as lost").click()
    dialog = page.locator("dialog#dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator("#dialog-title")).to_have_text("Mark as lost")
    expect(dialog).to_contain_text("resnet-lost")
    expect(dialog).to_contain_text("lab-worker-1")
    expect(dialog).to_contain_text("The Job ends as Failed (Worker lost).")
    expect(dialog).to_contain_text("Its GPUs (0, 1) are released, so other Jobs can take them.")
    expect(dialog.locator(".lost-warning")).to_have_text(
        "Its process may still be running on the computer: check the computer before you reuse its GPUs.")
    browser.screenshot("mado-jobs-mark-lost-dialog.png")
    dialog.get_by_role("button", name="Mark as lost").click()
    expect(dialog).to_be_hidden()

    expect(page.locator("#job-status")).to_have_text("Failed · Worker lost")
    expect(head.get_by_role("link", name="Mark as lost")).to_have_count(0)
    expect(page.locator("#log-poller")).to_have_attribute("data-polling", "false")
    assert page.evaluate("window.__sameDocument") is True, "the page reloaded to show the end"
    job.refresh_from_db()
    assert job.status == "failed" and job.end_reason == "worker_lost"
    assert not job.gpu_reservations.exists()
    assert not browser.js_errors, browser.js_errors


def test_the_jobs_list_says_why_each_queued_job_waits_in_chromium(
    transactional_db, live_server, world, chromium_page  # noqa: F811
):
    from playwright.sync_api import expect

    off = gpu_computer(world.global_admin, "gpu-off")
    unserved = gpu_computer(world.global_admin, "gpu-unserved")
    on_off = make_job(world, off, name="on-disabled")
    on_unserved = make_job(world, unserved, name="on-unserved")
    ComputeTarget.objects.filter(pk=off.pk).update(enabled=False)  # its owner disabled it afterwards

    browser = chromium_page
    page = browser.page
    sign_in(browser, "bob", "bob-pass-123")
    browser.goto("/projects/lab/jobs/")
    off_row = page.locator(f'tr[data-job="{on_off.pk}"] .waiting-reason')
    unserved_row = page.locator(f'tr[data-job="{on_unserved.pk}"] .waiting-reason')
    expect(off_row).to_have_text("gpu-off is disabled: it starts once its owner enables it again.")
    expect(unserved_row).to_have_text(
        f"No online worker of this Project runs Jobs on gpu-unserved: start a worker with a token of this "
        f"Project's service account, with --target-ids including {unserved.pk} (see Worker settings on the "
        "computer's page).")
    browser.screenshot("mado-jobs-list-waiting.png")

    # A worker for gpu-unserved says hello (it only serves that computer, so it claims nothing it
    # should not): the list's 2-second refresh drops that row's reason and keeps the other.
    page.evaluate("window.__sameDocument = true")
    assert JobWorker(world.worker_token, "lab-worker-1", target_ids=[unserved.pk],
                     capabilities=("checks", "jobs")).hello().status_code == 200
    expect(unserved_row).to_have_count(0, timeout=6_000)
    expect(off_row).to_contain_text("gpu-off is disabled")
    assert page.evaluate("window.__sameDocument") is True

    # The job's own page says it next to its status.
    page.locator(f'tr[data-job="{on_off.pk}"]').get_by_role("link", name="on-disabled").click()
    expect(page.locator("#job-head #waiting-reason")).to_have_text(
        "Why it waits: gpu-off is disabled: it starts once its owner enables it again.")
    browser.screenshot("mado-jobs-waiting-reason.png")
    assert not browser.js_errors, browser.js_errors
