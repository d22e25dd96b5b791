"""`install` and `doctor` against the real server (live_server): token verification and scopes."""
from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from mado import services
from mado.models import ApiToken
from mado.tokens import hash_token
from tests.agent.test_cli import FakeRunner, files_under
from worker_agent.cli import main


def invoke(args, input=None):
    return CliRunner().invoke(main, args, obj={"runner": FakeRunner()}, input=input)


@pytest.fixture
def server(transactional_db, live_server, world):
    return live_server.url


@pytest.fixture
def ssh_home(isolated_home, sshd):
    ssh = isolated_home / ".ssh"
    ssh.mkdir(mode=0o700)
    shutil.copy(sshd.key_path, ssh / "id_ed25519")
    (ssh / "id_ed25519").chmod(0o600)
    shutil.copy(sshd.known_hosts_path, ssh / "known_hosts")
    return ssh


def install(server, token, worker_id="w1"):
    return invoke(["install", "--api-url", server, "--worker-id", worker_id], input=token + "\n")


def test_install_with_a_good_token_then_doctor_finds_no_problem(server, world, ssh_home):
    result = install(server, world.worker_token)
    assert result.exit_code == 0, result.output
    assert "Warning" not in result.output, "the server confirmed the token"
    result = invoke(["doctor", "--worker-id", "w1"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.startswith("ok") and "env file" in line and "(mode 600)" in line for line in lines)
    assert any(line.startswith("ok") and "state directory" in line for line in lines)
    assert any(line.startswith("ok") and f"API {server} answers" in line for line in lines)
    assert any(line.startswith("ok") and "token of project lab (service) has read, worker:execute, artifacts:write"
               in line for line in lines)
    assert any(line.startswith("ok") and "SSH key" in line and "(mode 600)" in line for line in lines)
    assert any(line.startswith("warning") and "registry:write" in line for line in lines)
    assert result.output.rstrip().endswith("No problems found.")
    assert world.worker_token not in result.output


def test_install_writes_nothing_when_the_server_rejects_the_token(server, world, isolated_home):
    token = world.token(world.service_account.user, ["read", "worker:execute"], kind="service")
    services.revoke_token(services.SYSTEM, ApiToken.objects.get(token_hash=hash_token(token)))
    result = install(server, token)
    assert result.exit_code == 1
    assert "The API server rejects this token (401)" in result.stderr and "Nothing was written." in result.stderr
    assert files_under(isolated_home) == [] and token not in result.output


def test_install_writes_nothing_for_a_token_without_worker_scope(server, world, isolated_home):
    token = world.token(world.member, ["read", "jobs:write"])
    result = install(server, token)
    assert result.exit_code == 1
    assert "lacks the scope(s) worker:execute" in result.stderr and files_under(isolated_home) == []


def test_doctor_reports_each_problem_and_exits_1(server, world, ssh_home):
    assert install(server, world.worker_token).exit_code == 0
    (ssh_home / "id_ed25519").chmod(0o644)
    ssh_home.chmod(0o777)
    result = invoke(["doctor", "--worker-id", "w1", "--known-hosts", str(ssh_home / "kh_missing")])
    assert result.exit_code == 1
    out = result.output
    assert f"error   {ssh_home} has mode 777, so others can change its files: run chmod 700 {ssh_home}." in out
    assert f"error   The SSH key {ssh_home / 'id_ed25519'} has mode 644: run chmod 600" in out
    assert f"error   The known_hosts file {ssh_home / 'kh_missing'} does not exist" in out
    assert "3 problem(s) found" in result.stderr


def test_doctor_flags_missing_scopes_and_a_job_token(server, world, ssh_home, monkeypatch, tmp_path):
    monkeypatch.setenv("MMT_API_URL", server)
    monkeypatch.setenv("MMT_WORKER_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("MMT_API_TOKEN", world.token(world.member, ["read"]))
    result = invoke(["doctor"])
    assert result.exit_code == 1
    assert "The token lacks the scope(s) worker:execute, artifacts:write" in result.output

    monkeypatch.setenv("MMT_API_TOKEN", "mado_mtj_" + "j" * 43)
    result = invoke(["doctor"])
    assert result.exit_code == 1 and "This is a job token" in result.output and "j" * 20 not in result.output


def test_doctor_reports_a_revoked_token(server, world, ssh_home, monkeypatch, tmp_path):
    token = world.token(world.service_account.user, ["read", "worker:execute", "artifacts:write"], kind="service")
    services.revoke_token(services.SYSTEM, ApiToken.objects.get(token_hash=hash_token(token)))
    monkeypatch.setenv("MMT_API_URL", server)
    monkeypatch.setenv("MMT_API_TOKEN", token)
    monkeypatch.setenv("MMT_WORKER_STATE_DIR", str(tmp_path / "state"))
    result = invoke(["doctor"])
    assert result.exit_code == 1
    assert "rejects the worker token (401)" in result.output and token not in result.output
    assert "warning The state directory" in result.output and "does not exist yet" in result.output
