"""The README's short tour (steps 1–12) in real Chromium, walked as a new lab administrator does it: once in
English and once in Japanese (日本語 chosen in the user menu).

The world is the one `make run` makes: the real `demo` management command (admin, project `demo`, the
`local-worker` service account and its token in var/worker-token, the Local computer `local` and the
`hello-local` job), a real `mado-tracking-worker run` started as `make run` starts it (MADO_DEV_MODE,
MMT_ALLOW_LOCAL_EXECUTOR, the token file, MMT_WORKER_TARGET_IDS naming the Local computer) against the live
server on PostgreSQL, plus a second project from `manage.py create_project` so the project switcher has
somewhere to go.

Each numbered step starts from a page reached the way the README says and records its failure without
stopping the walk, so one run tells every step that does not work; the test fails if any step failed. In
Japanese every page visited is also checked for English words left in its headings, navigation, table
headers, labels and buttons (the product's own terms that the seeds keep in English — Job, Project in
phrases, Compute, Workers, Service Accounts, Role, Admin, token, Site, Artifacts — are allowed)."""
from __future__ import annotations

import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

import pytest
import requests
from django.core.management import call_command

from computers.models import ComputeTarget
from jobs.models import Job
from mado.models import ApiToken, ServiceAccount
from tests.agent_e2e_jobs.conftest import CLAIM_WAIT, WorkerProcess, wait_until
from tests.support import database_now, other_sessions
from tests.browser import chromium_page, sign_in  # noqa: F401  (chromium_page: fixture)
from tests.support import kill_processes_under

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = pytest.mark.browser

SECOND_PROJECT = ("vision-lab", "Vision Lab")
JOB_WAIT_MS = 120_000  # the first job of a Local computer builds its venv
CHECK_WAIT_MS = 60_000

# What the pages say, from locale/ja/LC_MESSAGES/django.po and the seeds' Japanese texts (the Jobs page is
# "Jobs" there: "Jobsの［停止を要求］"; the top bar's Project and the Jobs list's Status have contexts of their
# own, "top bar" and "job status", since the Workers table's 担当Job数/接続状態 are other senses: issue 15, item 9).
LABELS = {
    "en": {
        "project": "Project", "global_settings": "Global settings", "global_admin": "Global administration",
        "language": "Language", "sign_out": "Sign out", "your_projects": "Your projects", "admin": "Admin",
        "project_settings": "Project settings", "service_accounts": "Service Accounts",
        "create_sa": "Create Service Account", "save": "Save", "issue_token": "Issue API token", "issue": "Issue",
        "done": "Done", "project_tokens": "Project tokens", "notifications": "Notifications", "add_rule": "Add rule",
        "computers": "Computers", "connection_check": "Connection check", "check_connection": "Check connection",
        "verified": "Connection verified", "ok": "OK", "compute": "Compute", "workers": "Workers",
        "online": "Online", "jobs": "Jobs", "status": "Status", "finished": "Finished", "logs": "Logs",
        "timeline": "Timeline", "metrics": "Metrics", "create_job": "Create job", "add_computer": "Add computer",
        "submission": "Submission method", "cancel": "Cancel", "cluster": "Cluster", "cluster_mode": "Cluster mode",
        "cluster_size": "Cluster size", "single_node": "Single node", "multi_node": "Multi node",
        "datasets": "Datasets", "no_datasets": "No datasets yet.",
    },
    "ja": {
        "project": "プロジェクト", "global_settings": "全体設定", "global_admin": "全体管理", "language": "言語",
        "sign_out": "ログアウト", "your_projects": "参加しているProject", "admin": "Admin",
        "project_settings": "プロジェクト設定", "service_accounts": "Service Accounts",
        "create_sa": "Service Accountを作成", "save": "保存", "issue_token": "API tokenを発行", "issue": "発行",
        "done": "完了", "project_tokens": "Projectのtoken一覧", "notifications": "通知", "add_rule": "ルールを追加",
        "computers": "コンピュータ", "connection_check": "接続確認", "check_connection": "接続を確認",
        "verified": "接続を確認しました", "ok": "OK", "compute": "Compute", "workers": "Workers",
        "online": "オンライン", "jobs": "Jobs", "status": "状態", "finished": "完了", "logs": "ログ",
        "timeline": "タイムライン", "metrics": "メトリクス", "create_job": "Jobを作成", "add_computer": "コンピュータを追加",
        "submission": "投入方法", "cancel": "キャンセル", "cluster": "クラスター", "cluster_mode": "クラスターモード",
        "cluster_size": "クラスターサイズ", "single_node": "シングルノード", "multi_node": "マルチノード",
        "datasets": "データセット", "no_datasets": "まだデータセットはありません。",
    },
}

# English words a Japanese page must not show in its headings, navigation, table headers, labels and
# buttons. Not listed: the product's terms the seeds keep in English (Job, Jobs, Compute, Workers, worker,
# Service Account(s), Role, Admin, token, Site, Runtime, Artifacts, Python, GPU, API, SSH, OK).
ENGLISH_UI_WORDS = (
    "Status", "Settings", "Global", "Computers", "Computer", "Datasets", "Dataset", "Logs", "Metrics", "Timeline",
    "Details", "Online", "Offline", "Language", "Notifications", "Create", "Add", "Check", "Name", "Type", "Owner",
    "Visibility", "State", "Actions", "Sign", "Cluster", "Parameters", "Command", "Created", "Started", "Ended",
    "Creator", "Queued", "Running", "Finished", "Failed", "Canceled", "Enabled", "Disabled", "Save", "Cancel",
    "Close", "Done", "Copy", "Issue", "Revoke", "Tokens", "Connection", "Version", "Description", "Scopes",
    "Expires", "Submission", "Method", "by",
)
ENGLISH_WORD = re.compile(r"(?<![A-Za-z_\-./:#])(" + "|".join(ENGLISH_UI_WORDS) + r")(?![A-Za-z_\-])")
UI_TEXT = ("h1, h2, h3, legend, th, nav, .crumbs, .topbar label, label, button, a.button, summary, "
           "#dialog-title, .check-headline, #job-timeline strong")


@dataclass
class DemoWorld:
    """What `make run` leaves behind, and the worker it runs."""
    password: str
    worker_token: str
    local: ComputeTarget
    worker: WorkerProcess
    var: Path


@pytest.fixture
def demo_world(transactional_db, live_server, settings, tmp_path):
    since = database_now()  # sessions idle since before this are other tests' (support.other_sessions)
    var = tmp_path / "var"
    settings.VAR_DIR = var
    settings.DEV_MODE = True  # MADO_DEV_MODE=true, as `make run` sets for `manage.py demo` and the server
    call_command("demo", stdout=StringIO())
    call_command("create_project", SECOND_PROJECT[0], "--name", SECOND_PROJECT[1], "--admin", "admin",
                 stdout=StringIO())
    local = ComputeTarget.objects.get(name="local")
    home, ssh_dir = tmp_path / "home", tmp_path / "ssh"
    home.mkdir()
    ssh_dir.mkdir()
    # As `make run`: the token from its file (MMT_API_TOKEN left empty), the Local executor allowed twice
    # over, and MMT_WORKER_TARGET_IDS="$(cat var/worker-target-ids)", the Local computer's id that
    # `manage.py demo` writes there (issue 15, item 1). Without that file `make run` passes an empty value,
    # and so does the walk: step 6 then shows what `make run` would.
    ids_file = var / "worker-target-ids"
    target_ids = ids_file.read_text().strip() if ids_file.exists() else ""
    worker = WorkerProcess(live_server.url, "", var / "worker-state", home, ssh_dir, tmp_path,
                           worker_id="local-worker", extra_env={
                               "MMT_API_TOKEN_FILE": str(var / "worker-token"), "MADO_DEV_MODE": "true",
                               "MMT_ALLOW_LOCAL_EXECUTOR": "true", "MMT_WORKER_TARGET_IDS": target_ids})
    world = DemoWorld(password=(var / "admin-password").read_text().strip(),
                      worker_token=(var / "worker-token").read_text().strip(), local=local, worker=worker, var=var)
    try:
        yield world
    finally:
        worker.stop()
        kill_processes_under(str(var / "local-jobs"))
        try:
            wait_until(lambda: not other_sessions(since), timeout=CLAIM_WAIT + 15, interval=0.1)
        except AssertionError:
            raise AssertionError(f"database sessions still open: {other_sessions(since)}") from None


class TourWalk:
    """One walk of the tour in one language; a failed step is recorded with a screenshot, the walk goes on."""

    def __init__(self, browser, world: DemoWorld, lang: str, live_url: str):
        self.browser = browser
        self.page = browser.page
        self.world = world
        self.lang = lang
        self.t = LABELS[lang]
        self.url = live_url
        self.failures: list[str] = []
        self.english_left: dict[str, set[str]] = {}

    # -- bookkeeping --------------------------------------------------------------------------------

    @contextmanager
    def step(self, name: str):
        try:
            yield
        except Exception as error:  # noqa: BLE001  (AssertionError and Playwright's errors: reported below)
            slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40]
            try:
                shot = self.browser.screenshot(f"tour-{self.lang}-{slug}.png")
            except Exception:  # noqa: BLE001
                shot = "no screenshot"
            if any(f.startswith(f"[{self.lang}] {name}:") for f in self.failures):
                return  # the same check on another visit: told once
            message = str(error).strip().splitlines()
            self.failures.append(f"[{self.lang}] {name}: {type(error).__name__}: "
                                 + " | ".join(line.strip() for line in message[:8] if line.strip())
                                 + f" (screenshot {shot}, page {self.page.url})")

    def japanese_only(self, where: str) -> None:
        """In Japanese, remember the English words left on this page (reported once at the end)."""
        if self.lang != "ja":
            return
        texts = self.page.eval_on_selector_all(UI_TEXT, "els => els.map(e => e.textContent)")
        for text in texts:
            for line in text.splitlines():
                line = " ".join(line.split())
                if line and (ENGLISH_WORD.search(line) or line == "Project"):
                    self.english_left.setdefault(where, set()).add(line[:80])

    def expect_label(self, locator, key: str) -> None:
        from playwright.sync_api import expect

        expect(locator).to_have_text(self.t[key])

    def project_home(self) -> None:
        from playwright.sync_api import expect

        self.page.locator("a.brand").click()  # the brand leads to the first project, demo
        expect(self.page.locator("h1")).to_have_text("Demo")

    def user_menu(self):
        menu = self.page.locator("details.user-menu")
        if menu.get_attribute("open") is None:
            menu.locator("summary").click()
        return menu

    def global_settings(self) -> None:
        from playwright.sync_api import expect

        self.user_menu().get_by_role("link", name=self.t["global_settings"], exact=True).click()
        expect(self.page.locator("h1")).to_have_text(self.t["global_settings"])

    # -- the tour -----------------------------------------------------------------------------------

    def walk(self) -> None:
        page = self.page
        from playwright.sync_api import expect

        with self.step("1 sign in as admin, land on demo"):
            sign_in(self.browser, "admin", self.world.password)
            expect(page.locator("h1")).to_have_text("Demo")
            assert page.url == f"{self.url}/projects/demo/", page.url

        if self.lang == "ja":
            with self.step("2 user menu: Language → 日本語"):
                menu = self.user_menu()
                menu.locator("#language").select_option("ja")  # choosing is submitting
                expect(page.locator("html")).to_have_attribute("lang", "ja")
                expect(page.locator("h1")).to_have_text("Demo")
                expect(self.user_menu().locator("#language")).to_have_value("ja")

        with self.step("2 user menu: language names, global settings"):
            menu = self.user_menu()
            expect(menu.locator("summary")).to_have_text("admin")
            with self.step("2 user menu: each language by its own name"):
                # README: "Language: English / 日本語" — each language by its own name, whatever the page's.
                expect(menu.locator("#language option")).to_have_text(["English", "日本語"])
            expect(menu.locator("label[for=language]")).to_have_text(self.t["language"])
            expect(menu.get_by_role("link", name=self.t["global_admin"], exact=True)).to_be_visible()
            expect(menu.get_by_role("button", name=self.t["sign_out"], exact=True)).to_be_visible()
            self.japanese_only("project home")
            self.global_settings()
            expect(page.locator("h2").first).to_have_text(self.t["your_projects"])
            projects = page.locator("table").first
            demo = projects.locator("tr", has=page.get_by_role("link", name="Demo", exact=True))
            expect(demo).to_contain_text(self.t["admin"])  # README: your projects and your role in each
            other = projects.locator("tr", has=page.get_by_role("link", name=SECOND_PROJECT[1], exact=True))
            expect(other).to_contain_text(self.t["admin"])
            self.japanese_only("Global settings")

        with self.step("3 project switcher"):
            self.project_home()
            self.expect_label(page.locator("label[for=project-switch]"), "project")
            page.locator("#project-switch").select_option(SECOND_PROJECT[0])
            expect(page.locator("h1")).to_have_text(SECOND_PROJECT[1])
            page.locator("#project-switch").select_option("demo")
            expect(page.locator("h1")).to_have_text("Demo")

        with self.step("4 Service Accounts: create one, issue a token, see it once"):
            self.project_home()
            settings_nav = page.locator("nav.tabs", has_text=self.t["project_settings"])
            settings_nav.get_by_role("link", name=self.t["service_accounts"], exact=True).click()
            expect(page.locator("h1")).to_have_text(self.t["service_accounts"])
            expect(page.locator('tr[data-service-account="local-worker"]')).to_be_visible()
            self.japanese_only("Service Accounts")
            dialog = page.locator("dialog#dialog")
            page.get_by_role("link", name=self.t["create_sa"], exact=True).click()
            expect(dialog.locator("#dialog-title")).to_have_text(self.t["create_sa"])
            dialog.locator("#id_name").fill("tour-worker")
            dialog.locator("#id_role").select_option("admin")
            self.japanese_only("Create Service Account")
            dialog.get_by_role("button", name=self.t["save"], exact=True).click()
            expect(dialog).to_be_hidden()
            row = page.locator('tr[data-service-account="tour-worker"]')
            expect(row).to_contain_text(self.t["admin"])
            row.get_by_role("link", name=self.t["issue_token"], exact=True).click()
            expect(dialog.locator("#dialog-title")).to_have_text(self.t["issue_token"])
            dialog.locator('input[name="scopes"][value="read"]').check()
            dialog.locator('input[name="scopes"][value="worker:execute"]').check()
            self.japanese_only("Issue API token")
            dialog.get_by_role("button", name=self.t["issue"], exact=True).click()
            issued = dialog.locator("#issued-token")
            expect(issued).to_be_visible()
            plaintext = issued.inner_text().strip()
            assert re.fullmatch(r"mmt_[A-Za-z0-9_-]{43}", plaintext), plaintext
            answer = requests.get(f"{self.url}/api/auth/token", timeout=5,
                                  headers={"Authorization": f"Bearer {plaintext}", "Connection": "close"})
            assert answer.status_code == 200 and answer.json()["scopes"] == ["read", "worker:execute"], answer.text
            dialog.get_by_role("button", name=self.t["done"], exact=True).click()
            expect(dialog).to_be_hidden()
            page.reload()
            expect(page.locator('tr[data-service-account="tour-worker"]')).to_be_visible()
            assert plaintext not in page.content(), "the token is shown again after a reload"
            self.issued_prefix = plaintext[:12]

        with self.step("5 Project tokens and Notifications"):
            self.project_home()
            settings_nav = page.locator("nav.tabs", has_text=self.t["project_settings"])
            settings_nav.get_by_role("link", name=self.t["project_tokens"], exact=True).click()
            expect(page.locator("h1")).to_have_text(self.t["project_tokens"])
            prefix = getattr(self, "issued_prefix", None) or ApiToken.objects.filter(
                user__service_account__name="tour-worker").values_list("prefix", flat=True).first()
            assert prefix, "no token of tour-worker to look for (step 4 failed before issuing one)"
            expect(page.locator(f'tr[data-token-prefix="{prefix}"]')).to_contain_text("tour-worker")
            demo_prefix = self.world.worker_token[:12]
            expect(page.locator(f'tr[data-token-prefix="{demo_prefix}"]')).to_contain_text("local-worker")
            self.japanese_only("Project tokens")
            page.locator("nav.tabs", has_text=self.t["project_settings"]).get_by_role(
                "link", name=self.t["notifications"], exact=True).click()
            expect(page.locator("h1")).to_have_text(self.t["notifications"])
            expect(page.get_by_role("link", name=self.t["add_rule"], exact=True)).to_be_visible()
            self.japanese_only("Notifications")

        with self.step("6 Computers: local's details, Check connection"):
            self.global_settings()
            page.locator("nav.settings-sidebar").get_by_role("link", name=self.t["computers"], exact=True).click()
            expect(page.locator("h1")).to_have_text(self.t["computers"])
            page.locator('#computer-list tr[data-computer="local"]').get_by_role("link", name="local",
                                                                                 exact=True).click()
            details = page.locator("#computer-details")
            expect(details).to_have_attribute("data-computer-id", str(self.world.local.pk))
            expect(details.locator("h2").first).to_have_text("local")
            panel = page.locator("#connection-check")
            expect(panel.locator("h3")).to_have_text(self.t["connection_check"])
            self.japanese_only("Computers: local")
            panel.get_by_role("button", name=self.t["check_connection"], exact=True).click()
            headline = page.locator("#connection-check .check-headline")
            expect(headline).to_contain_text(self.t["verified"], timeout=CHECK_WAIT_MS)
            expect(page.locator("#connection-check")).to_contain_text("local-worker")
            for item in ("command_execution", "python", "work_directory"):
                expect(page.locator(f'#connection-check tr[data-item="{item}"] .badge')).to_have_text(self.t["ok"])
            self.japanese_only("Computers: connection check")

        with self.step("7 Compute: the worker is Online"):
            self.project_home()
            page.locator("nav.tabs").get_by_role("link", name=self.t["compute"], exact=True).click()
            expect(page.locator("h1")).to_have_text(self.t["compute"])
            expect(page.locator('table.usable-computers tr[data-computer="local"]')).to_be_visible()
            expect(page.locator("h2", has_text=self.t["workers"])).to_be_visible()
            expect(page.locator('table.workers tr[data-worker="local-worker"]')).to_contain_text(self.t["online"])
            self.japanese_only("Compute")

        with self.step("8a Jobs: hello-local ran, with its logs and the demo.loss chart"):
            self.project_home()
            self.open_jobs()
            hello = Job.objects.get(name="hello-local")
            row = page.locator(f'tr[data-job="{hello.pk}"]')
            expect(row.locator(".status")).to_have_text(self.t["finished"], timeout=JOB_WAIT_MS)
            with self.step("8 Jobs list: the Status column"):
                self.expect_label(page.locator("table.jobs th").nth(1), "status")
            self.japanese_only("Jobs")
            row.get_by_role("link", name="hello-local", exact=True).click()
            expect(page.locator("#job-head h1")).to_contain_text("hello-local")
            expect(page.locator("#job-status")).to_contain_text(self.t["finished"])
            expect(page.locator("#log-output")).to_contain_text("step 2: hello from the local computer")
            # The Job's Run panel draws its demo.loss chart; jobs' own Metrics panel would draw it twice.
            expect(page.locator('#run-panel figure[data-metric="demo.loss"] polyline')).to_have_count(1)
            expect(page.locator("#job-metrics")).to_have_count(0)
            expect(page.locator("#job-timeline h2")).to_have_text(self.t["timeline"])
            expect(page.locator("#job-timeline li")).not_to_have_count(0)
            expect(page.locator("section.logs h2")).to_have_text(self.t["logs"])
            expect(page.locator("#run-panel #run-metrics-title")).to_have_text(self.t["metrics"])
            with self.step("8 Jobs: the breadcrumb to the Jobs page"):
                self.expect_label(page.locator(".crumbs a").nth(1), "jobs")
            self.japanese_only("Job hello-local")
            shot = self.browser.screenshot(f"tour-{self.lang}-job.png")
            page.screenshot(path=str(shot), full_page=True)
            if self.lang == "ja":
                timeline = page.locator("#job-timeline").inner_text()
                assert not re.search(r"\bby\b|exit code", timeline), f"English left in the timeline: {timeline!r}"

        with self.step("8b Create job: python -c, its logs"):
            self.project_home()
            self.open_jobs()
            page.get_by_role("link", name=self.t["create_job"], exact=True).click()
            expect(page.locator("h1")).to_have_text(self.t["create_job"])
            page.fill("#id_name", "tour-hello")
            page.locator("#id_computer").select_option(str(self.world.local.pk))
            expect(page.locator("#id_runtime")).to_have_value("python")
            page.fill("#id_command", """python -c "print('hello')\"""")
            self.japanese_only("Create job")
            page.locator("#job-form").get_by_role("button", name=self.t["create_job"], exact=True).click()
            expect(page.locator("#job-head h1")).to_contain_text("tour-hello")
            job = Job.objects.get(name="tour-hello", project__slug="demo")
            assert job.command == ["python", "-c", "print('hello')"], job.command
            expect(page.locator("#log-output")).to_have_text(re.compile(r"^\s*hello\s*$", re.M), timeout=JOB_WAIT_MS)
            expect(page.locator("#job-status")).to_contain_text(self.t["finished"], timeout=JOB_WAIT_MS)
            self.japanese_only("Job tour-hello")

        with self.step("9 Sites: Add computer with Type Site shows the site form"):
            self.global_settings()
            page.locator("nav.settings-sidebar").get_by_role("link", name=self.t["computers"], exact=True).click()
            page.get_by_role("link", name=self.t["add_computer"], exact=True).click()
            dialog = page.locator("dialog#dialog")
            expect(dialog.locator("#dialog-title")).to_have_text(self.t["add_computer"])
            dialog.locator("#id_kind").select_option("site")
            expect(dialog.locator("#site-form")).to_be_visible()
            expect(dialog.locator("#id_known_hosts")).to_be_visible()
            expect(dialog.locator('[data-field="submission"] legend')).to_have_text(self.t["submission"])
            expect(dialog.locator("#id_template option")).not_to_have_count(0)
            self.japanese_only("Add computer: Site")
            dialog.get_by_role("button", name=self.t["cancel"], exact=True).click()
            expect(dialog).to_be_hidden()

        with self.step("10 Cluster job fields on Create job"):
            self.project_home()
            self.open_jobs()
            page.get_by_role("link", name=self.t["create_job"], exact=True).click()
            fields = page.locator("#cluster-fields")
            expect(fields.locator("legend").first).to_have_text(self.t["cluster"])
            expect(fields.locator('label[for="id_cluster_mode"]')).to_contain_text(self.t["cluster_mode"])
            expect(fields.locator("#id_cluster_mode option")).to_have_text([self.t["single_node"],
                                                                            self.t["multi_node"]])
            expect(fields.locator('label[for="id_cluster_size"]')).to_contain_text(self.t["cluster_size"])
            expect(fields.locator("#id_cluster_size")).to_have_value("1")

        with self.step("11 Datasets"):
            self.project_home()
            page.locator("nav.tabs").get_by_role("link", name=self.t["datasets"], exact=True).click()
            expect(page.locator("h1")).to_have_text(self.t["datasets"])
            expect(page.locator("main")).to_contain_text(self.t["no_datasets"])
            self.japanese_only("Datasets")

        with self.step("12 API docs"):
            self.browser.goto("/api/docs/")
            expect(page.locator(".swagger-ui .info .title")).to_contain_text("Mado Compute API", timeout=30_000)
            expect(page.locator(".swagger-ui .opblock").first).to_be_visible()
            answer = requests.get(f"{self.url}/api/auth/token", timeout=5, headers={
                "Authorization": f"Bearer {self.world.worker_token}", "Connection": "close"})
            assert answer.status_code == 200 and answer.json()["project"] == "demo", answer.text

        with self.step("Japanese: no English words left"):
            assert not self.english_left, "English in the Japanese pages: " + "; ".join(
                f"{where}: {sorted(lines)}" for where, lines in self.english_left.items())

        with self.step("no browser errors"):
            assert self.browser.js_errors == [], self.browser.js_errors

    def open_jobs(self) -> None:
        """Project page → Jobs."""
        from playwright.sync_api import expect

        tab = self.page.locator('nav.tabs a[href="/projects/demo/jobs/"]')
        with self.step("8 Jobs: the project page's link to the Jobs page"):
            self.expect_label(tab, "jobs")
        tab.click()
        with self.step("8 Jobs: the Jobs page's heading"):
            self.expect_label(self.page.locator("h1"), "jobs")
        expect(self.page.locator("table.jobs")).to_be_visible()


@pytest.mark.parametrize("lang", ["en", "ja"])
def test_a_new_lab_administrator_walks_the_readme_tour_in_chromium(
    demo_world, live_server, chromium_page, lang  # noqa: F811  (chromium_page)
):
    started = time.monotonic()
    tour = TourWalk(chromium_page, demo_world, lang, live_server.url)
    tour.walk()
    worker_log = "\n".join(demo_world.worker.output().splitlines()[-30:])
    assert not tour.failures, (f"{len(tour.failures)} step(s) of the README tour failed in {lang}:\n"
                               + "\n".join(tour.failures) + f"\nThe worker's last lines:\n{worker_log}")
    print(f"README tour in {lang}: {time.monotonic() - started:.0f} s")
    assert ServiceAccount.objects.filter(name="tour-worker", project__slug="demo").exists()
