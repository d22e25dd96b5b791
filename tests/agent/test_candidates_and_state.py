"""Key candidates reported with hello, the configuration from the environment, and the state
directory with its lock."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from worker_agent.candidates import LIMIT, scan
from worker_agent.config import ConfigError, WorkerConfig, parse_target_ids, validate_worker_id
from worker_agent.journal import LockHeld, StateDir, StateDirError, is_locked


def touch(path, mode=0o644, text="x"):
    path.write_text(text)
    path.chmod(mode)


def test_candidates_follow_the_naming_rules(tmp_path):
    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    for name in ("id_ed25519", "id_rsa", "server.pem", "deploy.key"):
        touch(ssh / name, 0o600)
    touch(ssh / "mmt_worker", 0o600)  # any owner-only file is a key candidate
    touch(ssh / "id_ed25519.pub")
    touch(ssh / "notes.txt")  # readable by others and not named like a key
    touch(ssh / "config", 0o600)
    touch(ssh / "authorized_keys", 0o600)
    touch(ssh / "known_hosts")
    touch(ssh / "known_hosts_lab")
    (ssh / "id_dir").mkdir()
    extra = tmp_path / "keys"
    extra.mkdir()
    touch(extra / "lab.pem", 0o644)
    touch(extra / "known_hosts.gpu")
    (extra / "sub").mkdir()
    touch(extra / "sub" / "id_nested", 0o600)

    found = scan([ssh, extra])
    keys = ("deploy.key", "id_ed25519", "id_rsa", "mmt_worker", "server.pem")
    assert found.ssh_keys == [str(ssh / n) for n in keys] + [str(extra / "lab.pem")]
    assert found.known_hosts == [str(ssh / "known_hosts"), str(ssh / "known_hosts_lab"), str(extra / "known_hosts.gpu")]
    assert all(os.path.isabs(p) for p in found.ssh_keys + found.known_hosts)


def test_candidates_are_capped_and_a_missing_directory_is_fine(tmp_path):
    for i in range(LIMIT + 10):
        touch(tmp_path / f"id_{i:03d}", 0o600)
        touch(tmp_path / f"known_hosts_{i:03d}")
    found = scan([tmp_path, tmp_path / "absent"])
    assert len(found.ssh_keys) == LIMIT and len(found.known_hosts) == LIMIT


def test_candidates_never_open_the_files(tmp_path, monkeypatch):
    touch(tmp_path / "id_ed25519", 0o600)
    touch(tmp_path / "known_hosts")

    def refuse(*args, **kwargs):
        raise AssertionError(f"opened {args[0]}")

    monkeypatch.setattr("builtins.open", refuse)
    monkeypatch.setattr(os, "open", refuse)
    found = scan([tmp_path])
    assert found.ssh_keys == [str(tmp_path / "id_ed25519")] and found.known_hosts == [str(tmp_path / "known_hosts")]


def env(**values):
    base = {"MMT_API_URL": "http://127.0.0.1:8000/", "MMT_WORKER_ID": "gpu-host-1",
            "MMT_API_TOKEN": "mmt_" + "a" * 43, "HOME": "/home/w"}
    base.update(values)
    return {k: v for k, v in base.items() if v is not None}


def test_configuration_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    config = WorkerConfig.from_env(env(MMT_WORKER_TARGET_IDS="3, 5,3", MMT_WORKER_SSH_DIR="/srv/keys"))
    assert config.api_url == "http://127.0.0.1:8000" and config.target_ids == [3, 5]
    assert config.state_dir == tmp_path / ".local/state/mado-tracking-worker/gpu-host-1"
    assert [str(p) for p in config.ssh_dirs] == [str(tmp_path / ".ssh"), "/srv/keys"]
    assert config.allow_local is False and config.parallel_jobs == 2
    both = WorkerConfig.from_env(env(MADO_DEV_MODE="true", MMT_ALLOW_LOCAL_EXECUTOR="true"))
    assert both.allow_local is True
    assert WorkerConfig.from_env(env(MMT_ALLOW_LOCAL_EXECUTOR="true")).allow_local is False

    token_file = tmp_path / "token"
    token_file.write_text("mmt_" + "b" * 43 + "\n")
    assert WorkerConfig.from_env(env(MMT_API_TOKEN=None, MMT_API_TOKEN_FILE=str(token_file))).token.endswith("b" * 43)


@pytest.mark.parametrize("values, message", [
    ({"MMT_API_URL": None, "MMT_API_TOKEN": None}, "Set MMT_API_URL, MMT_API_TOKEN (or MMT_API_TOKEN_FILE)"),
    ({"MMT_API_URL": "tracking.example"}, "give the server's address with http:// or https://"),
    ({"MMT_WORKER_ID": "-bad id"}, "is not valid: use 1 to 64 letters"),
    ({"MMT_WORKER_TARGET_IDS": "3,x"}, "give computer ids separated by commas"),
    ({"MMT_API_TOKEN": "mado_mtj_" + "a" * 40}, "This is a job token"),
    ({"MMT_API_TOKEN": "mmtj_" + "a" * 40}, "This is a job token (mmtj_…)"),  # issued before mado_mtj_
    ({"MMT_API_TOKEN": "hello"}, "starts with mmt_"),
    ({"MMT_API_TOKEN": None, "MMT_API_TOKEN_FILE": "/nonexistent/token"}, "does not exist"),
    ({"MMT_WORKER_PARALLEL_JOBS": "0"}, "from 1 to 128"),
    ({"MMT_WORKER_STATE_DIR": "relative/dir"}, "must be an absolute path"),
    ({"MADO_DEV_MODE": "maybe"}, "must be true or false"),
])
def test_configuration_errors_say_what_to_change(values, message):
    with pytest.raises(ConfigError) as caught:
        WorkerConfig.from_env(env(**values))
    assert message in str(caught.value)
    assert "a" * 40 not in str(caught.value), "the token never appears in a message"


def test_worker_ids_and_target_ids():
    assert validate_worker_id("lab-worker_1.a") == "lab-worker_1.a"
    for bad in ("", ".x", "a" * 65, "a b", "ä"):
        with pytest.raises(ConfigError):
            validate_worker_id(bad)
    assert parse_target_ids("") is None and parse_target_ids(" 7 ") == [7]


def test_the_state_dir_is_private_and_refuses_symlinks(tmp_path):
    state = StateDir(tmp_path / "a" / "state")
    state.ensure()
    assert oct(os.stat(state.path).st_mode & 0o777) == "0o700"
    wide = tmp_path / "wide"
    wide.mkdir(mode=0o755)
    wide.chmod(0o755)
    with pytest.raises(StateDirError, match="chmod 700"):
        StateDir(wide).ensure()
    link = tmp_path / "link"
    link.symlink_to(state.path)
    with pytest.raises(StateDirError, match="symbolic link"):
        StateDir(link).ensure()


def test_a_second_worker_on_the_same_state_dir_is_refused(tmp_path):
    state = StateDir(tmp_path / "state")
    state.ensure()
    state.lock()
    try:
        assert is_locked(state.path)
        # Another process: flock is per open file, so a real second process is the honest test.
        code = textwrap.dedent(f"""
            from pathlib import Path
            from worker_agent.journal import StateDir, LockHeld
            try:
                StateDir(Path({str(state.path)!r})).lock()
            except LockHeld as exc:
                print(exc.pid, exc)
        """)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert out.startswith(f"{os.getpid()} Another worker (pid {os.getpid()}) is already using")
        with pytest.raises(LockHeld):
            StateDir(state.path).lock()
    finally:
        state.unlock()
    assert not is_locked(state.path)
