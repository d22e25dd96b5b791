"""The Jobs pages in real Chromium against the live server, with a scripted worker in a thread that
speaks the worker protocol over HTTP (hello, claim, heartbeat, logs, metrics, complete) like the agent:
a member creates a job with the New job form, watches it start with logs and a chart arriving live,
requests stop in the dialog, and sees the worker end it as Canceled — all without reloading the page."""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

import pytest
import requests

from jobs.models import Job
from tests.browser import chromium_page  # noqa: F401  (fixture)
from tests.browser import sign_in as browser_sign_in
from tests.job_fixtures import gpu_computer

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = pytest.mark.browser


@dataclass
class ThreadWorker:
    """A worker in a thread: claims one job, runs it (heartbeats, a log line and a metric per beat)
    until the heartbeat answers cancel_requested, then ends it as canceled."""

    base: str
    token: str
    worker_id: str = "browser-worker-1"
    beat: float = 0.3
    seen: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    job_id: int | None = None
    saw_cancel: bool = False
    completed: dict | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def post(self, path: str, body: dict) -> dict:
        # Connection: close, so no keep-alive server thread holds a database connection after the test.
        response = requests.post(f"{self.base}{path}", json={"worker_id": self.worker_id, **body}, timeout=35,
                                 headers={"Authorization": f"Bearer {self.token}", "Connection": "close"})
        self.seen.append((path, response.status_code))
        if response.status_code != 200:
            raise AssertionError(f"{path} answered {response.status_code}: {response.text}")
        return response.json()

    def run(self) -> None:
        try:
            self.post("/api/worker/hello", {"version": "0.1.0", "hostname": "browser-test", "parallel_jobs": 1,
                                            "capabilities": ["jobs"]})
            item = None
            deadline = time.monotonic() + 60
            while item is None and not self.stop.is_set() and time.monotonic() < deadline:
                item = self.post("/api/worker/claim", {"active_job_ids": [], "wait": 1})["item"]
            if item is None:
                return
            self.job_id = item["id"]
            lease = {"lease_id": item["lease_id"]}
            self.post(f"/api/worker/jobs/{item['id']}/heartbeat", {**lease, "status": "running"})
            offset, step = 0, 0
            while not self.stop.is_set() and time.monotonic() < deadline:
                step += 1
                line = f"step {step}: loss={1 / step:.4f}\n"
                self.post(f"/api/worker/jobs/{item['id']}/logs",
                          {**lease, "chunks": [{"stream": "stdout", "offset": offset, "data": line}]})
                offset += len(line.encode())
                self.post(f"/api/worker/jobs/{item['id']}/metrics",
                          {**lease, "metrics": [{"name": "loss", "value": 1 / step, "step": step}]})
                answer = self.post(f"/api/worker/jobs/{item['id']}/heartbeat", lease)
                if answer["cancel_requested"]:
                    self.saw_cancel = True
                    # What the agent does: SIGTERM, the process says goodbye on stderr, then canceled.
                    bye = "received SIGTERM, saving a checkpoint and exiting\n"
                    self.post(f"/api/worker/jobs/{item['id']}/logs",
                              {**lease, "chunks": [{"stream": "stderr", "offset": 0, "data": bye}]})
                    self.completed = self.post(f"/api/worker/jobs/{item['id']}/complete",
                                               {**lease, "status": "canceled", "exit_code": 143})
                    return
                time.sleep(self.beat)
        except Exception as error:  # noqa: BLE001  (reported by the test, which fails on it)
            self.errors.append(repr(error))


def sign_in(browser, username: str, password: str) -> None:
    from playwright.sync_api import expect

    browser_sign_in(browser, username, password)
    expect(browser.page.locator("h1")).to_have_text("Lab")


def test_a_member_creates_a_job_watches_it_run_live_and_stops_it_in_chromium(
    transactional_db, live_server, world, chromium_page  # noqa: F811
):
    from playwright.sync_api import expect

    box = gpu_computer(world.global_admin)
    gpu_computer(world.global_admin, "cpu-box", gpus=(), runtimes=("python",))
    browser = chromium_page
    page = browser.page
    page.set_default_timeout(10_000)
    worker = ThreadWorker(live_server.url, world.worker_token)
    thread = threading.Thread(target=worker.run, daemon=True)
    try:
        sign_in(browser, "bob", "bob-pass-123")
        browser.goto("/projects/lab/jobs/")
        expect(page.locator("h1")).to_have_text("Jobs")
        page.get_by_role("link", name="Create job").click()
        expect(page.locator("h1")).to_have_text("Create job")

        # Choosing a computer brings its runtimes and GPUs (HTMX); another computer, other GPUs.
        page.fill("#id_name", "resnet-browser")
        page.select_option("#id_computer", label="cpu-box")
        expect(page.locator("#computer-fields")).to_contain_text("cpu-box has no GPUs")
        page.select_option("#id_computer", label="gpu-host-1")
        gpus = page.locator('#computer-fields input[name="gpu_ids"]')
        expect(gpus).to_have_count(4)
        page.locator('input[name="gpu_ids"][value="1"]').check()
        page.locator('input[name="gpu_ids"][value="2"]').check()
        page.fill("#id_command", "python train.py --epochs 100")
        page.fill("#id_walltime", "2h")
        page.fill("#id_parameters", '{"lr": 0.01')  # a typo first: the form says so under the field
        page.get_by_role("button", name="Create job").click()
        expect(page.locator('[data-field="parameters"] .errors')).to_contain_text("not valid JSON")
        expect(page.locator('input[name="gpu_ids"][value="1"]')).to_be_checked()
        page.fill("#id_parameters", '{"lr": 0.01}')
        browser.screenshot("mado-jobs-new.png")
        page.get_by_role("button", name="Create job").click()

        expect(page.locator("h1")).to_contain_text("resnet-browser")
        job = Job.objects.get(name="resnet-browser")
        assert job.gpu_ids == ["1", "2"] and job.command == ["python", "train.py", "--epochs", "100"]
        assert job.walltime_seconds == 7200 and job.created_by == world.member and job.target == box
        expect(page.locator("#job-status")).to_contain_text("Queued")
        page.evaluate("window.__sameDocument = true")  # gone if anything below reloads the page

        # The worker claims it and runs it: status, logs and the chart arrive while we watch.
        thread.start()
        expect(page.locator("#job-status")).to_contain_text("Running")
        expect(page.locator("#job-summary")).to_contain_text("browser-worker-1")
        log = page.locator("#log-output")
        expect(log).to_contain_text("step 1: loss=1.0000")
        expect(log).to_contain_text("step 3: loss=0.3333")
        expect(page.locator('#run-panel figure[data-metric="loss"] polyline')).to_have_count(1)
        assert page.evaluate("window.__sameDocument") is True, "the logs arrived by reloading the page"

        # Request stop → the dialog says what will happen → Stop.
        page.locator("#job-head").get_by_role("link", name="Request stop").click()
        dialog = page.locator("dialog#dialog")
        expect(dialog).to_be_visible()
        expect(dialog.locator("#dialog-title")).to_have_text("Request stop")
        expect(dialog).to_contain_text("resnet-browser")
        expect(dialog).to_contain_text("bob")
        expect(dialog).to_contain_text("gpu-host-1")
        expect(dialog).to_contain_text("The worker sends SIGTERM to the running process, stops it with SIGKILL")
        browser.screenshot("mado-jobs-stop-dialog.png")
        dialog.get_by_role("button", name="Stop", exact=True).click()
        expect(dialog).to_be_hidden()

        # The worker sees cancel_requested at its next heartbeat and ends the job as canceled.
        expect(page.locator("#job-status")).to_contain_text("Canceled")
        expect(log).to_contain_text("received SIGTERM, saving a checkpoint and exiting")
        expect(page.locator("#job-timeline")).to_contain_text("Stop requested")
        expect(page.locator("#log-poller")).to_have_attribute("data-polling", "false")
        expect(page.locator("#job-head").get_by_role("link", name="Request stop")).to_have_count(0)
        assert page.evaluate("window.__sameDocument") is True, "the page reloaded to show the end"
        path = browser.screenshot("mado-jobs-detail.png")
        page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 20_000

        thread.join(timeout=10)
        assert not worker.errors, worker.errors
        assert worker.saw_cancel and worker.completed == {"id": job.pk, "status": "canceled",
                                                          "end_reason": "canceled"}
        job.refresh_from_db()
        assert job.status == "canceled" and job.exit_code == 143 and job.stop_requested_by == world.member
        assert not job.gpu_reservations.exists()

        # The Jobs list tells the same story.
        browser.goto("/projects/lab/jobs/")
        row = page.locator(f'tr[data-job="{job.pk}"]')
        expect(row).to_contain_text("Canceled")
        expect(row).to_contain_text("bob")
        expect(row).to_contain_text("1, 2")
        expect(row).to_contain_text("Already ended")
        browser.screenshot("mado-jobs-list.png")
        assert not browser.js_errors, browser.js_errors
    finally:
        worker.stop.set()
        if thread.is_alive():
            thread.join(timeout=10)


def test_the_jobs_list_refreshes_itself_and_stops_a_queued_job_from_its_row_in_chromium(
    transactional_db, live_server, world, chromium_page  # noqa: F811
):
    from playwright.sync_api import expect

    from jobs import services
    from mado.services import Actor

    box = gpu_computer(world.global_admin)
    browser = chromium_page
    page = browser.page
    sign_in(browser, "alice", "alice-pass-123")  # a project admin stops anyone's job
    first = services.create_job(Actor(world.member), world.project,
                                {"computer": box.pk, "command": ["python", "a.py"], "name": "first"})
    browser.goto("/projects/lab/jobs/")
    expect(page.locator("#job-list")).to_have_attribute("data-polling", "true")
    page.evaluate("window.__sameDocument = true")

    # A job created elsewhere appears within the 2-second refresh.
    second = services.create_job(Actor(world.member), world.project,
                                 {"computer": box.pk, "command": ["python", "b.py"], "name": "second"})
    expect(page.locator(f'tr[data-job="{second.pk}"]')).to_contain_text("Queued", timeout=6_000)

    row = page.locator(f'tr[data-job="{first.pk}"]')
    expect(row).to_contain_text("bob")
    row.get_by_role("link", name="Request stop").click()
    dialog = page.locator("dialog#dialog")
    page.wait_for_timeout(2500)  # a refresh of the list while the dialog is open leaves the dialog alone
    expect(dialog).to_contain_text("This Job has not started yet: it is canceled at once and never runs.")
    dialog.get_by_role("button", name="Stop", exact=True).click()
    expect(dialog).to_be_hidden()
    expect(row).to_contain_text("Canceled")
    expect(row).to_contain_text("Already ended")
    assert page.evaluate("window.__sameDocument") is True
    assert Job.objects.get(pk=first.pk).status == "canceled"

    services.request_stop(Actor(world.member), second)
    expect(page.locator("#job-list")).to_have_attribute("data-polling", "false", timeout=6_000)
    assert not browser.js_errors, browser.js_errors
