"""The two-step Add computer dialog in real Chromium against the live server, with a worker thread that
speaks docs/worker-protocol.md over HTTP (requests) to answer the connection check and the directory
reads. The test holds the worker at each step, so every state the dialog shows is seen on the way."""
from __future__ import annotations

import os
import threading
import time

import pytest
import requests

from computers.models import ComputeTarget
from tests.browser import chromium_page  # noqa: F401  (fixture)
from tests.computer_fixtures import failed_result, good_result

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = pytest.mark.browser

KEY = "/home/worker/.ssh/mmt_worker_ed25519"
KNOWN_HOSTS = "/home/worker/.ssh/mmt_known_hosts"
DIRECTORIES = {
    "/data/": [{"name": "mmt-jobs", "kind": "dir"}, {"name": ".cache", "kind": "dir"},
               {"name": "notes.txt", "kind": "file"}],
    "/usr/local/bin/": [{"name": "python3.12", "kind": "exec"}, {"name": "pip3", "kind": "exec"},
                        {"name": "share", "kind": "dir"}],
}


class HttpWorker(threading.Thread):
    """A worker over plain HTTP: hello, then long-poll checks and reads. Each step waits for the test
    to release it (`gate`), so the dialog's intermediate states can be asserted."""

    def __init__(self, base: str, token: str, *, check_status: str, check_result: dict):
        super().__init__(daemon=True)
        self.base = base
        # A new connection per call, closed after the answer: no keep-alive server thread keeps a database
        # connection after the test.
        self.headers = {"Authorization": f"Bearer {token}", "Connection": "close"}
        self.check_status = check_status
        self.check_result = check_result
        self.gate = {name: threading.Event() for name in ("claim_check", "complete_check", "reads")}
        self.stopping = threading.Event()
        self.errors: list[str] = []
        self.reads: list[str] = []
        self.checks: list[dict] = []

    def post(self, path: str, body: dict) -> dict:
        answer = requests.post(self.base + path, json={"worker_id": "lab-worker-1", **body}, headers=self.headers,
                               timeout=10)
        if answer.status_code != 200:
            self.errors.append(f"{path}: {answer.status_code} {answer.text}")
            return {}
        return answer.json()

    def hello(self):
        self.post("/api/worker/hello", {
            "version": "0.1.0", "hostname": "worker-host", "parallel_jobs": 2, "target_ids": None,
            "capabilities": ["checks", "reads", "key_candidates"], "ssh_key_candidates": [KEY],
            "known_hosts_candidates": [KNOWN_HOSTS]})

    def wait_for(self, gate: str) -> bool:
        while not self.gate[gate].wait(0.05):
            if self.stopping.is_set():
                return False
        return True

    def run(self):
        try:
            while not self.stopping.is_set():
                if self.gate["claim_check"].is_set():
                    item = self.post("/api/worker/checks/claim", {"wait": 0.3}).get("item")
                    if item:
                        self.checks.append(item)
                        self.gate["claim_check"].clear()
                        if not self.wait_for("complete_check"):
                            return
                        self.gate["complete_check"].clear()
                        self.post(f"/api/worker/checks/{item['id']}/complete",
                                  {"lease_id": item["lease_id"], "status": self.check_status,
                                   "result": self.check_result})
                if self.gate["reads"].is_set():
                    item = self.post("/api/worker/reads/claim", {"wait": 0.3}).get("item")
                    if item:
                        self.reads.append(item["path"])
                        self.gate["reads"].clear()
                        entries = DIRECTORIES.get(item["path"])
                        self.post(f"/api/worker/reads/{item['id']}/complete",
                                  {"lease_id": item["lease_id"], "entries": entries or [],
                                   "error": None if entries is not None else "not_found"})
                time.sleep(0.05)
        except Exception as error:  # noqa: BLE001 — reported by the test
            self.errors.append(repr(error))

    def release(self, gate: str):
        self.gate[gate].set()

    def stop(self):
        self.stopping.set()
        self.join(timeout=10)


@pytest.fixture
def http_worker(live_server, world):
    workers = []

    def start(**kwargs) -> HttpWorker:
        worker = HttpWorker(live_server.url, world.worker_token, **kwargs)
        worker.hello()
        worker.start()
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()


def sign_in_and_open_add(browser, live_server):
    from playwright.sync_api import expect

    page = browser.page
    browser.goto("/login/?next=/settings/computers/")
    page.fill("#id_username", "root")
    page.fill("#id_password", "root-pass-123")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("h1")).to_have_text("Computers")
    page.evaluate("window.__sameDocument = true")  # gone if anything below reloads the page
    page.get_by_role("link", name="Add computer").click()
    dialog = page.locator("dialog#dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator("#dialog-title")).to_have_text("Add computer")
    return page, dialog


def fill_step_1(dialog, name: str):
    from playwright.sync_api import expect

    # The only online worker is already chosen, and its key candidates are offered.
    expect(dialog.locator("#id_worker option:checked")).to_have_text("lab-worker-1 (lab, worker-host)")
    expect(dialog.locator(f'#ssh-key-options option[value="{KEY}"]')).to_have_count(1)
    expect(dialog.locator(f'#known-hosts-options option[value="{KNOWN_HOSTS}"]')).to_have_count(1)
    dialog.locator("#id_name").fill(name)
    note = dialog.locator("#public-ssh-user-note")
    expect(note).to_be_hidden()
    dialog.locator("#id_visibility").select_option("public")
    expect(note).to_be_visible()  # every project's Jobs run as this one SSH user
    dialog.locator("#id_host").fill(f"{name}.example.internal")
    dialog.locator("#id_ssh_user").fill("mmt")
    dialog.locator("#id_ssh_key_path").fill(KEY)
    dialog.locator("#id_known_hosts_path").fill(KNOWN_HOSTS)


def test_an_admin_adds_a_computer_through_both_steps_with_a_worker_answering_in_chromium(
    transactional_db, live_server, world, chromium_page, http_worker  # noqa: F811
):
    from playwright.sync_api import expect

    started = time.monotonic()
    browser = chromium_page
    worker = http_worker(check_status="succeeded", check_result=good_result())
    page, dialog = sign_in_and_open_add(browser, live_server)
    fill_step_1(dialog, "gpu-host-1")
    browser.screenshot("computers-add-step1.png")

    # Check connection and continue: registered disabled, then the worker's progress, then step 2 by itself.
    dialog.get_by_role("button", name="Check connection and continue").click()
    progress = dialog.locator("#check-progress")
    expect(progress).to_contain_text("Waiting for the worker to start checking…")
    target = ComputeTarget.objects.get(name="gpu-host-1")
    assert target.enabled is False
    expect(page.locator('#computer-list tr[data-computer="gpu-host-1"]')).to_contain_text("Disabled")
    browser.screenshot("computers-add-waiting.png")
    worker.release("claim_check")
    expect(progress).to_contain_text("The worker is checking the connection…", timeout=8_000)
    worker.release("complete_check")
    expect(dialog.locator('.steps li[aria-current="step"]')).to_have_text("2. Settings after connecting",
                                                                         timeout=8_000)

    # Step 2 opens filled in from the check.
    expect(dialog.locator(".check-summary")).to_contain_text("Connection verified")
    expect(dialog.locator(".check-summary")).to_contain_text("amd64 · 32 cores · 251.5 GiB memory")
    expect(dialog.locator("#id_python_path")).to_have_value("/usr/bin/python3")
    expect(dialog.locator("#id_cpu_arch")).to_have_value("amd64")
    expect(dialog.locator('input[name="runtimes"][value="python"]')).to_be_checked()
    expect(dialog.locator('input[name="runtimes"][value="docker"]')).to_be_checked()
    expect(dialog.locator('input[name="runtimes"][value="apptainer"]')).not_to_be_checked()
    gpu0 = dialog.locator('input[name="gpu_detected"][value="0"]')
    gpu1 = dialog.locator('input[name="gpu_detected"][value="1"]')
    expect(gpu0).to_be_checked()
    expect(gpu1).to_be_checked()
    gpu_ids = dialog.locator("#id_gpu_ids")
    concurrency = dialog.locator("#id_concurrency")
    expect(gpu_ids).to_have_value("0\n1")
    expect(concurrency).to_have_value("2")
    expect(dialog.locator("#id_working_dir")).to_have_value("")
    expect(dialog.locator('#working_dir-options option[value="/data"]')).to_have_attribute(
        "label", "writable · 4.5\u00a0TB free")
    dialog.locator("summary", has_text="Check details").click()
    expect(dialog.locator('.check-summary tr[data-item="connection"]')).to_contain_text("OK")
    browser.screenshot("computers-add-step2.png")

    # The GPU checkboxes drive GPU IDs, and Concurrent jobs follows until changed by hand.
    gpu1.uncheck()
    expect(gpu_ids).to_have_value("0")
    expect(concurrency).to_have_value("1")
    gpu1.check()
    expect(gpu_ids).to_have_value("0\n1")
    expect(concurrency).to_have_value("2")
    concurrency.fill("4")
    gpu0.uncheck()
    expect(gpu_ids).to_have_value("1")
    expect(concurrency).to_have_value("4")
    gpu0.check()
    expect(gpu_ids).to_have_value("0\n1")

    # Working directory: a path ending in "/" has the worker list it; hidden entries after a ".".
    workdir = dialog.locator("#id_working_dir")
    workdir.fill("/data/")
    reading = dialog.locator("#working_dir-assist .reading")
    expect(reading).to_contain_text("The worker is listing directories…")
    browser.screenshot("computers-add-reading.png")
    worker.release("reads")
    expect(dialog.locator('#working_dir-options option[value="/data/mmt-jobs/"]')).to_have_count(1, timeout=8_000)
    expect(reading).to_have_count(0)
    expect(dialog.locator('#working_dir-options option[value="/data/.cache/"]')).to_have_count(0)
    workdir.fill("/data/.")
    expect(dialog.locator('#working_dir-options option[value="/data/.cache/"]')).to_have_count(1)
    workdir.fill("/data/mmt-jobs")

    # Python: a second read offers the executables of /usr/local/bin/.
    python = dialog.locator("#id_python_path")
    python.fill("/usr/local/bin/")
    expect(dialog.locator("#python_path-assist .reading")).to_contain_text("The worker is listing directories…")
    worker.release("reads")
    option = dialog.locator('#python_path-options option[value="/usr/local/bin/python3.12"]')
    expect(option).to_have_attribute("label", "executable", timeout=8_000)
    expect(dialog.locator('#python_path-options option[value="/usr/bin/python3"]')).to_have_count(1)
    python.fill("/usr/local/bin/python3.12")
    assert worker.reads == ["/data/", "/usr/local/bin/"]
    browser.screenshot("computers-add-candidates.png")

    # Save: the dialog closes, the computer is enabled and its details open below the list.
    expect(dialog.locator("#id_enabled")).to_be_checked()
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    details = page.locator("#computer-details")
    expect(details.locator("#computer-id")).to_have_text(str(target.pk))
    expect(details.locator("h2")).to_have_text("gpu-host-1")
    expect(details).to_contain_text(f"--target-ids {target.pk}")
    expect(details.locator("#connection-check")).to_contain_text("Connection verified")
    expect(page.locator('#computer-list tr[data-computer="gpu-host-1"]')).to_contain_text("Enabled")
    expect(page).to_have_url(f"{live_server.url}/settings/computers/{target.pk}/")
    assert page.evaluate("window.__sameDocument") is True, "the list refreshed by reloading the page"
    page.set_viewport_size({"width": 1200, "height": 1400})
    browser.screenshot("computers-details.png")
    target.refresh_from_db()
    assert target.enabled and target.working_dir == "/data/mmt-jobs"
    assert target.python_path == "/usr/local/bin/python3.12"
    assert target.gpu_ids == ["0", "1"] and target.concurrency == 4
    assert target.runtimes == ["python", "docker"] and target.visibility == "public"
    assert target.last_check_worker.worker_id == "lab-worker-1"

    assert worker.errors == [] and len(worker.checks) == 1
    assert browser.js_errors == []
    assert time.monotonic() - started < 45


def test_a_failed_check_shows_the_resolution_and_continue_without_checking_goes_on_in_chromium(
    transactional_db, live_server, world, chromium_page, http_worker  # noqa: F811
):
    from playwright.sync_api import expect

    browser = chromium_page
    worker = http_worker(check_status="failed", check_result=failed_result())
    page, dialog = sign_in_and_open_add(browser, live_server)
    fill_step_1(dialog, "gpu-host-2")
    worker.release("claim_check")
    worker.release("complete_check")
    dialog.get_by_role("button", name="Check connection and continue").click()

    # Step 1 stays, with the reason and the per-item table.
    result = dialog.locator("#check-result")
    expect(result).to_contain_text("Could not verify connection", timeout=8_000)
    expect(dialog.locator('.steps li[aria-current="step"]')).to_have_text("1. Connection")
    row = result.locator('tr[data-item="connection"]')
    expect(row).to_contain_text("SSH connection")
    expect(row).to_contain_text("Failed")
    expect(row.locator("td.resolution")).to_contain_text(
        "Check the host, port, and SSH user, that the public key is in the target's ~/.ssh/authorized_keys")
    expect(result.locator('tr[data-item="python"]')).to_contain_text("Not checked")
    expect(dialog.locator("#id_host")).to_have_value("gpu-host-2.example.internal")
    browser.screenshot("computers-add-failed.png")

    # Continue without checking: step 2 without candidates; save it disabled.
    dialog.get_by_role("button", name="Continue without checking").click()
    expect(dialog.locator('.steps li[aria-current="step"]')).to_have_text("2. Settings after connecting")
    expect(dialog.locator(".check-summary")).to_contain_text("Not checked: no candidates.")
    expect(dialog.locator("#working_dir-options option")).to_have_count(0)
    expect(dialog.locator('input[name="gpu_detected"]')).to_have_count(0)
    dialog.locator("#id_enabled").uncheck()
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    target = ComputeTarget.objects.get(name="gpu-host-2")
    expect(page.locator("#computer-details #computer-id")).to_have_text(str(target.pk))
    expect(page.locator('#computer-list tr[data-computer="gpu-host-2"]')).to_contain_text("Disabled")
    expect(page.locator("#connection-check")).to_contain_text("Could not verify connection")
    assert not target.enabled and target.checks.get().status == "failed"
    assert worker.errors == [] and worker.reads == []
    assert browser.js_errors == []


def test_edit_computer_switches_tabs_checks_again_and_the_details_check_the_connection_in_chromium(
    transactional_db, live_server, world, chromium_page, http_worker  # noqa: F811
):
    from playwright.sync_api import expect

    from tests.computer_fixtures import make_computer

    target = make_computer(world.global_admin, "gpu-host-3", visibility="public", working_dir="/data/old",
                           python_path="/usr/bin/python3", gpu_ids=["0"], runtimes=["python"])
    browser = chromium_page
    worker = http_worker(check_status="succeeded", check_result=good_result())
    page = browser.page
    browser.goto("/login/?next=/settings/computers/")
    page.fill("#id_username", "root")
    page.fill("#id_password", "root-pass-123")
    page.get_by_role("button", name="Sign in").click()
    row = page.locator('tr[data-computer="gpu-host-3"]')
    row.get_by_role("link", name="Edit computer").click()
    dialog = page.locator("dialog#dialog")
    expect(dialog.locator("#dialog-title")).to_have_text("Edit computer gpu-host-3")

    # Tabs: one panel at a time.
    connection_tab = dialog.locator("#tab-connection")
    settings_tab = dialog.locator("#tab-settings")
    expect(connection_tab).to_be_visible()
    expect(settings_tab).to_be_hidden()
    dialog.get_by_role("tab", name="Settings after connecting").click()
    expect(settings_tab).to_be_visible()
    expect(connection_tab).to_be_hidden()
    expect(dialog.locator("#id_working_dir")).to_have_value("/data/old")
    dialog.get_by_role("tab", name="Connection").click()
    expect(connection_tab).to_be_visible()

    # Changing a connection field announces that Check again saves it first.
    notice = dialog.get_by_text("Unsaved connection changes will be saved before checking.")
    expect(notice).to_be_hidden()
    dialog.locator("#id_host").fill("gpu-host-3b.example.internal")
    expect(notice).to_be_visible()
    dialog.locator("#id_worker").select_option(label="lab-worker-1 (lab, worker-host)")
    expect(dialog.locator(f'#ssh-key-options option[value="{KEY}"]')).to_have_count(1)
    worker.release("claim_check")
    worker.release("complete_check")
    dialog.get_by_role("button", name="Check again").click()
    expect(dialog.locator("#check-result")).to_contain_text("Connection verified", timeout=8_000)
    expect(dialog.locator("#id_host")).to_have_value("gpu-host-3b.example.internal")
    target.refresh_from_db()
    assert target.host == "gpu-host-3b.example.internal" and target.working_dir == "/data/old"
    browser.screenshot("computers-edit-checked.png")

    # The refreshed candidates are in the Settings tab; the values entered before stay.
    dialog.get_by_role("tab", name="Settings after connecting").click()
    expect(dialog.locator("#id_working_dir")).to_have_value("/data/old")
    expect(dialog.locator('#working_dir-options option[value="/data"]')).to_have_count(1)
    expect(dialog.locator('input[name="gpu_detected"][value="0"]')).to_be_checked()
    expect(dialog.locator('input[name="gpu_detected"][value="1"]')).not_to_be_checked()
    dialog.locator('input[name="gpu_detected"][value="1"]').check()
    expect(dialog.locator("#id_gpu_ids")).to_have_value("0\n1")
    expect(dialog.locator("#id_concurrency")).to_have_value("2")
    dialog.locator("#id_working_dir").fill("/data")
    browser.screenshot("computers-edit-settings.png")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    details = page.locator("#computer-details")
    expect(details.locator("h2")).to_have_text("gpu-host-3")
    target.refresh_from_db()
    assert target.gpu_ids == ["0", "1"] and target.concurrency == 2 and target.working_dir == "/data"

    # Check connection in the details asks the worker of the last check again.
    panel = page.locator("#connection-check")
    expect(panel).to_contain_text("Connection verified")  # the check of the editor
    details.get_by_role("button", name="Check connection").click()
    expect(panel).to_contain_text("Waiting for the worker to start checking…")
    expect(panel.get_by_role("button", name="Check connection")).to_be_disabled()
    worker.release("claim_check")
    worker.release("complete_check")
    expect(panel).to_contain_text("Connection verified", timeout=8_000)
    expect(panel.locator('tr[data-item="api"]')).to_contain_text("OK")
    assert [c["computer"]["id"] for c in worker.checks] == [target.pk, target.pk]
    expect(page.locator("#suggested-settings")).to_contain_text("Save selected settings")
    page.locator('#suggested-settings input[name="runtimes"][value="docker"]').check()
    page.locator('#suggested-settings input[name="runtimes"][value="python"]').check()
    page.get_by_role("button", name="Save selected settings").click()
    expect(page.locator("#suggested-settings")).to_contain_text("Saved the selected settings.")
    target.refresh_from_db()
    assert target.runtimes == ["python", "docker"]
    assert worker.errors == [] and browser.js_errors == []
