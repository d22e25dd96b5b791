"""The worker image's entry point (docker/worker-entrypoint.sh), run outside Docker the way Compose runs it:
the token as a secret file (root's, mode 600, as a bind-mounted Compose file secret arrives), the SSH
directory bind-mounted read-only at ~/.ssh (a real read-only bind mount, in a mount namespace of its own),
and a state directory standing for the `worker-state` volume. The paths move by environment variables
only because the test cannot write /run/secrets or /home/worker.

Docker itself cannot run this here: building the image needs `python:3.11-slim-bookworm` from Docker Hub,
which this machine cannot reach (tests/deploy/test_compose.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.peers.sshd import keygen
from workers.models import Worker

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "docker" / "worker-entrypoint.sh"
AGENT = Path(sys.executable).parent / "mado-tracking-worker"
KEY_OWNER = 1000  # the host user who owns ./var/worker-ssh, and the image's `worker`
OLD_OWNER = 1001  # who wrote the state volume before
TOKEN = "mmt_" + "t" * 40

# Reports what the agent would see, instead of being it.
FAKE_AGENT = """#!/bin/sh
echo "args $*"
echo "uid $(id -u) gid $(id -g) groups $(id -G)"
echo "home $HOME"
echo "token-file $MMT_API_TOKEN_FILE"
echo "token $(cat "$MMT_API_TOKEN_FILE")"
echo "token-mode $(stat -c '%u %a' "$MMT_API_TOKEN_FILE")"
echo "env-token ${MMT_API_TOKEN:-none}"
echo "state $MMT_WORKER_STATE_DIR $(stat -c '%u %a' "$MMT_WORKER_STATE_DIR")"
echo "old-record $(stat -c %u "$MMT_WORKER_STATE_DIR/old/record")"
echo "key $(cat "$HOME/.ssh/id_ed25519" | head -c 5)"
if touch "$HOME/.ssh/probe" 2>/dev/null; then echo "ssh writable"; else echo "ssh read-only"; fi
"""


@dataclass
class Box:
    """A directory every uid may traverse (pytest's tmp_path is root's only), laid out like the container."""
    path: Path

    @property
    def keys(self) -> Path:  # ./var/worker-ssh on the host
        return self.path / "worker-ssh"

    @property
    def home(self) -> Path:
        return self.path / "home"

    @property
    def secret(self) -> Path:
        return self.path / "secrets" / "worker_token"

    @property
    def state(self) -> Path:
        return self.path / "worker-state"

    @property
    def runtime(self) -> Path:
        return self.path / "run"

    def run(self, *args: str, agent: Path | str = AGENT, as_uid: int | None = None, **env: str):
        """The entry point with the keys mounted read-only at ~/.ssh, as root unless `as_uid`."""
        environment = {"PATH": os.environ["PATH"], "HOME": str(self.home), "MMT_WORKER_AGENT": str(agent),
                       "MMT_WORKER_TOKEN_SECRET": str(self.secret), "MMT_WORKER_STATE_DIR": str(self.state),
                       "MMT_WORKER_RUNTIME_DIR": str(self.runtime), **env}
        start = f'sh "{ENTRYPOINT}" "$@"'
        if as_uid is not None:
            start = f"setpriv --reuid={as_uid} --regid={as_uid} --clear-groups -- {start}"
        script = f'mount --bind -o ro "{self.keys}" "{self.home}/.ssh" && exec {start}'
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "entrypoint",
                               *args], env=environment, capture_output=True, text=True, timeout=120)


@pytest.fixture
def box():
    if os.geteuid() != 0:
        pytest.fail("These tests run as root, like the suite: they bind-mount and hand files to other uids.")
    path = Path(tempfile.mkdtemp(prefix="mado-worker-box-"))
    os.chmod(path, 0o755)
    b = Box(path)
    b.keys.mkdir(mode=0o700)
    keygen(b.keys / "id_ed25519")
    (b.keys / "known_hosts").write_text("[127.0.0.1]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE1hZG8\n")
    for p in (b.keys, *b.keys.iterdir()):
        os.chown(p, KEY_OWNER, KEY_OWNER)
    (b.home / ".ssh").mkdir(parents=True)
    b.secret.parent.mkdir()
    b.secret.write_text(TOKEN + "\n")
    os.chmod(b.secret, 0o600)  # root's: the worker's uid cannot read it in place
    (b.state / "old").mkdir(parents=True)
    (b.state / "old" / "record").write_text("{}")
    for p in (b.state, b.state / "old", b.state / "old" / "record"):
        os.chown(p, OLD_OWNER, OLD_OWNER)
    os.chmod(b.state, 0o755)
    yield b
    shutil.rmtree(path, ignore_errors=True)


def report(result: subprocess.CompletedProcess) -> dict[str, str]:
    assert result.returncode == 0, result.stdout + result.stderr
    return dict(line.split(" ", 1) for line in result.stdout.splitlines())


def fake_agent(box: Box) -> Path:
    path = box.path / "fake-agent"
    path.write_text(FAKE_AGENT)
    os.chmod(path, 0o755)
    return path


def test_the_entry_point_passes_shellcheck():
    result = subprocess.run(["shellcheck", "--shell=sh", str(ENTRYPOINT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_run_starts_the_agent_as_the_key_owner_with_a_private_token_copy_and_the_state_volume(box):
    seen = report(box.run(agent=fake_agent(box)))
    assert seen["args"] == "run", "no command means `mado-tracking-worker run`"
    assert seen["uid"].split() == [str(KEY_OWNER), "gid", str(KEY_OWNER), "groups", str(KEY_OWNER)]
    assert seen["home"] == str(box.home)
    assert seen["token-file"] == str(box.runtime / "token")
    assert seen["token"] == TOKEN
    assert seen["token-mode"] == f"{KEY_OWNER} 600"
    assert seen["env-token"] == "none"
    assert seen["state"] == f"{box.state} {KEY_OWNER} 700"
    assert seen["old-record"] == str(KEY_OWNER), "records of the volume's previous owner are handed over"
    assert seen["key"] == "-----"
    assert seen["ssh"] == "read-only"
    assert (box.keys / "probe").exists() is False
    assert oct(box.keys.stat().st_mode & 0o777) == "0o700", "the mounted keys are left as they are"


def test_arguments_go_to_the_agent_and_other_commands_run_as_the_worker_user(box):
    agent = fake_agent(box)
    assert report(box.run("doctor", agent=agent))["args"] == "doctor"
    assert report(box.run("run", "--once", agent=agent))["args"] == "run --once"
    shell = box.run("sh", "-c", "id -u; test -e \"${MMT_API_TOKEN_FILE:-/nonexistent}\" || echo no-token", agent=agent)
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.split() == [str(KEY_OWNER), "no-token"], "a shell gets no token"


def test_a_missing_token_file_says_where_to_put_it(box):
    box.secret.unlink()
    result = box.run(agent=fake_agent(box))
    assert result.returncode == 1
    assert "./var/worker-token" in result.stderr and "MMT_WORKER_TOKEN_FILE" in result.stderr
    box.secret.mkdir()  # what Docker makes of a bind-mount source that does not exist
    result = box.run("doctor", agent=fake_agent(box))
    assert result.returncode == 1
    assert "is a directory" in result.stderr and "--force-recreate worker" in result.stderr


def test_keys_owned_by_root_leave_the_worker_as_uid_1000_and_say_how_to_fix_it(box):
    for p in (box.keys, *box.keys.iterdir()):
        os.chown(p, 0, 0)
    result = box.run("sh", "-c", "id -u", agent=fake_agent(box))
    assert result.stdout.split() == ["1000"]
    assert "belongs to root" in result.stderr and "chown -R" in result.stderr


def test_started_as_another_user_it_uses_the_secret_in_place_and_changes_nothing(box):
    os.chown(box.secret, KEY_OWNER, KEY_OWNER)
    seen = report(box.run(agent=fake_agent(box), as_uid=KEY_OWNER))
    assert seen["uid"].split()[0] == str(KEY_OWNER)
    assert seen["token-file"] == str(box.secret)
    assert seen["state"] == f"{box.state} {OLD_OWNER} 755", "no chown, no chmod without root"
    assert not box.runtime.exists(), "no copy of the token"


def test_doctor_in_the_container_layout_finds_no_problem(box, live_server, world):
    box.secret.write_text(world.worker_token + "\n")
    shutil.rmtree(box.state)  # a new worker-state volume
    result = box.run("doctor", MMT_API_URL=live_server.url, MMT_WORKER_ID="compose-worker")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert f"ok      state directory {box.state} (mode 700)" in lines
    assert f"ok      {box.home}/.ssh (mode 700)" in lines
    assert f"ok      SSH key {box.home}/.ssh/id_ed25519 (mode 600)" in lines
    assert any(line.startswith("ok      token of project lab") for line in lines), lines
    assert lines[-1] == "No problems found."


def test_the_worker_says_hello_from_the_container_layout_and_reports_its_ssh_paths(box, live_server, world):
    box.secret.write_text(world.worker_token + "\n")
    result = box.run("run", "--once", MMT_API_URL=live_server.url, MMT_WORKER_ID="compose-worker")
    assert result.returncode == 0, result.stdout + result.stderr
    worker = Worker.objects.get(worker_id="compose-worker")
    assert worker.ssh_key_candidates == [f"{box.home}/.ssh/id_ed25519"]
    assert worker.known_hosts_candidates == [f"{box.home}/.ssh/known_hosts"]
    owners = {p.stat().st_uid for p in box.state.rglob("*")}
    assert owners == {KEY_OWNER}, "everything the worker wrote in its state volume is its user's"
