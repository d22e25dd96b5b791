"""`mado-tracking-worker` subcommands through click's runner: what the operator sees and what ends up
on disk. systemd is absent on these machines, so systemctl/loginctl/pip go through a recording
runner; the files are the real ones `install` writes."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.peers.sshd import ensure_login_user
from worker_agent import install as inst
from worker_agent.cli import main
from worker_agent.journal import StateDir

TOKEN = "mmt_" + "Zq3" * 14 + "x"
REPO = Path(__file__).resolve().parents[2]
UNREACHABLE = "http://127.0.0.1:9"


class FakeRunner:
    """Records each command; answers from `answers` (first matching argv prefix) or success."""

    def __init__(self, answers: dict[tuple, tuple[int, str, str]] | None = None):
        self.calls: list[list[str]] = []
        self.answers = answers or {}

    def run(self, argv, *, timeout=600):
        self.calls.append(list(argv))
        for prefix, (code, out, err) in self.answers.items():
            if tuple(argv[: len(prefix)]) == prefix:
                return subprocess.CompletedProcess(argv, code, out, err)
        return subprocess.CompletedProcess(argv, 0, "", "")


def invoke(args, runner=None, input=None):
    return CliRunner().invoke(main, args, obj={"runner": runner or FakeRunner()}, input=input)


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# -- help --------------------------------------------------------------------------------------------

def test_help_lists_every_subcommand_and_no_option_takes_a_token():
    result = invoke(["--help"])
    assert result.exit_code == 0
    for name in ("run", "install", "upgrade", "status", "doctor"):
        assert f"  {name} " in result.output
    for name in ("run", "install"):
        text = invoke([name, "--help"]).output
        assert "--token-file" in text and "--token " not in text and "--token=" not in text


# -- install -----------------------------------------------------------------------------------------

def test_install_writes_a_private_env_file_the_user_unit_and_starts_it(isolated_home):
    runner = FakeRunner()
    result = invoke(["install", "--api-url", UNREACHABLE + "/", "--worker-id", "gpu-host-1", "--target-ids", "3,5"],
                    runner, input=TOKEN + "\n")
    assert result.exit_code == 0, result.output
    env_file = isolated_home / ".config/mado-tracking-worker/gpu-host-1.env"
    unit_file = isolated_home / ".config/systemd/user/mado-tracking-worker@.service"
    state_dir = isolated_home / ".local/state/mado-tracking-worker/gpu-host-1"
    assert mode(env_file) == 0o600 and mode(state_dir) == 0o700
    assert env_file.read_text().splitlines()[2:] == [
        f"MMT_API_URL={UNREACHABLE}", "MMT_WORKER_ID=gpu-host-1", "MMT_WORKER_TARGET_IDS=3,5",
        f"MMT_WORKER_STATE_DIR={state_dir}", f"MMT_API_TOKEN={TOKEN}"]
    assert unit_file.read_text() == inst.render_unit(system=False, python=sys.executable,
                                                     env_dir=isolated_home / ".config/mado-tracking-worker")
    unit = unit_file.read_text()
    for line in ("KillMode=process", "Restart=on-failure", "RestartSec=10", "UMask=0077", "NoNewPrivileges=yes",
                 "Type=simple", "WantedBy=default.target", f"ExecStart={sys.executable} -m worker_agent run"):
        assert line in unit.splitlines()
    assert runner.calls[:3] == [
        ["systemctl", "--user", "daemon-reload"],
        ["systemctl", "--user", "is-active", "mado-tracking-worker@gpu-host-1.service"],
        ["systemctl", "--user", "enable", "--now", "mado-tracking-worker@gpu-host-1.service"],
    ]
    assert runner.calls[3][:2] == ["loginctl", "show-user"]
    assert "could not be verified now" in result.stderr, "an unreachable server is a warning, not a refusal"
    assert "loginctl enable-linger" in result.stdout
    assert TOKEN not in result.output


def test_install_again_while_running_restarts_the_unit_with_the_new_token(isolated_home):
    runner = FakeRunner({("systemctl", "--user", "is-active"): (0, "active\n", ""),
                         ("loginctl",): (0, "yes\n", "")})
    invoke(["install", "--api-url", UNREACHABLE, "--worker-id", "w1"], FakeRunner(), input=TOKEN + "\n")
    token_file = isolated_home / "token"
    token_file.write_text(TOKEN.replace("Zq3", "Yp2") + "\n")
    result = invoke(["install", "--api-url", UNREACHABLE, "--worker-id", "w1", "--token-file", str(token_file)], runner)
    assert result.exit_code == 0, result.output
    assert ["systemctl", "--user", "restart", "mado-tracking-worker@w1.service"] in runner.calls
    assert "Yp2" in (isolated_home / ".config/mado-tracking-worker/w1.env").read_text()
    assert "enable-linger" not in result.output, "no hint once linger is on"
    leftovers = [p for p in files_under(isolated_home) if ".tmp" in p]
    assert leftovers == []


@pytest.mark.parametrize("args, stdin, message", [
    (["--worker-id", "bad id!"], TOKEN, "The worker id 'bad id!' is not valid"),
    (["--worker-id", "x" * 65], TOKEN, "is not valid"),
    (["--worker-id", "w1"], "mmt_short\n", "The worker token is not valid"),
    (["--worker-id", "w1"], "mado_mtj_" + "a" * 43 + "\n", "This is a job token"),
    (["--worker-id", "w1"], "\n", "No worker token was given"),
    (["--worker-id", "w1", "--token-file", "/nonexistent/t"], "", "The token file /nonexistent/t does not exist"),
    (["--worker-id", "w1", "--target-ids", "3;5"], TOKEN, "give computer ids separated by commas"),
    (["--worker-id", "w1", "--state-dir", "/srv/$HOME/state"], TOKEN, "must not contain quotes"),
    (["--worker-id", "w1", "--state-dir", "relative"], TOKEN, "--state-dir must be an absolute path"),
    (["--worker-id", "w1", "--service-user", "mmt"], TOKEN, "--service-user goes with --systemd-system"),
    (["--worker-id", "w1", "--systemd-system"], TOKEN, "--systemd-system needs --service-user"),
    (["--worker-id", "w1", "--systemd-system", "--service-user", "no-such-user-x"], TOKEN,
     "The service user 'no-such-user-x' does not exist"),
])
def test_install_writes_nothing_for_invalid_input(isolated_home, args, stdin, message):
    runner = FakeRunner()
    result = invoke(["install", "--api-url", UNREACHABLE, *args], runner, input=stdin)
    assert result.exit_code == 1
    assert message in result.stderr and "Nothing was written." in result.stderr
    assert files_under(isolated_home) == [] and runner.calls == []
    assert "a" * 43 not in result.output


@pytest.mark.parametrize("args, message", [
    (["--worker-id", "w1"], "Give --api-url, the address of the Mado server"),
    (["--api-url", UNREACHABLE], "Give --worker-id, a name for this worker"),
    (["--api-url", "ftp://x", "--worker-id", "w1"], "give the server's address with http:// or https://"),
])
def test_install_names_the_missing_or_wrong_option(isolated_home, args, message):
    result = invoke(["install", *args], input=TOKEN)
    assert result.exit_code == 1 and message in result.stderr and files_under(isolated_home) == []


def test_install_without_systemd_says_how_to_start_the_worker_by_hand(isolated_home):
    runner = FakeRunner({("systemctl",): (127, "", "systemctl: command not found")})
    result = invoke(["install", "--api-url", UNREACHABLE, "--worker-id", "w1"], runner, input=TOKEN)
    assert result.exit_code == 1
    env_file = isolated_home / ".config/mado-tracking-worker/w1.env"
    assert "systemctl is not available on this machine" in result.stderr
    assert f"set -a; . {env_file}; set +a;" in result.stderr and "-m worker_agent run" in result.stderr
    assert env_file.exists(), "the files stay: only starting needs systemd"


def test_install_reports_a_failing_enable(isolated_home):
    runner = FakeRunner({("systemctl", "--user", "enable"): (1, "", "Failed to connect to bus: No medium found")})
    result = invoke(["install", "--api-url", UNREACHABLE, "--worker-id", "w1"], runner, input=TOKEN)
    assert result.exit_code == 1
    assert "Failed to connect to bus" in result.stderr
    assert "journalctl --user -u mado-tracking-worker@w1" in result.stderr


def test_system_install_writes_root_files_and_a_state_dir_owned_by_the_service_user(tmp_path, monkeypatch,
                                                                                      isolated_home):
    user = ensure_login_user()
    monkeypatch.setattr(inst, "SYSTEM_ROOT", tmp_path / "root")
    runner = FakeRunner()
    result = invoke(["install", "--api-url", "https://tracking.example.internal", "--worker-id", "gpu-host-1",
                     "--target-ids", "3", "--systemd-system", "--service-user", user.pw_name], runner, input=TOKEN)
    assert result.exit_code == 0, result.output
    root = tmp_path / "root"
    env_file = root / "etc/mado-tracking-worker/gpu-host-1.env"
    unit_file = root / "etc/systemd/system/mado-tracking-worker@.service"
    state_dir = root / "var/lib/mado-tracking-worker/gpu-host-1"
    assert mode(env_file) == 0o600 and os.stat(env_file).st_uid == 0
    assert mode(state_dir) == 0o700 and os.stat(state_dir).st_uid == user.pw_uid
    assert mode(unit_file) == 0o644
    # The rendered system unit is the shipped template but for the venv and the user.
    shipped = (REPO / "deploy/worker/mado-tracking-worker@.service").read_text()
    expected = shipped.replace(inst.EXAMPLE["python"], sys.executable).replace(
        f"User={inst.EXAMPLE['service_user']}", f"User={user.pw_name}")
    assert unit_file.read_bytes() == expected.encode()
    shipped_env = (REPO / "deploy/worker/worker.env.example").read_text()
    assert env_file.read_bytes() == shipped_env.replace(inst.EXAMPLE["token"], TOKEN).encode()
    assert runner.calls == [["systemctl", "daemon-reload"],
                            ["systemctl", "is-active", "mado-tracking-worker@gpu-host-1.service"],
                            ["systemctl", "enable", "--now", "mado-tracking-worker@gpu-host-1.service"]]
    assert "journalctl -u mado-tracking-worker@gpu-host-1.service -f" in result.output


def test_the_shipped_templates_are_the_rendered_system_variant():
    example = inst.EXAMPLE
    unit = inst.render_unit(system=True, python=example["python"], env_dir=Path("/etc/mado-tracking-worker"),
                            service_user=example["service_user"])
    env = inst.render_env(api_url=example["api_url"], worker_id=example["worker_id"], target_ids=example["target_ids"],
                          state_dir=example["state_dir"], token=example["token"])
    assert (REPO / "deploy/worker/mado-tracking-worker@.service").read_bytes() == unit.encode()
    assert (REPO / "deploy/worker/worker.env.example").read_bytes() == env.encode()
    for line in ("After=network-online.target", "Wants=network-online.target", "User=mmt-worker",
                 "EnvironmentFile=/etc/mado-tracking-worker/%i.env", "KillMode=process", "WantedBy=multi-user.target"):
        assert line in unit.splitlines()


# -- upgrade -----------------------------------------------------------------------------------------

@pytest.fixture
def installed(isolated_home):
    result = invoke(["install", "--api-url", UNREACHABLE, "--worker-id", "w1"], input=TOKEN)
    assert result.exit_code == 0, result.output
    return isolated_home / ".local/state/mado-tracking-worker/w1"


def test_upgrade_installs_into_the_units_venv_then_restarts(installed):
    runner = FakeRunner({("systemctl", "--user", "show"): (0, "ActiveState=active\nSubState=running\n", "")})
    result = invoke(["upgrade", "--worker-id", "w1", "--version", "0.2.0"], runner)
    assert result.exit_code == 0, result.output
    assert runner.calls[1] == [sys.executable, "-m", "pip", "install", "--upgrade", "--disable-pip-version-check",
                               "mado-tracking[telemetry]==0.2.0"]
    assert runner.calls[2] == ["systemctl", "--user", "restart", "mado-tracking-worker@w1.service"]
    assert "Running jobs were not stopped" in result.output


def test_upgrade_does_not_restart_when_pip_fails(installed):
    runner = FakeRunner({(sys.executable,): (1, "", "ERROR: No matching distribution found for mado-tracking==9")})
    result = invoke(["upgrade", "--worker-id", "w1", "--package-spec", "/nowhere[telemetry]"], runner)
    assert result.exit_code == 1
    assert "pip failed, so mado-tracking-worker@w1.service was not restarted" in result.stderr
    assert "No matching distribution" in result.stderr
    assert not any("restart" in call for call in runner.calls)


def test_upgrade_refuses_while_a_worker_started_by_hand_holds_the_lock(installed):
    state = StateDir(installed)
    state.lock()
    try:
        runner = FakeRunner({("systemctl", "--user", "show"): (0, "ActiveState=inactive\n", "")})
        result = invoke(["upgrade", "--worker-id", "w1", "--version", "0.2.0"], runner)
    finally:
        state.unlock()
    assert result.exit_code == 1
    assert f"a worker started by hand (pid {os.getpid()}) is using" in result.stderr
    assert "Nothing was changed" in result.stderr and len(runner.calls) == 1, "pip never ran"


def test_upgrade_proceeds_when_the_lock_is_the_units_own_worker(installed):
    state = StateDir(installed)
    state.lock()
    try:
        runner = FakeRunner({("systemctl", "--user", "show"): (0, "ActiveState=active\n", "")})
        result = invoke(["upgrade", "--worker-id", "w1", "--version", "0.2.0"], runner)
    finally:
        state.unlock()
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("args, message", [
    (["--worker-id", "w1"], "Give exactly one of --version"),
    (["--worker-id", "w1", "--version", "1", "--package-spec", "x"], "Give exactly one of --version"),
    (["--version", "1"], "Give --worker-id"),
    (["--worker-id", "other", "--version", "1"], "No worker unit is installed"),
])
def test_upgrade_errors_say_what_to_do(installed, args, message):
    if "other" in args:
        (installed.parents[3] / ".config/systemd/user/mado-tracking-worker@.service").unlink()
    runner = FakeRunner()
    result = invoke(["upgrade", *args], runner)
    assert result.exit_code == 1 and message in result.stderr and runner.calls == []


# -- status ------------------------------------------------------------------------------------------

def test_status_is_0_when_active_and_3_when_stopped(installed):
    show = "LoadState=loaded\nActiveState=active\nSubState=running\nMainPID=42\n"
    active = FakeRunner({("systemctl",): (0, show, "")})
    result = invoke(["status", "--worker-id", "w1"], active)
    assert result.exit_code == 0
    assert "mado-tracking-worker@w1.service: active (running)" in result.output
    assert "jobs:       0 retained" in result.output
    assert active.calls == [["systemctl", "--user", "show", "mado-tracking-worker@w1.service",
                             "--property=LoadState,ActiveState,SubState,MainPID"]]

    stopped = FakeRunner({("systemctl",): (0, "LoadState=loaded\nActiveState=inactive\nSubState=dead\n", "")})
    result = invoke(["status", "--worker-id", "w1"], stopped)
    assert result.exit_code == 3
    hint = "The worker is stopped. Start it with: systemctl --user start mado-tracking-worker@w1.service"
    assert hint in result.output


def test_status_sees_a_worker_started_by_hand_and_prints_json(installed):
    state = StateDir(installed)
    state.lock()
    try:
        runner = FakeRunner({("systemctl",): (127, "", "not found")})
        result = invoke(["status", "--worker-id", "w1", "--json"], runner)
    finally:
        state.unlock()
    assert result.exit_code == 0
    body = json.loads(result.output)
    assert body["lock_held"] is True and body["lock_pid"] == os.getpid() and body["active_state"] == "unknown"
    assert body["state_dir"] == str(installed) and body["jobs"] == [] and body["running"] is True

    result = invoke(["status", "--worker-id", "w1"], FakeRunner({("systemctl",): (127, "", "not found")}))
    assert result.exit_code == 3 and "systemctl is not available on this machine" in result.output


@pytest.mark.parametrize("args, message", [([], "Give --worker-id"), (["--worker-id", "a b"], "is not valid")])
def test_status_errors(isolated_home, args, message):
    result = invoke(["status", *args])
    assert result.exit_code == 1 and message in result.stderr


# -- run ---------------------------------------------------------------------------------------------

def test_run_without_configuration_names_the_variables(isolated_home):
    result = invoke(["run"])
    assert result.exit_code == 1
    assert "Set MMT_API_URL, MMT_WORKER_ID, MMT_API_TOKEN (or MMT_API_TOKEN_FILE)" in result.stderr
    assert "mado-tracking-worker install" in result.stderr


def test_run_refuses_a_second_worker_on_the_same_state_dir(isolated_home, monkeypatch, tmp_path):
    state = StateDir(tmp_path / "state")
    state.ensure()
    state.lock()
    monkeypatch.setenv("MMT_API_TOKEN", TOKEN)
    try:
        result = invoke(["run", "--api-url", UNREACHABLE, "--worker-id", "w1", "--state-dir", str(state.path)])
    finally:
        state.unlock()
    assert result.exit_code == 1
    assert f"Another worker (pid {os.getpid()}) is already using the state directory {state.path}" in result.stderr
    assert "own MMT_WORKER_STATE_DIR" in result.stderr


def test_run_refuses_a_state_dir_others_can_read(isolated_home, monkeypatch, tmp_path):
    open_dir = tmp_path / "state"
    open_dir.mkdir()
    open_dir.chmod(0o755)
    monkeypatch.setenv("MMT_API_TOKEN", TOKEN)
    result = invoke(["run", "--api-url", UNREACHABLE, "--worker-id", "w1", "--state-dir", str(open_dir)])
    assert result.exit_code == 1 and f"run chmod 700 {open_dir}" in result.stderr


def test_run_takes_the_token_from_a_file_and_masks_it(isolated_home, monkeypatch, tmp_path):
    token_file = tmp_path / "t"
    token_file.write_text("mado_mtj_" + "q" * 43)
    result = invoke(["run", "--api-url", UNREACHABLE, "--worker-id", "w1", "--token-file", str(token_file)])
    assert result.exit_code == 1 and "This is a job token" in result.stderr and "q" * 20 not in result.output


# -- doctor (the parts that need no server; the rest is in test_cli_server.py) -------------------------

def test_doctor_with_nothing_configured_says_what_to_give(isolated_home):
    result = invoke(["doctor"])
    assert result.exit_code == 1 and "give --worker-id" in result.output


def test_doctor_finds_an_env_file_readable_by_others_and_an_unreachable_api(installed):
    env_file = installed.parents[3] / ".config/mado-tracking-worker/w1.env"
    env_file.chmod(0o644)
    result = invoke(["doctor", "--worker-id", "w1"])
    assert result.exit_code == 1
    assert f"error   {env_file} has mode 644 but holds the token: run chmod 600 {env_file}." in result.output
    assert f"The API at {UNREACHABLE} does not answer /api/health" in result.output
    assert TOKEN not in result.output
    assert "problem(s) found" in result.stderr


def test_doctor_without_an_env_file_for_the_id(isolated_home):
    result = invoke(["doctor", "--worker-id", "nobody"])
    assert result.exit_code == 1 and "run `mado-tracking-worker install` for this worker id" in result.output
