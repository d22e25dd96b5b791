"""Refusals of computers that a person meets (issues 14 and 15): a connection check that nobody would pick
up is refused when it is asked, not after 5 minutes; the refusals of computers/services.py are in the
user's language, with the same codes; the Local computer's Worker settings produce a worker that takes
the computer; the Compute page marks disabled computers."""
from __future__ import annotations

import html as htmllib
import re
import subprocess
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from computers.models import ComputeTarget
from mado import services
from mado.choices import Role
from tests.computer_fixtures import ScriptedWorker, make_computer
from tests.conftest import assert_error
from workers.models import Worker

pytestmark = pytest.mark.django_db
HTMX = {"HTTP_HX_REQUEST": "true"}


def session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def page_text(response) -> str:
    return htmllib.unescape(response.content.decode()).replace("\xa0", " ")


# A check that names no worker -------------------------------------------------------------------------

class TestUnnamedChecks:
    def test_with_no_worker_handling_the_computer_the_api_refuses_at_once_with_what_to_do(self, world, computers):
        target = computers.admins_private
        # Online, but none may take it: root's worker has no target ids; the outsider's worker lists the
        # computer, but a Private computer of root is not one its service account may serve.
        ScriptedWorker(world.worker_token, "no-target-ids").hello()
        account = services.create_service_account(services.Actor(world.outsider), world.other_project,
                                                  name="elsewhere", role=Role.ADMIN)
        foreign = world.token(account.user, ["read", "worker:execute"], project=world.other_project,
                              kind="service")
        ScriptedWorker(foreign, "foreign", target_ids=[target.pk]).hello()
        body = assert_error(session(world.global_admin).post(f"/api/computers/{target.pk}/checks", {},
                                                             format="json"), 409, "no_worker_for_check")
        assert f"MMT_WORKER_TARGET_IDS includes {target.pk}" in body["error"]
        assert "Worker for this connection" in body["error"]
        assert not target.checks.exists()

    def test_a_worker_that_handles_the_computer_takes_it_and_once_it_is_gone_the_refusal_returns(
            self, world, computers):
        target = computers.admins_public
        handler = ScriptedWorker(world.worker_token, "handler", target_ids=[target.pk])
        handler.hello()
        admin = session(world.global_admin)
        created = admin.post(f"/api/computers/{target.pk}/checks", {}, format="json")
        assert created.status_code == 201, created.content
        assert handler.claim_check()["id"] == created.json()["id"]
        handler.complete_check(handler.claim_check())
        Worker.objects.filter(worker_id="handler").update(last_seen_at=timezone.now() - timedelta(seconds=121))
        assert_error(admin.post(f"/api/computers/{target.pk}/checks", {}, format="json"), 409, "no_worker_for_check")

    def test_a_researcher_owner_sees_the_refusal_in_the_details_panel_at_once(self, client, world, computers):
        target = computers.researchers_private
        client.force_login(world.project_admin)
        panel = page_text(client.post(reverse("computer-check-request", args=[target.pk]), **HTMX))
        assert 'id="connection-check"' in panel
        assert "No online worker handles alice-box, so nobody would pick up this check" in panel
        assert f"--target-ids {target.pk}" in panel
        assert not target.checks.exists()


# The user's language ------------------------------------------------------------------------------

class TestJapanese:
    def test_refusals_of_the_computers_service_are_japanese_with_the_same_codes(self, world, computers):
        admin = session(world.global_admin)
        ja = {"HTTP_ACCEPT_LANGUAGE": "ja"}
        target = computers.admins_public
        body = assert_error(admin.patch(f"/api/computers/{target.pk}", {"port": 70000, "working_dir": "data"},
                                        format="json", **ja), 422, "invalid_computer")
        assert "Portは1から65535までです。" in body["error"]
        assert body["fields"]["working_dir"] == ["作業ディレクトリは、コンピュータ上の絶対パスで入力してください。"]
        body = assert_error(admin.post(f"/api/computers/{target.pk}/checks", {}, format="json", **ja), 409,
                            "no_worker_for_check")
        assert "を担当するオンラインのworkerが無い" in body["error"] and f"--target-ids {target.pk}" in body["error"]
        owner = session(world.project_admin)
        body = assert_error(owner.patch(f"/api/computers/{target.pk}", {"visibility": "private"}, format="json",
                                        **ja), 403, "role_required")
        assert body["error"] == "コンピュータを変更・確認できるのは、所有者と全体管理者だけです。"
        body = assert_error(admin.post("/api/computers", {"name": "shared-gpu", "kind": "ssh"}, format="json", **ja),
                            422, "invalid_computer")
        assert "shared-gpuという名前のコンピュータはすでにあります。" in body["error"]
        # The English stays for English readers, with the same code.
        body = assert_error(admin.patch(f"/api/computers/{target.pk}", {"port": 0}, format="json"), 422,
                            "invalid_computer")
        assert body["fields"]["port"] == ["Port must be between 1 and 65535."]

    def test_a_locked_change_names_the_fields_in_japanese(self, world, computers, monkeypatch):
        from types import SimpleNamespace

        from computers import locks

        monkeypatch.setattr(locks, "active_jobs", lambda target: [SimpleNamespace(pk=41)])
        body = assert_error(session(world.global_admin).patch(
            f"/api/computers/{computers.admins_public.pk}", {"host": "elsewhere.example.internal", "gpu_ids": ["0"]},
            format="json", HTTP_ACCEPT_LANGUAGE="ja"), 409, "computer_in_use")
        assert body["error"].startswith("Job 41がこのコンピュータで待機中か実行中なので、Host, GPU IDは今は変更できません。")
        assert body["fields"]["host"] == ["Jobがこのコンピュータを使っているあいだは変更できません。"]


# The Local computer's Worker settings ----------------------------------------------------------------

def local_computer(world, settings) -> ComputeTarget:
    settings.DEV_MODE = True
    return ComputeTarget.objects.create(owner=world.global_admin, name="local", kind="local", enabled=True,
                                        working_dir="/tmp/local-jobs", python_path="/usr/bin/python3",
                                        runtimes=["python"])


def block(page: str, pre_id: str) -> str:
    return re.search(rf'<pre id="{pre_id}">(.*?)</pre>', page, re.DOTALL).group(1)


def test_the_local_computers_worker_settings_ask_for_the_seeds_scopes(client, world, settings):
    target = local_computer(world, settings)
    client.force_login(world.global_admin)
    page = page_text(client.get(reverse("computer-detail", args=[target.pk])))
    assert ("save a token of a Service Account whose Role is Admin, with the scopes read, worker:execute and "
            "artifacts:write") in page
    assert "MADO_DEV_MODE=true and MMT_ALLOW_LOCAL_EXECUTOR=true" in page


def test_following_the_local_computers_environment_block_gives_a_worker_that_runs_local_computers(
        client, world, settings, tmp_path):
    """The block run as written in bash (with `mado-tracking-worker run` replaced by printing what it
    would read): the worker's own configuration then serves this computer and allows the Local executor."""
    from worker_agent.config import WorkerConfig

    target = local_computer(world, settings)
    client.force_login(world.global_admin)
    commands = block(page_text(client.get(reverse("computer-detail", args=[target.pk]))), "worker-env")
    assert commands.rstrip().endswith("mado-tracking-worker run")
    (tmp_path / "worker-token").write_text(world.worker_token + "\n")
    script = "mado-tracking-worker() { env -0; }\n" + commands
    out = subprocess.run(["bash", "-c", script], env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
                         capture_output=True, check=True).stdout.decode()
    env = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
    config = WorkerConfig.from_env(env)
    assert config.allow_local, "without MADO_DEV_MODE and MMT_ALLOW_LOCAL_EXECUTOR the worker refuses Local computers"
    assert config.target_ids == [target.pk]


def test_following_the_local_computers_install_block_gives_a_worker_that_runs_local_computers(
        client, world, settings, tmp_path, monkeypatch):
    """`install` writes the env file (here: its own function, without systemd); the block's next lines add
    the two settings to that very file and restart the unit (systemctl recorded)."""
    from worker_agent import install as inst
    from worker_agent.config import WorkerConfig

    target = local_computer(world, settings)
    client.force_login(world.global_admin)
    commands = block(page_text(client.get(reverse("computer-detail", args=[target.pk]))), "worker-install")
    first, *rest = commands.strip().splitlines()
    assert first.startswith("mado-tracking-worker install") and f"--target-ids {target.pk}" in first
    monkeypatch.setenv("HOME", str(tmp_path))
    hostname = subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout.strip()
    layout = inst.user_layout()
    inst.write_install(inst.InstallPlan(layout=layout, api_url="http://127.0.0.1:8000", worker_id=hostname,
                                        target_ids=str(target.pk), state_dir=tmp_path / "state",
                                        token=world.worker_token, python="/usr/bin/python3"))
    script = 'systemctl() { echo "systemctl $*" >> "$HOME/systemctl.log"; }\n' + "\n".join(rest)
    subprocess.run(["bash", "-c", script], env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}, check=True)
    values = inst.parse_env_file(layout.env_file(hostname).read_text())
    config = WorkerConfig.from_env(values)
    assert config.allow_local and config.target_ids == [target.pk]
    assert (tmp_path / "systemctl.log").read_text() == f"systemctl --user restart mado-tracking-worker@{hostname}\n"


def test_an_ssh_computers_worker_settings_do_not_turn_on_the_local_executor(client, world):
    target = make_computer(world.global_admin, "gpu-ssh", visibility="public")
    client.force_login(world.global_admin)
    page = page_text(client.get(reverse("computer-detail", args=[target.pk])))
    assert "MMT_ALLOW_LOCAL_EXECUTOR" not in block(page, "worker-env") + block(page, "worker-install")
    assert "with the scopes read, worker:execute and artifacts:write" in page


# Compute page ---------------------------------------------------------------------------------------

def test_the_compute_page_marks_disabled_computers(client, world):
    make_computer(world.global_admin, "on-box", visibility="public", enabled=True, working_dir="/data",
                  python_path="/usr/bin/python3")
    make_computer(world.global_admin, "off-box", visibility="public", enabled=False)
    client.force_login(world.member)
    page = page_text(client.get(reverse("project-compute", args=["lab"])))
    rows = re.findall(r'<tr data-computer="([^"]+)"([^>]*)>(.*?)</tr>', page, re.DOTALL)
    by_name = {name: (attrs, cells) for name, attrs, cells in rows}
    assert [name for name, _attrs, _cells in rows] == ["on-box", "off-box"], "enabled ones first"
    off_attrs, off_cells = by_name["off-box"]
    assert 'data-disabled="true"' in off_attrs and "muted" in off_attrs
    assert "No new Jobs until its owner or a global administrator enables it." in off_cells
    on_attrs, on_cells = by_name["on-box"]
    assert "data-disabled" not in on_attrs and "No new Jobs" not in on_cells
    assert "1 of them is disabled: new Jobs cannot be created for it until it is enabled." in page
    ja = page_text(client.get(reverse("project-compute", args=["lab"]), HTTP_ACCEPT_LANGUAGE="ja"))
    assert "このうち1台は無効です。" in ja and "所有者か全体管理者が有効にするまで、新しいJobは作れません。" in ja

