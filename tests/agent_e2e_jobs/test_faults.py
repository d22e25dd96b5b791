"""Faults in the middle of a running job, with real processes: the worker SIGKILLed and started again,
the target's sshd killed and started again, the API server gone for seconds. In each case the job
keeps running on its target, is never started a second time, every log line reaches the server once
and in order, and the job completes exactly once with its GPUs released."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from jobs.models import JobEvent, LogChunk, Metric
from mado import longpoll
from tests.agent_e2e_jobs.conftest import WORKER, FlakyPort, counter_errors, counter_lines, job_lines, wait_until
from tests.peers.sshd import SSHD, start_sshd
from tests.support import processes_under
from worker_agent import supervisor


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def target_state(e2e, job) -> dict:
    path = os.path.join(supervisor.workspace(str(e2e.working_dir), job.pk), "state.json")
    with open(path) as f:
        return json.load(f)


def assert_complete_logs(e2e, job, lines: int) -> None:
    assert e2e.stream(job, "stdout").splitlines() == counter_lines(lines)
    assert job_lines(e2e.stream(job, "stderr"), "err ") == counter_errors(lines)
    e2e.assert_delivered_in_order(job)


def test_a_worker_killed_mid_job_is_started_again_and_re_attaches_and_sigterm_leaves_the_job_running(e2e):
    first = e2e.start_worker()
    # It holds before line 4000 until the third worker runs, so it outlasts the restarts however long they take.
    job = e2e.counter_job("killed", lines=6000, pause=0.001, hold_at=4000, gpu_ids=["1"])
    e2e.wait_log(job, "line 000400", timeout=60)
    first.kill()
    assert e2e.journal() == [f"{job.pk}.json"]
    record_file = e2e.state_dir / "jobs" / f"{job.pk}.json"
    assert (record_file.stat().st_mode & 0o777, (e2e.state_dir / "jobs").stat().st_mode & 0o777) == (0o600, 0o700)
    record = json.loads(record_file.read_text())
    assert record["lease_id"] == str(e2e.job(job).lease_id) and record["job_token"].startswith("mado_mtj_")
    status = subprocess.run([WORKER, "status", "--worker-id", "lab-worker-1", "--state-dir", str(e2e.state_dir),
                             "--json"], capture_output=True, text=True, timeout=60)
    shown = json.loads(status.stdout)["jobs"]
    assert [j["job_id"] for j in shown] == [job.pk] and record["job_token"] not in status.stdout
    pid = int(e2e.starts("killed")[0])
    time.sleep(0.3)
    assert pid_alive(pid), "the job runs on without its worker"
    assert e2e.job(job).status == "running"

    second = e2e.start_worker()
    e2e.wait_log(job, "line 002500", timeout=60)
    assert second.stop() == 0, "SIGTERM: the worker stops cleanly"
    assert pid_alive(pid), "SIGTERM to the worker leaves the job running"
    assert f"left 1 job(s) running on their targets: {job.pk}" in second.output()
    assert e2e.journal() == [f"{job.pk}.json"]

    third = e2e.start_worker()
    e2e.release("killed")
    e2e.wait_ended(job, timeout=60)
    job = e2e.assert_ended_once(job, "finished")
    assert_complete_logs(e2e, job, 6000)
    assert e2e.starts("killed") == [str(pid)], "no second process was started"
    assert target_state(e2e, job)["recoveries"] == 0, "the supervisor itself was not replaced"
    assert f"resuming job {job.pk}" in second.output() and f"resuming job {job.pk}" in third.output()
    # Without NVML (no NVIDIA library here) the worker says why, once, and reports no GPU metrics.
    assert first.output().count("GPU telemetry off: NVML could not start (NVMLError_LibraryNotFound") == 1
    assert not Metric.objects.filter(job_id=job.pk, name__startswith="system/gpu/").exists()


@pytest.fixture
def sshd():
    """An sshd of this test alone: it gets killed."""
    server = start_sshd()
    yield server
    server.stop()


def kill_sshd(sshd) -> None:
    """The listening sshd and every session it forked (so each connection drops), by PID."""
    def children(pid: int) -> list[int]:
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat", "rb") as f:
                        if int(f.read().rsplit(b")", 1)[1].split()[1]) == pid:
                            found.append(int(name))
                except OSError:
                    continue
        return found

    tree, todo = [], [sshd.process.pid]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += [c for c in children(pid) if open(f"/proc/{c}/comm").read().strip() == "sshd"]
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    sshd.process.wait()


def restart_sshd(sshd) -> None:
    log = open(sshd.server_dir / "sshd.log", "ab")
    sshd.process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(sshd.server_dir / "sshd_config")], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    import socket

    def listening():
        try:
            socket.create_connection(("127.0.0.1", sshd.port), timeout=0.5).close()
            return True
        except OSError:
            return False

    wait_until(listening, timeout=10, what="sshd to listen again")


def test_sshd_killed_and_started_again_mid_job_the_job_runs_on_and_the_worker_reconnects(e2e):
    worker = e2e.start_worker()
    job = e2e.counter_job("sshd", lines=1500, pause=0.004)
    e2e.wait_log(job, "line 000200", timeout=60)
    kill_sshd(e2e.sshd)
    pid = int(e2e.starts("sshd")[0])
    # The worker's stream broke only once the sshd holding the job's session was gone (its socket closed
    # with it); the job prints on after that: it outlived its target's sshd.
    wait_until(lambda: f"job {job.pk}: log stream interrupted" in worker.output(), timeout=30,
               what=lambda: f"the worker to lose its log stream with the sshd: {worker.output()[-2000:]}")
    stdout_log = os.path.join(supervisor.workspace(str(e2e.working_dir), job.pk), "stdout.log")
    printed = os.path.getsize(stdout_log)
    wait_until(lambda: os.path.getsize(stdout_log) > printed and pid_alive(pid), timeout=30,
               what=lambda: f"the job to print on while its target's sshd is gone (pid {pid} alive: "
                            f"{pid_alive(pid)}, stdout.log {os.path.getsize(stdout_log)} bytes, {printed} before)")
    restart_sshd(e2e.sshd)
    e2e.wait_ended(job, timeout=60)
    job = e2e.assert_ended_once(job, "finished")
    assert_complete_logs(e2e, job, 1500)
    assert e2e.starts("sshd") == [str(pid)]
    assert "log stream interrupted" in worker.output()
    assert worker.process.poll() is None


def test_the_api_server_gone_mid_job_logs_and_completion_arrive_after_it_returns(e2e):
    port = FlakyPort(e2e.live_server.thread.port)
    try:
        worker = e2e.start_worker(url=port.url)
        # Held after line 30 until the server is gone: on a busy machine the job would otherwise end, and
        # the worker report it, before line 30 had even reached the server.
        job = e2e.counter_job("api", lines=300, pause=0.01, gpu_ids=["0"], hold_at=31)
        e2e.wait_log(job, "line 000030", timeout=60)
        port.down()
        down = len(worker.output())
        e2e.release("api")
        stdout_log = os.path.join(supervisor.workspace(str(e2e.working_dir), job.pk), "stdout.log")
        wait_until(lambda: open(stdout_log).read().endswith("done\n"), timeout=30, what="the job to end on its target")
        # The server stays gone until a heartbeat has failed (one every 5 s, retried once) and the worker has
        # failed to get through once more after the job's end (its logs or a heartbeat).
        ended = len(worker.output())
        beat = f"retrying POST worker/jobs/{job.pk}/heartbeat"
        tries = (f"job {job.pk}: logs not delivered yet", beat)
        wait_until(lambda: beat in (out := worker.output())[down:] and any(t in out[ended:] for t in tries),
                   timeout=30, what=lambda: f"a failed heartbeat and a failed try after the job's end: "
                                            f"{worker.output()[down:][-3000:]!r}")
        assert e2e.job(job).status == "running", "nothing could reach the server meanwhile"
        port.up()
        e2e.wait_ended(job, timeout=60)
        job = e2e.assert_ended_once(job, "finished")
        assert_complete_logs(e2e, job, 300)
        assert len(e2e.starts("api")) == 1
        assert "retrying POST worker/jobs/" in worker.output()
        assert not processes_under(supervisor.workspace(str(e2e.working_dir), job.pk))
    finally:
        port.close()


def test_a_log_batch_the_server_stored_but_never_acknowledged_is_not_stored_twice_after_a_crash(e2e):
    """The worker journals a batch's chunk boundaries before posting it. Here the server stores the batch
    but its answer is lost, and the worker is SIGKILLed while waiting: the next worker follows again from
    the last acknowledged offsets and cuts the re-sent chunks exactly as before, so the server recognises
    them, and the stream stays contiguous."""
    port = FlakyPort(e2e.live_server.thread.port)
    try:
        first = e2e.start_worker(url=port.url)
        job = e2e.counter_job("unacked", lines=2500, pause=0.002)
        e2e.wait_log(job, "line 000300", timeout=60)
        port.swallow_answers = True
        record = e2e.state_dir / "jobs" / f"{job.pk}.json"

        def stored_but_unacknowledged():
            pending = json.loads(record.read_text())["pending"]
            return pending and LogChunk.objects.filter(job_id=job.pk, stream=pending[0][0],
                                                       offset=pending[0][1]).exists()

        wait_until(stored_but_unacknowledged, timeout=30, what="a batch stored by the server but not acknowledged")
        first.kill()
        port.swallow_answers = False
        second = e2e.start_worker(url=port.url)
        e2e.wait_ended(job, timeout=60)
        job = e2e.assert_ended_once(job, "finished")
        assert_complete_logs(e2e, job, 2500)
        assert "were in flight when the worker stopped; sending them again cut at the same offsets" in second.output()
        assert len(e2e.starts("unacked")) == 1
    finally:
        port.close()


def test_a_claim_whose_answer_was_lost_is_recovered_by_resume_and_never_sent_again(e2e):
    """The server hands out a job, but the answer to the claim never arrives (the connection breaks): the
    worker does not send the claim again, it asks `resume`, which returns the job with its lease."""
    port = FlakyPort(e2e.live_server.thread.port)
    try:
        worker = e2e.start_worker(url=port.url)
        wait_until(lambda: "worker lab-worker-1 0.1.0 started" in worker.output(), timeout=30, what="the worker")
        wait_until(lambda: longpoll.hub().parked("mado_jobs")[0], timeout=30,
                   what="the worker's job claim to wait in its long-poll")
        port.swallow_answers = True
        job = e2e.counter_job("lost-claim", lines=50, pause=0.001)
        wait_until(lambda: e2e.job(job).status == "claimed", timeout=30, what="the server to hand the job out")
        port.down()  # the claim's connection breaks without an answer
        port.swallow_answers = False
        port.up()
        e2e.wait_ended(job, timeout=60)
        job = e2e.assert_ended_once(job, "finished")
        assert_complete_logs(e2e, job, 50)
        assert list(JobEvent.objects.filter(job_id=job.pk, kind="claimed").values_list("kind", flat=True)) == \
            ["claimed"], "claimed once"
        output = worker.output()
        assert "asking the server what this worker holds instead of claiming again" in output
        assert f"job {job.pk} was claimed although the claim's answer was lost; running it" in output
        assert len(e2e.starts("lost-claim")) == 1
    finally:
        port.close()
