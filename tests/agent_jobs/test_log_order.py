"""The supervisor's `[mado]` lines and the job's own lines reach the log in the order they happened,
although the notes are in stderr.log and the job's lines mostly in stdout.log (issue 15, item 15).

Real supervisors and venvs on this machine; the logs are read with `follow` as the worker reads them.
Reading a job that has ended is the case where both files are complete at the first read, so the
order can only come from the supervisor's record of it (order.log), not from timing."""
from __future__ import annotations

import os

from tests.agent_jobs.conftest import PYTHON, process_spec, wait_for
from tests.agent_jobs.test_runtime_jobs import job_payload
from worker_agent import supervisor
from worker_agent.runtimes import TargetFacts, build_spec
from worker_agent.ssh import LocalConnection
from worker_agent.supervisor import LogChunk, Remote, StateFrame

FIRST_LINE = "the program's first line"

PROGRAM = f"""
import sys
print({FIRST_LINE!r}, flush=True)
print("a line on stderr", file=sys.stderr, flush=True)
print("the program's last line", flush=True)
"""

TRAPS_SIGTERM = """
import signal, sys, time
def on_term(signum, frame):
    print("got SIGTERM, saving a checkpoint", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def log_lines(remote: Remote, stdout_offset: int = 0, stderr_offset: int = 0) -> list[str]:
    """The job's log as the worker sends it: the chunks of both streams in the order `follow` gives them."""
    text, ends = [], {"stdout": stdout_offset, "stderr": stderr_offset}
    with remote.follow(stdout_offset, stderr_offset) as follow:
        for item in follow:
            if isinstance(item, StateFrame):
                if item.final:
                    break
                continue
            assert isinstance(item, LogChunk) and item.offset == ends[item.stream], "a gap or an overlap"
            ends[item.stream] = item.end
            text.append(item.data.decode("utf-8"))
    return "".join(text).splitlines()


def run_python_job(connection, working_dir, job_id: int, **changes) -> Remote:
    remote = Remote(connection, working_dir=str(working_dir), job_id=job_id, python=PYTHON)
    spec = build_spec(job_payload(job_id, working_dir, **changes), TargetFacts(uid=os.getuid(), gid=os.getgid()))
    assert remote.start(spec)["started"] is True
    wait_for(lambda: remote.poll()["status"] in supervisor.TERMINAL, 120, what=f"job {job_id} to end")
    return remote


def test_the_venv_lines_come_before_the_programs_first_line(working_dir):
    connection = LocalConnection(env={"PATH": "/usr/bin:/bin", "HOME": str(working_dir), "LANG": "C.UTF-8"})
    command = ["python", "-c", PROGRAM]

    built = log_lines(run_python_job(connection, working_dir, 1, command=command))
    assert built[0].startswith("[mado] Creating a venv with /usr/bin/python3"), built
    assert built.index("[mado] The venv is ready.") < built.index(FIRST_LINE), built
    assert built[built.index(FIRST_LINE):] == [FIRST_LINE, "the program's last line", "a line on stderr"], \
        "the program's own stdout and stderr keep the order of their files"

    reused = log_lines(run_python_job(connection, working_dir, 2, command=command))
    assert reused[0].startswith("[mado] Reusing the venv for these requirements ("), reused
    assert reused[1] == FIRST_LINE, reused


def test_a_stop_note_comes_between_the_lines_before_and_after_it(local, working_dir):
    remote = Remote(LocalConnection(), working_dir=str(working_dir), job_id="31", python=PYTHON)
    remote.start(process_spec(working_dir, job_id="31", script=TRAPS_SIGTERM))
    wait_for(lambda: local.read("31", "stdout.log") == "ready\n", 20, what="the job to be ready")
    assert local.cancel("31")["status"] == "canceled"
    assert log_lines(remote) == ["ready", "[mado] Stop requested: sending SIGTERM; SIGKILL follows after 10 s.",
                                 "got SIGTERM, saving a checkpoint"]
    # Followed again from the middle (a worker that restarted after sending "ready"): the rest, in order.
    assert log_lines(remote, stdout_offset=len("ready\n")) == [
        "[mado] Stop requested: sending SIGTERM; SIGKILL follows after 10 s.", "got SIGTERM, saving a checkpoint"]


def test_a_note_begun_by_a_supervisor_that_died_holds_nothing_back_at_the_end(local, working_dir):
    """order.log with a note begun and never finished (its supervisor killed between two writes): the
    job's lines still all arrive, and the stream ends."""
    remote = Remote(LocalConnection(), working_dir=str(working_dir), job_id="32", python=PYTHON)
    remote.start(process_spec(working_dir, job_id="32", script="print('one'); print('two')"))
    wait_for(lambda: remote.poll()["status"] == "exited", 20, what="the job to end")
    with open(os.path.join(remote.job_dir, supervisor.ORDER_FILE), "a") as order:
        order.write("n 0 4\n")  # "[mado] …" was to come after "one\n" and before "two\n": it never did
    assert log_lines(remote) == ["one", "two"]
