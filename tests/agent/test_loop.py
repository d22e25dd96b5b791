"""The worker loop's own decisions, with a stand-in for the API object (the HTTP side is covered
by test_api_client.py and the real server by test_end_to_end.py)."""
from __future__ import annotations

import threading
import time
from pathlib import Path

from worker_agent import __version__
from worker_agent.api import ApiError, ApiUnavailable, FatalApiError
from worker_agent.config import WorkerConfig
from worker_agent.loop import Worker
from worker_agent.ssh import ConnectionPool


class StandInApi:
    def __init__(self):
        self.hellos: list[dict] = []
        self.completed: list[tuple] = []
        self.check_answers: list = []
        self.read_answers: list = []
        self.hello_answer = {"worker_id": "w1", "online": True, "hello_interval_seconds": 60}
        self.complete_error: Exception | None = None
        self.goodbyes: list[str] = []

    def hello(self, payload):
        self.hellos.append(payload)
        if isinstance(self.hello_answer, Exception):
            raise self.hello_answer
        return self.hello_answer

    def _next(self, answers, wait):
        if answers:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer
        time.sleep(min(wait, 0.05))
        return None

    def claim_check(self, worker_id, wait=0):
        return self._next(self.check_answers, wait)

    def claim_read(self, worker_id, wait=0):
        return self._next(self.read_answers, wait)

    def complete_check(self, *args):
        self.completed.append(("check", *args))
        if self.complete_error:
            raise self.complete_error
        return {}

    def complete_read(self, *args):
        self.completed.append(("read", *args))
        return {}

    def goodbye(self, worker_id):
        self.goodbyes.append(worker_id)
        return {"online": False, "released_job_ids": []}


def config(tmp_path, **extra) -> WorkerConfig:
    ssh = tmp_path / "ssh"
    ssh.mkdir(exist_ok=True)
    return WorkerConfig(api_url="http://127.0.0.1:9", token="mmt_" + "t" * 43, worker_id="w1",
                        state_dir=tmp_path / "state", target_ids=[3], ssh_dirs=[ssh], hostname="box", **extra)


def test_hello_reports_identity_and_rescans_key_candidates(tmp_path):
    api = StandInApi()
    worker = Worker(config(tmp_path), api=api)
    worker.hello()
    key = Path(tmp_path / "ssh" / "id_new")
    key.write_text("k")
    key.chmod(0o600)
    worker.hello()
    first, second = api.hellos
    assert first == {"worker_id": "w1", "version": __version__, "hostname": "box", "parallel_jobs": 2,
                     "target_ids": [3], "capabilities": ["checks", "reads", "key_candidates"],
                     "ssh_key_candidates": [], "known_hosts_candidates": []}
    assert second["ssh_key_candidates"] == [str(key)], "a key added since the last hello is reported"


def test_the_servers_hello_interval_is_followed_within_bounds(tmp_path):
    api = StandInApi()
    worker = Worker(config(tmp_path), api=api)
    api.hello_answer = {"hello_interval_seconds": 30}
    worker.hello()
    assert worker.hello_interval == 30
    api.hello_answer = {"hello_interval_seconds": 0}
    worker.hello()
    assert worker.hello_interval == 30, "an absurd interval is ignored"


def test_a_read_is_reported_with_its_lease_and_a_refused_result_does_not_stop_the_worker(tmp_path):
    api = StandInApi()
    worker = Worker(config(tmp_path, allow_local=True), api=api, pool=ConnectionPool(allow_local=True))
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "a").write_text("")
    worker.handle_read({"id": 9, "lease_id": "L9", "path": str(tmp_path / "dir"), "connection": {"kind": "local"}})
    assert api.completed == [("read", 9, "w1", "L9", [{"name": "a", "kind": "file"}], None)]

    api.complete_error = ApiError("This lease is not the check's current lease.", status=409, code="invalid_lease")
    worker.handle_check({"id": 4, "lease_id": "L4", "computer": {"id": 1, "kind": "local"}})
    assert api.completed[-1][:5] == ("check", 4, "w1", "L4", "succeeded")


def run_in_thread(worker) -> tuple[threading.Thread, list]:
    codes = []
    thread = threading.Thread(target=lambda: codes.append(worker.run_forever(install_signals=False)), daemon=True)
    thread.start()
    return thread, codes


def test_a_rejected_token_during_claims_stops_the_worker_with_exit_1(tmp_path):
    api = StandInApi()
    api.check_answers = [ApiUnavailable("down"), FatalApiError("The API server rejected the worker token (401).")]
    worker = Worker(config(tmp_path), api=api)
    worker._backoff.base = 0.01
    thread, codes = run_in_thread(worker)
    thread.join(timeout=10)
    assert codes == [1] and "rejected the worker token" in str(worker.fatal)


def test_transient_failures_are_retried_and_a_stop_request_ends_the_loop(tmp_path):
    api = StandInApi()
    api.read_answers = [ApiUnavailable("down"), ApiUnavailable("still down")]
    api.hello_answer = ApiUnavailable("down")
    worker = Worker(config(tmp_path), api=api)
    worker._backoff.base = 0.01
    thread, codes = run_in_thread(worker)
    deadline = time.monotonic() + 5
    while api.read_answers and time.monotonic() < deadline:
        time.sleep(0.01)
    assert api.read_answers == [], "the read claim was tried again after each failure"
    assert thread.is_alive(), "network trouble never stops the worker"
    worker.stop_event.set()
    thread.join(timeout=5)
    assert codes == [0] and len(api.hellos) >= 2
    assert api.goodbyes == ["w1"], "a stopping worker drains: it tells the server before it exits"


def test_a_worker_stopped_by_a_rejected_token_says_no_goodbye(tmp_path):
    api = StandInApi()
    api.check_answers = [FatalApiError("The API server rejected the worker token (401).")]
    worker = Worker(config(tmp_path), api=api)
    thread, codes = run_in_thread(worker)
    thread.join(timeout=10)
    assert codes == [1] and api.goodbyes == []
