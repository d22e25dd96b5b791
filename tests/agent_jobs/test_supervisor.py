"""The supervisor on this machine: `python3 supervisor.py start|poll|cancel|follow <job_dir>` in a temporary
working directory, with real processes, signals and process groups."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.agent_jobs.conftest import PYTHON, Local, kill_quietly, live_processes_with, process_spec, wait_for
from worker_agent import supervisor
from worker_agent.ssh import LocalConnection
from worker_agent.supervisor import LogChunk, Remote, StateFrame

TRAPS_SIGTERM = """
import signal, sys, time
def on_term(signum, frame):
    print("got SIGTERM, cleaning up", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""

IGNORES_SIGTERM = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print("child", child.pid, flush=True)
while True:
    time.sleep(0.05)
"""


def marker_script(marker: Path, body: str = "time.sleep(1.0)") -> str:
    return f"import os, time\nopen({str(marker)!r}, 'a').write(f'{{os.getpid()}}\\n')\n{body}\n"


def test_start_runs_the_job_to_its_exit_code_and_logs(local, working_dir, tmp_path):
    # The job goes on only when the test lets it (a file appears), so its identity is read while it runs,
    # however busy the machine is.
    release = tmp_path / "release"
    script = ("import os, sys, time\nprint('out 1'); print('out 2', flush=True)\nprint('err 1', file=sys.stderr)\n"
              f"deadline = time.monotonic() + 60\nwhile not os.path.exists({str(release)!r}) and "
              "time.monotonic() < deadline:\n    time.sleep(0.02)\nprint('out 3')\nsys.exit(3)\n")
    started = local.start(process_spec(working_dir, script=script))
    assert started["started"] is True and started["status"] == "starting"
    assert started["supervisor_alive"] is True
    running = local.wait_status("7", "running")
    assert running["pid"] and running["pgid"] == running["pid"]
    assert running["process_alive"] is True
    assert running["identity"] == supervisor.identity(running["pid"])
    release.touch()
    done = local.wait_status("7", "exited")
    assert (done["exit_code"], done["signal"], done["error"]) == (3, None, None)
    assert done["started_at"] <= done["ended_at"] and done["process_alive"] is False
    assert local.read("7", "stdout.log") == "out 1\nout 2\nout 3\n"
    assert local.read("7", "stderr.log") == "err 1\n"
    assert (done["stdout_size"], done["stderr_size"]) == (18, 6)
    job_dir = Path(local.job_dir("7"))
    assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700
    for name in ("spec.json", "state.json", "stdout.log", "stderr.log"):
        assert stat.S_IMODE((job_dir / name).stat().st_mode) == 0o600, name
    assert (job_dir / "outputs").is_dir()


def test_a_second_start_returns_the_same_state_and_starts_nothing(local, working_dir, tmp_path):
    marker = tmp_path / "starts.txt"
    spec = process_spec(working_dir, script=marker_script(marker))
    first = local.start(spec)
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(local.start(spec))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [a["started"] for a in answers] == [False] * 4
    assert {a["supervisor"]["pid"] for a in answers} == {first["supervisor"]["pid"]}
    assert {a["spec_hash"] for a in answers} == {first["spec_hash"], supervisor.spec_hash(spec)}
    done = local.wait_status("7", "exited")
    again = local.start(spec)
    assert again["started"] is False and again["status"] == "exited" and again["pid"] == done["pid"]
    assert marker.read_text().splitlines() == [str(done["pid"])]


def test_a_different_lease_or_spec_is_refused_but_a_new_token_is_the_same_start(local, working_dir):
    spec = process_spec(working_dir, script="import time; time.sleep(0.5)",
                        env={"MMT_API_TOKEN": "mado_mtj_first"}, secrets=["mado_mtj_first"])
    first = local.start(spec)
    other_lease = local.start(dict(spec, lease_id="lease-other"), check=False)
    assert other_lease["rc"] == 3 and other_lease["code"] == "state_mismatch"
    assert "lease_id" in other_lease["error"]
    other_command = local.start(dict(spec, argv=[PYTHON, "-c", "print(1)"]), check=False)
    assert other_command["rc"] == 3 and other_command["code"] == "state_mismatch"
    assert "spec_hash" in other_command["error"]
    # resume hands out a fresh job token: the same job, not another start
    new_token = local.start(dict(spec, env={"MMT_API_TOKEN": "mado_mtj_second"}, secrets=["mado_mtj_second"]))
    assert new_token["started"] is False and new_token["spec_hash"] == first["spec_hash"]
    local.wait_status("7", "exited")
    tampered = local.start(dict(spec, job_id="8", spec_hash="0" * 64), check=False)
    assert tampered["rc"] == 3 and tampered["code"] == "bad_spec"


def test_symbolic_links_in_the_workspace_path_are_refused(local, working_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (working_dir / ".mmt").symlink_to(elsewhere)
    refused = local.start(process_spec(working_dir), check=False)
    assert refused["rc"] == 3 and refused["code"] == "symlink_refused"
    assert list(elsewhere.iterdir()) == []
    (working_dir / ".mmt").unlink()
    (working_dir / ".mmt" / "jobs").mkdir(parents=True)
    (working_dir / ".mmt" / "jobs" / "7").symlink_to(elsewhere)
    refused = local.start(process_spec(working_dir), check=False)
    assert refused["rc"] == 3 and refused["code"] == "symlink_refused"
    assert local.call("poll", "7", check=False)["code"] == "symlink_refused"
    assert list(elsewhere.iterdir()) == []
    wrong_place = local.call("start", "9", stdin=json.dumps(process_spec(working_dir)).encode(), check=False)
    assert wrong_place["rc"] == 3 and wrong_place["code"] == "bad_job_dir"
    assert local.poll("12")["status"] == "absent"


def test_cancel_sends_sigterm_that_the_job_traps_and_logs(local, working_dir):
    local.start(process_spec(working_dir, script=TRAPS_SIGTERM))
    wait_for(lambda: "ready" in local.read("7", "stdout.log"), what="the job to be ready")
    done = local.cancel("7")
    # Ended by its own trap (exit 0, no signal), so before the 10 s grace ran out: no stopwatch needed.
    assert done["status"] == "canceled" and done["exit_code"] == 0 and done["signal"] is None
    assert local.read("7", "stdout.log") == "ready\ngot SIGTERM, cleaning up\n"
    assert "[mado] Stop requested: sending SIGTERM; SIGKILL follows after 10 s." in local.read("7", "stderr.log")
    assert local.cancel("7")["status"] == "canceled"  # again: the end state, nothing else


def test_a_job_ignoring_sigterm_is_killed_after_the_grace_with_its_whole_group(local, working_dir):
    local.start(process_spec(working_dir, script=IGNORES_SIGTERM, grace_seconds=1))
    wait_for(lambda: "child" in local.read("7", "stdout.log"), what="the job's child")
    child = int(local.read("7", "stdout.log").split()[1])
    pgid = local.poll("7")["pgid"]
    assert supervisor.proc_stat(child)[1] == pgid
    began = time.monotonic()
    done = local.cancel("7")
    took = time.monotonic() - began
    assert done["status"] == "canceled" and done["signal"] == signal.SIGKILL and done["exit_code"] is None
    assert took > 0.9, took  # the 1 s grace was given before SIGKILL (a busy machine only makes it later)
    assert supervisor.group_members(pgid) == []
    st = supervisor.proc_stat(child)
    assert st is None or st[0] == "Z"
    assert "[mado] Still running 1 s after SIGTERM: sending SIGKILL." in local.read("7", "stderr.log")


def test_the_walltime_stops_the_job(local, working_dir):
    local.start(process_spec(working_dir, script="import time; print('long', flush=True); time.sleep(60)",
                             walltime_seconds=1, grace_seconds=1))
    done = local.wait_status("7", "timed_out", "exited", "canceled")
    assert done["status"] == "timed_out" and done["signal"] == signal.SIGTERM
    assert 0.9 < done["ended_at"] - done["started_at"] < 6
    assert "[mado] Walltime of 1 s reached: sending SIGTERM" in local.read("7", "stderr.log")


def test_what_is_left_of_the_group_after_the_job_exits_is_stopped(local, working_dir):
    script = ("import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
              "print(p.pid, flush=True)\n")
    local.start(process_spec(working_dir, script=script, grace_seconds=1))
    done = local.wait_status("7", "exited")
    assert done["exit_code"] == 0
    left = int(local.read("7", "stdout.log"))
    st = supervisor.proc_stat(left)
    assert st is None or st[0] == "Z"
    assert "still running after it ended: sending SIGTERM" in local.read("7", "stderr.log")


def test_a_reused_pid_never_counts_as_alive(local, working_dir):
    """A state whose recorded identity does not match what runs under the pid now: not alive."""
    job_dir = Path(local.job_dir("5"))
    job_dir.mkdir(parents=True, mode=0o700)
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        real = supervisor.identity(sleeper.pid)
        me = supervisor.identity(os.getpid())
        boot, start = real.rsplit(":", 1)
        state = {"format": 1, "job_id": "5", "lease_id": "l", "spec_hash": "h", "runtime": "process",
                 "status": "running", "pid": sleeper.pid, "pgid": sleeper.pid, "identity": f"{boot}:{int(start) - 7}",
                 "supervisor": {"pid": os.getpid(), "identity": f"{boot}:1"}, "exit_code": None, "signal": None}
        (job_dir / "state.json").write_text(json.dumps(state))
        polled = local.poll("5")
        assert (polled["status"], polled["stored_status"]) == ("unknown", "running")
        assert polled["supervisor_alive"] is False and polled["process_alive"] is False
        assert polled["recoverable"] is False  # the process did start once: never again
        state["supervisor"]["identity"] = me
        state["identity"] = "another-boot:" + start  # same start time, other boot: a different process
        (job_dir / "state.json").write_text(json.dumps(state))
        polled = local.poll("5")
        assert polled["status"] == "running" and polled["supervisor_alive"] is True
        assert polled["process_alive"] is False
        state["identity"] = real
        (job_dir / "state.json").write_text(json.dumps(state))
        assert local.poll("5")["process_alive"] is True
    finally:
        sleeper.kill()
    # a zombie (ended, not yet reaped) is not alive either, though its identity still matches
    wait_for(lambda: supervisor.proc_stat(sleeper.pid)[0] == "Z", what="the killed sleep to be a zombie")
    assert supervisor.is_alive(sleeper.pid, real) is False
    sleeper.wait()


def test_a_killed_supervisor_leaves_the_job_unknown_and_it_is_never_started_again(local, working_dir, tmp_path):
    marker = tmp_path / "starts.txt"
    spec = process_spec(working_dir, script=marker_script(marker, "print('up', flush=True)\ntime.sleep(600)"),
                        grace_seconds=1)
    local.start(spec)
    running = local.wait_status("7", "running")
    os.kill(running["supervisor"]["pid"], signal.SIGKILL)
    polled = local.wait_status("7", "unknown")
    assert polled["stored_status"] == "running" and polled["process_alive"] is True
    assert polled["recoverable"] is False and polled["supervisor_alive"] is False
    again = local.start(spec)
    assert again["started"] is False and again["status"] == "unknown"
    assert again["supervisor"] == running["supervisor"]
    assert marker.read_text().splitlines() == [str(running["pid"])]
    # cancel still stops it, by itself, and waits until the group is gone
    done = local.cancel("7")
    assert done["status"] == "canceled" and done["error_code"] == "supervisor_gone"
    assert supervisor.group_members(running["pgid"]) == []
    assert local.poll("7")["status"] == "canceled"


def test_a_supervisor_killed_while_preparing_is_replaced_without_starting_twice(local, working_dir, tmp_path):
    """The job process never started: a new supervisor can take over safely."""
    marker = tmp_path / "starts.txt"
    venv_python = tmp_path / "slow-python"
    venv_python.write_text("#!/bin/sh\nsleep 600\n")
    venv_python.chmod(0o755)
    spec = process_spec(working_dir, script=marker_script(marker, ""),
                        venv={"python": str(venv_python), "dir": str(working_dir / ".mmt-cache/venvs/k1"),
                              "requirements": ""})
    first = local.start(spec)
    prepare = wait_for(lambda: local.poll("7").get("prepare"), what="the preparation step")
    os.kill(first["supervisor"]["pid"], signal.SIGKILL)
    polled = local.wait_status("7", "unknown")
    assert polled["recoverable"] is True and polled["process_alive"] is False
    fixed = dict(spec, venv=None)
    assert local.start(fixed, check=False)["code"] == "state_mismatch"  # another spec is still another start
    venv_python.write_text(f"#!/bin/sh\nexec {PYTHON} \"$@\"\n")
    again = local.start(spec)
    assert again["started"] is False and again["recoveries"] == 1
    assert again["supervisor"]["pid"] != first["supervisor"]["pid"]
    done = local.wait_status("7", "exited", "failed_to_start", timeout=60)
    assert done["status"] == "exited" and done["exit_code"] == 0, local.read("7", "stderr.log")
    assert len(marker.read_text().splitlines()) == 1
    assert not supervisor.is_alive(prepare["pid"], prepare["identity"])
    assert "a new one takes over" in local.read("7", "stderr.log")


def test_a_held_start_prepares_then_waits_for_release(local, working_dir, tmp_path):
    """Cluster replicas (spec `hold`): prepared, then held until `release`, so all start together."""
    marker = tmp_path / "starts.txt"
    spec = process_spec(working_dir, script=marker_script(marker, "print('up', flush=True)"), hold=True,
                        venv={"python": PYTHON, "dir": str(working_dir / ".mmt-cache/venvs/k9"), "requirements": ""})
    local.start(spec)
    held = wait_for(lambda: (s := local.poll("7")).get("held") and s, timeout=60, what="the held state")
    assert held["status"] == "starting" and held["pid"] is None and held["prepared_at"]
    time.sleep(0.5)
    assert not marker.exists() and local.poll("7")["status"] == "starting", "nothing runs before the release"
    assert "waiting until every replica of the job is prepared" in local.read("7", "stderr.log")
    released = local.call("release", "7")
    assert released["status"] in ("starting", "running", "exited")
    done = local.wait_status("7", "exited")
    assert done["exit_code"] == 0 and done["held"] is False and done["prepared_at"] == held["prepared_at"]
    assert done["started_at"] >= held["prepared_at"]
    assert local.read("7", "stdout.log") == "up\n" and len(marker.read_text().splitlines()) == 1
    assert local.call("release", "7")["status"] == "exited", "a release again changes nothing"
    assert local.call("release", "8")["status"] == "absent"


def test_a_held_replica_that_is_stopped_never_runs(local, working_dir, tmp_path):
    marker = tmp_path / "starts.txt"
    local.start(process_spec(working_dir, script=marker_script(marker), hold=True))
    wait_for(lambda: local.poll("7").get("held"), what="the held state")
    stopped = local.cancel("7")
    assert stopped["status"] == "canceled" and stopped["pid"] is None
    local.call("release", "7")  # a release after the stop starts nothing
    time.sleep(0.3)
    assert not marker.exists() and local.poll("7")["status"] == "canceled"


def test_a_hold_nobody_releases_ends_after_hold_seconds(local, working_dir, tmp_path):
    marker = tmp_path / "starts.txt"
    local.start(process_spec(working_dir, script=marker_script(marker), hold=True, hold_seconds=0.5))
    done = local.wait_status("7", "failed_to_start")
    assert done["error_code"] == "hold_expired" and not marker.exists()
    assert local.start(process_spec(working_dir, job_id="8", hold="yes"), check=False)["code"] == "bad_spec"


def test_preparation_steps_get_only_what_pip_needs_from_the_environment(working_dir, tmp_path):
    dump = tmp_path / "prepare-env.json"
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f"#!{PYTHON}\nimport json, os, sys\njson.dump(dict(os.environ), open({str(dump)!r}, 'w'))\n"
                       f"os.execv({PYTHON!r}, [{PYTHON!r}] + sys.argv[1:])\n")
    wrapper.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "HTTPS_PROXY": "http://proxy.example:3128",
           "PIP_INDEX_URL": "https://pypi.example/simple", "MMT_API_TOKEN": "mado_svc_worker_secret",
           "MMT_API_TOKEN_FILE": "/etc/mado/token", "AWS_SECRET_ACCESS_KEY": "x"}
    local = Local(working_dir, env=env)
    spec = process_spec(working_dir, venv={"python": str(wrapper), "dir": str(working_dir / ".mmt-cache/venvs/k2"),
                                           "requirements": ""})
    local.start(spec)
    done = local.wait_status("7", "exited", "failed_to_start", timeout=60)
    assert done["status"] == "exited", local.read("7", "stderr.log")
    assert json.loads(dump.read_text()) == {
        "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8", "HTTPS_PROXY": "http://proxy.example:3128",
        "PIP_INDEX_URL": "https://pypi.example/simple", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    outside = local.start(process_spec(working_dir, job_id="8", venv={"python": PYTHON, "dir": str(tmp_path / "v"),
                                                                       "requirements": ""}), check=False)
    assert outside["code"] == "bad_spec" and ".mmt-cache/venvs" in outside["error"]


def test_sigterm_to_the_supervisor_requests_a_stop(local, working_dir):
    first = local.start(process_spec(working_dir, script=TRAPS_SIGTERM))
    wait_for(lambda: "ready" in local.read("7", "stdout.log"), what="the job to be ready")
    os.kill(first["supervisor"]["pid"], signal.SIGTERM)
    done = local.wait_status("7", "canceled")
    assert done["exit_code"] == 0 and done["cancel_requested"] is True
    assert "got SIGTERM" in local.read("7", "stdout.log")
    assert json.loads(local.read("7", "cancel.request"))["by"] == "signal 15 to the supervisor"


def test_the_job_runs_detached_with_default_signal_dispositions(local, working_dir):
    script = ("import os\nstatus = dict(l.split(':\\t') for l in open('/proc/self/status').read().splitlines())\n"
              "mask = int(status['SigIgn'].strip(), 16)\n"
              "print([n for n in (1, 2, 15) if mask >> (n - 1) & 1], os.getsid(0) == os.getpid() == os.getpgid(0), "
              "os.ttyname(0) if os.isatty(0) else os.path.realpath('/proc/self/fd/0'))\n")
    first = local.start(process_spec(working_dir, script=script))
    done = local.wait_status("7", "exited")
    assert done["exit_code"] == 0, local.read("7", "stderr.log")
    # SIGHUP, SIGINT, SIGTERM not ignored (the supervisor ignores SIGHUP); own session; no stdin
    assert local.read("7", "stdout.log") == "[] True /dev/null\n"
    sup = first["supervisor"]["pid"]
    assert not os.path.exists(f"/proc/{sup}") or supervisor.proc_stat(sup)[0] == "Z" or \
        os.getsid(sup) == sup  # the supervisor leads a session of its own as well


def test_a_command_that_cannot_start_fails_to_start(local, working_dir):
    local.start(process_spec(working_dir, argv=[str(working_dir / "no-such-program")]))
    done = local.wait_status("7", "failed_to_start")
    assert done["error_code"] == "command_not_runnable" and "No such file" in done["error"]
    assert "[mado] Cannot start" in local.read("7", "stderr.log")


def test_the_job_token_is_never_in_an_argv_and_the_worker_token_never_reaches_the_job(working_dir):
    job_token = "mado_mtj_" + uuid.uuid4().hex
    worker_token = "mado_svc_" + uuid.uuid4().hex
    env = dict(os.environ, MMT_API_TOKEN=worker_token, SOME_WORKER_SETTING="x")
    local = Local(working_dir, env=env)
    spec = process_spec(working_dir, script="import time; print('up', flush=True); time.sleep(600)",
                        env={"MMT_API_TOKEN": job_token, "MLFLOW_TRACKING_TOKEN": job_token},
                        secrets=[job_token], grace_seconds=1)
    local.start(spec)
    running = local.wait_status("7", "running")
    try:
        assert live_processes_with(job_token.encode()) == []
        assert live_processes_with(b"supervisor.py")  # the scan does see our processes
        with open(f"/proc/{running['pid']}/environ", "rb") as f:
            environ = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if item)
        assert environ[b"MMT_API_TOKEN"] == job_token.encode()
        assert worker_token.encode() not in b"".join(environ.values())
        assert b"SOME_WORKER_SETTING" not in environ
        assert set(environ) <= {b"MMT_API_TOKEN", b"MLFLOW_TRACKING_TOKEN", b"MMT_JOB_ID", b"PATH", b"HOME", b"LANG",
                                b"LC_ALL", b"LD_LIBRARY_PATH", b"TMPDIR"}
        for name in ("state.json", "stdout.log", "stderr.log"):
            assert job_token not in local.read("7", name)
        assert stat.S_IMODE(os.stat(Path(local.job_dir("7"), "spec.json")).st_mode) == 0o600
    finally:
        local.cancel("7")


# -- follow --------------------------------------------------------------------------------------------

NUMBERED = """
import sys, time
for i in range({n}):
    print(f"line {{i:06d}} ü€😀 " + "x" * (i % 50), flush=(i % 97 == 0))
    if i % 250 == 0:
        print(f"err {{i:06d}}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        time.sleep(0.05)
print("é" * 200000, flush=True)
print("last", flush=True)
"""


def expected_lines(n: int) -> list[str]:
    return [f"line {i:06d} ü€😀 " + "x" * (i % 50) for i in range(n)] + ["é" * 200000, "last"]


def collect(follow, limit: int | None = None) -> tuple[dict, list[LogChunk], dict | None]:
    """Read a follow stream: the chunks (offsets must be contiguous, each chunk valid UTF-8 on its own)."""
    ends = {}
    chunks, final = [], None
    for item in follow:
        if isinstance(item, StateFrame):
            if item.final:
                final = item.state
            continue
        assert item.offset == ends.get(item.stream, item.offset)
        item.data.decode("utf-8")  # strict: cut at a character boundary
        ends[item.stream] = item.end
        chunks.append(item)
        if limit is not None and len(chunks) >= limit:
            break
    follow.close()
    return ends, chunks, final


def joined(chunks, stream: str) -> bytes:
    return b"".join(c.data for c in chunks if c.stream == stream)


def test_follow_streams_both_logs_once_and_in_order_and_resumes_from_offsets(working_dir):
    remote = Remote(LocalConnection(), working_dir=str(working_dir), job_id="21", python=PYTHON)
    n = 3000
    remote.start(process_spec(working_dir, job_id="21", script=NUMBERED.format(n=n)))
    # A first stream cut off after a few chunks (the connection dropped) ...
    ends, first_part, final = collect(remote.follow(0, 0), limit=3)
    assert final is None and len(first_part) == 3
    # ... then followed again from the offsets the worker recorded, to the end.
    _, rest, final = collect(remote.follow(ends.get("stdout", 0), ends.get("stderr", 0)))
    assert final is not None and final["status"] == "exited" and final["exit_code"] == 0
    out = joined(first_part, "stdout") + joined(rest, "stdout")
    err = joined(first_part, "stderr") + joined(rest, "stderr")
    assert out.decode().splitlines() == expected_lines(n)
    assert err.decode().splitlines() == [f"err {i:06d}" for i in range(0, n, 250)]
    assert out == Path(remote.job_dir, "stdout.log").read_bytes()
    assert max(len(c.data) for c in rest) <= supervisor.CHUNK
    # From any offset after the end: exactly the rest of the file, then the final state at once.
    middle = len(out) // 2 + 1  # inside a multi-byte character: the stream starts where asked
    _, tail, final = collect(remote.follow(middle, len(err)))
    assert joined(tail, "stdout") == out[middle:] and joined(tail, "stderr") == b""
    assert final["status"] == "exited"


def test_follow_sees_lines_written_while_it_follows(working_dir):
    remote = Remote(LocalConnection(), working_dir=str(working_dir), job_id="22", python=PYTHON)
    script = ("import time\nfor i in range(40):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.05)\n")
    remote.start(process_spec(working_dir, job_id="22", script=script))
    seen, states = [], []
    with remote.follow(0, 0) as follow:
        for item in follow:
            if isinstance(item, StateFrame):
                states.append(item.state["status"])
            else:
                seen.append((time.monotonic(), item.text()))
    text = "".join(t for _, t in seen)
    assert text.splitlines() == [f"tick {i}" for i in range(40)]
    assert len(seen) > 5  # delivered as written, not in one piece at the end
    assert states[-1] == "exited" and "running" in states


def test_follow_of_a_missing_workspace_ends_at_once(working_dir):
    remote = Remote(LocalConnection(), working_dir=str(working_dir), job_id="404", python=PYTHON)
    _, chunks, final = collect(remote.follow(0, 0))
    assert chunks == [] and final["status"] == "absent"


def test_the_poll_before_a_start_brings_the_targets_facts_and_the_workspace_keeps_the_program(working_dir):
    remote = Remote(LocalConnection(), working_dir=str(working_dir), job_id="23", python=PYTHON)
    absent = remote.poll(facts="")
    assert absent["status"] == "absent"
    assert absent["facts"] == {"uid": os.getuid(), "gid": os.getgid(), "help": None}
    remote.start(process_spec(working_dir, job_id="23", script="print('x')"))
    assert "facts" not in remote.poll(facts="")  # started: there is no spec to build
    # The daemon runs (and a recovery reattaches with) the workspace's copy: the worker's very program.
    assert Path(remote.job_dir, "supervisor.py").read_bytes() == supervisor.program_source()


@pytest.mark.parametrize("text", ["abc", "ü", "€", "😀", "aü€😀"])
def test_utf8_cut_never_splits_a_character(text):
    data = text.encode()
    for end in range(len(data) + 1):
        cut = supervisor.utf8_cut(data[:end])
        data[:cut].decode("utf-8")
        assert end - cut < 4
    assert supervisor.utf8_cut(b"\xff\xfe") == 2  # not UTF-8 at all: nothing is held back


def test_state_writes_are_atomic_and_never_follow_links(tmp_path):
    target = tmp_path / "target"
    target.write_text("keep")
    (tmp_path / "state.json").symlink_to(target)
    supervisor.write_json(str(tmp_path / "state.json"), {"a": 1})
    assert target.read_text() == "keep" and not (tmp_path / "state.json").is_symlink()
    assert json.loads((tmp_path / "state.json").read_text()) == {"a": 1}
    assert kill_quietly(2 ** 22 + 5) is None  # a pid that cannot exist: no error
