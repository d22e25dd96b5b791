"""End to end: the real Django server (live_server on PostgreSQL), a real `mado-tracking-worker run`
process and a real sshd. An admin asks through the API; the worker claims, connects and reports."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests

from computers import services as computer_services
from mado import services
from mado.services import Actor
from tests.agent.conftest import chown_tree
from tests.support import other_sessions
from tests.support import wait_for as wait_until
from worker_agent.journal import is_locked

WORKER = str(Path(sys.executable).with_name("mado-tracking-worker"))
ADMIN_SCOPES = ["read", "admin"]
# Short long-polls, so that the server's requests end soon after a test stops its worker and the
# test database can be dropped; a read is still answered as soon as the server wakes the poll.
CLAIM_WAIT = 2


class Api:
    def __init__(self, base: str, token: str):
        self.base = base
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def get(self, path):
        response = self.session.get(self.base + path, timeout=10)
        assert response.status_code == 200, response.text
        return response.json()

    def post(self, path, body):
        response = self.session.post(self.base + path, json=body, timeout=10)
        assert response.status_code == 201, response.text
        return response.json()


class WorkerProcess:
    def __init__(self, base: str, token: str, state_dir: Path, home: Path, ssh_dir: Path, worker_id="lab-worker-1",
                 args=("run",)):
        self.state_dir = state_dir
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MMT_", "MADO_"))}
        env.update(HOME=str(home), MMT_API_URL=base, MMT_API_TOKEN=token, MMT_WORKER_ID=worker_id,
                   MMT_WORKER_STATE_DIR=str(state_dir), MMT_WORKER_SSH_DIR=str(ssh_dir), MMT_LOG_LEVEL="debug",
                   MMT_WORKER_CLAIM_WAIT=str(CLAIM_WAIT))
        self.log = state_dir.parent / f"{worker_id}-{uuid.uuid4().hex[:6]}.log"
        self.log_file = open(self.log, "wb")
        self.process = subprocess.Popen([WORKER, *args], env=env, stdout=self.log_file, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout=20) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log_file.close()
        return self.process.returncode


def finished(admin: Api, path: str, **kwargs) -> dict:
    """The check or read at `path` once it has ended."""
    ended = ("succeeded", "failed", "expired", "done")
    return wait_until(lambda: (body := admin.get(path))["status"] in ended and body, **kwargs)


@pytest.fixture
def setup(transactional_db, live_server, world, sshd, tmp_path):
    admin = Api(live_server.url, world.token(world.global_admin, ADMIN_SCOPES))
    computer = computer_services.register_computer(Actor(world.global_admin), {
        "name": "sshd-peer", "kind": "ssh", "host": "127.0.0.1", "port": sshd.port, "ssh_user": sshd.user,
        "ssh_key_path": str(sshd.key_path), "known_hosts_path": str(sshd.known_hosts_path),
    })
    home = tmp_path / "home"
    home.mkdir()
    state_dir = tmp_path / "state"
    workers = []

    def start(token=None, **kwargs) -> WorkerProcess:
        w = WorkerProcess(live_server.url, token or world.worker_token, kwargs.pop("state_dir", state_dir), home,
                          sshd.client_dir, **kwargs)
        workers.append(w)
        return w

    def online(worker_id="lab-worker-1"):
        rows = admin.get("/api/workers")["items"]
        return next((r for r in rows if r["worker_id"] == worker_id and r["online"]), None)

    yield type("Setup", (), {"admin": admin, "computer": computer, "start": staticmethod(start),
                             "online": staticmethod(online), "state_dir": state_dir, "world": world,
                             "url": live_server.url})
    for w in workers:
        w.stop()
    # The live server keeps a database connection per open HTTP connection, and holds a long-poll
    # until its wait ends even when the worker has gone: let both end, so the test database can go.
    admin.session.close()
    wait_until(lambda: not other_sessions(), timeout=CLAIM_WAIT + 10, interval=0.1)


def test_a_started_worker_is_online_with_its_key_candidates(setup, sshd):
    worker = setup.start()
    row = wait_until(setup.online)
    assert row["version"] == "0.1.0" and row["hostname"] == os.uname().nodename
    assert row["parallel_jobs"] == 2 and row["target_ids"] is None
    assert set(row["capabilities"]) == {"checks", "reads", "key_candidates", "jobs", "cluster_jobs", "gpu_watch"}
    assert str(sshd.key_path) in row["ssh_key_candidates"]
    assert str(sshd.known_hosts_path) in row["known_hosts_candidates"]
    assert worker.process.poll() is None


def test_a_check_naming_the_worker_is_claimed_and_its_result_lands(setup, sshd):
    worker = setup.start()
    wait_until(setup.online)
    url = f"/api/computers/{setup.computer.pk}/checks"
    check = setup.admin.post(url, {"worker_id": "lab-worker-1"})
    assert check["status"] == "queued"
    done = finished(setup.admin, f"{url}/{check['id']}", timeout=30)
    assert done["status"] == "succeeded", done
    assert done["claimed_by"] == "lab-worker-1"
    items = {i["key"]: i for i in done["result"]["items"]}
    assert [i["key"] for i in done["result"]["items"]][:2] == ["connection", "python"]
    assert items["connection"]["status"] == "ok" and items["connection"]["label"] == "SSH connection"
    assert all(items[k]["status"] == "ok" for k in ("python", "venv", "pip", "git"))
    assert items["api"]["status"] == "ok", "the target reaches the worker's MMT_API_URL"
    assert done["result"]["machine"]["arch"] == "amd64" and done["result"]["machine"]["home"] == str(sshd.home)
    assert any(p["path"] == "/usr/bin/python3" for p in done["result"]["pythons"])
    assert "python" in done["result"]["runtimes"]
    assert str(sshd.key_path) not in str(done) and worker.process.poll() is None


def test_a_check_with_an_unknown_host_key_lands_as_failed_with_the_resolution(setup, tmp_path):
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    computer = computer_services.register_computer(Actor(setup.world.global_admin), {
        "name": "unknown-key", "kind": "ssh", "host": "127.0.0.1", "port": setup.computer.port, "ssh_user": "mmt",
        "ssh_key_path": setup.computer.ssh_key_path, "known_hosts_path": str(empty)})
    setup.start()
    wait_until(setup.online)
    url = f"/api/computers/{computer.pk}/checks"
    check = setup.admin.post(url, {"worker_id": "lab-worker-1"})
    done = finished(setup.admin, f"{url}/{check['id']}", timeout=30)
    first = done["result"]["items"][0]
    assert done["status"] == "failed" and done["failure_text"] == "Could not verify connection"
    assert (first["status"], first["code"]) == ("failed", "host_key_unknown")
    assert "ssh-keyscan" in first["resolution"] and "ssh-keyscan" in first["detail"]
    assert str(empty) not in str(done)


def test_a_directory_read_round_trip_lists_the_directory_twice_in_a_row(setup, sshd, target_dir):
    """The round trip's figures are printed (about 0.1 s here when the machine is quiet); a busy machine
    stretches them, so they are not asserted (DEVELOPERS: speed goals live in bench/)."""
    (target_dir / "data").mkdir()
    (target_dir / "run.sh").write_text("#!/bin/sh\n")
    (target_dir / "run.sh").chmod(0o755)
    (target_dir / ".cache").mkdir()
    chown_tree(sshd, target_dir)
    setup.start()
    wait_until(setup.online)
    url = f"/api/computers/{setup.computer.pk}/reads"
    figures = []
    for attempt in ("first (opens the SSH connection)", "second (reuses it)"):
        started = time.monotonic()
        read = setup.admin.post(url, {"path": str(target_dir) + "/", "worker_id": "lab-worker-1"})
        done = finished(setup.admin, f"{url}/{read['id']}", timeout=60, interval=0.005)
        elapsed = time.monotonic() - started
        figures.append(elapsed)
        print(f"directory read round trip, {attempt}: {elapsed * 1000:.0f} ms")
        assert done["status"] == "done", done
        assert sorted((e["name"], e["kind"]) for e in done["entries"]) == [
            (".cache", "dir"), ("data", "dir"), ("run.sh", "exec")]

    missing = setup.admin.post(url, {"path": str(target_dir / "nope") + "/", "worker_id": "lab-worker-1"})
    done = finished(setup.admin, f"{url}/{missing['id']}")
    assert (done["status"], done["error"]) == ("failed", "not_found")


def test_sigterm_stops_the_worker_cleanly_and_frees_the_lock(setup):
    worker = setup.start()
    wait_until(setup.online)
    assert is_locked(setup.state_dir)
    started = time.monotonic()
    code = worker.stop()
    print(f"worker exit after SIGTERM: {(time.monotonic() - started) * 1000:.0f} ms")
    assert code == 0, worker.output()
    assert time.monotonic() - started < 5
    assert "worker lab-worker-1 stopped" in worker.output()
    assert not is_locked(setup.state_dir)


def test_a_second_worker_on_the_same_state_dir_is_refused(setup):
    setup.start()
    wait_until(setup.online)
    second = setup.start(worker_id="lab-worker-2")
    assert second.process.wait(timeout=20) == 1
    assert "is already using the state directory" in second.output()
    assert setup.online("lab-worker-2") is None


def test_a_revoked_token_stops_the_worker_with_a_sentence(setup):
    token = setup.world.token(setup.world.service_account.user, ["read", "worker:execute", "artifacts:write"],
                              kind="service")
    from mado.models import ApiToken
    from mado.tokens import hash_token
    services.revoke_token(services.SYSTEM, ApiToken.objects.get(token_hash=hash_token(token)))
    worker = setup.start(token=token, state_dir=setup.state_dir.parent / "state-revoked")
    assert worker.process.wait(timeout=20) == 1
    output = worker.output()
    assert "rejected the worker token (401)" in output and "install" in output
    assert token not in output


def test_a_token_without_worker_scope_is_refused(setup):
    token = setup.world.token(setup.world.service_account.user, ["read"], kind="service")
    worker = setup.start(token=token, state_dir=setup.state_dir.parent / "state-read-only")
    assert worker.process.wait(timeout=20) == 1
    assert "lacks the worker:execute scope" in worker.output() and token not in worker.output()



def test_run_once_announces_handles_what_waits_and_exits(setup):
    first = setup.start(args=("run", "--once"))
    assert first.process.wait(timeout=30) == 0, first.output()
    assert setup.online() is not None, "one hello makes the worker online"
    url = f"/api/computers/{setup.computer.pk}/checks"
    check = setup.admin.post(url, {"worker_id": "lab-worker-1"})
    second = setup.start(args=("run", "--once"))
    assert second.process.wait(timeout=60) == 0, second.output()
    assert setup.admin.get(f"{url}/{check['id']}")["status"] == "succeeded"
