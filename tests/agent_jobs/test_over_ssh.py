"""The supervisor over a real OpenSSH server (tests/peers/sshd.py) through worker_agent.ssh.Connection:
the job is started detached, the connection drops, a new connection finds the same job still running,
a second start starts nothing, and the logs continue from the offsets received before the drop."""
from __future__ import annotations

import os
import uuid

from tests.agent_jobs.conftest import PYTHON, live_processes_with, process_spec, wait_for
from tests.agent_jobs.test_supervisor import collect, joined
from worker_agent import supervisor
from worker_agent.ssh import Connection, Target
from worker_agent.supervisor import Remote


def test_a_job_survives_a_disconnect_and_is_found_again_after_reconnecting(sshd, ssh_working_dir):
    token = "mmtj_" + uuid.uuid4().hex
    marker = ssh_working_dir / "starts.txt"
    script = (f"import os, time\nopen({str(marker)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
              "for i in range(120):\n    print(f'step {i:03d}', flush=True)\n    time.sleep(0.04)\n")
    spec = process_spec(ssh_working_dir, job_id=41, script=script, env={"MMT_API_TOKEN": token},
                        secrets=[token])
    target = Target.from_api(sshd.connection())

    first = Connection(target).open()
    remote = Remote(first, working_dir=str(ssh_working_dir), job_id=41, python=PYTHON)
    started = remote.start(spec)
    assert started["started"] is True
    ends, before, final = collect(remote.follow(0, 0), limit=2)
    assert final is None and ends["stdout"] > 0
    first.close()  # the SSH connection drops

    second = Connection(target).open()
    remote = Remote(second, working_dir=str(ssh_working_dir), job_id=41, python=PYTHON)
    try:
        polled = remote.poll()
        assert polled["status"] == "running" and polled["process_alive"] is True, polled
        assert polled["supervisor"] == started["supervisor"]
        owner = os.stat(f"/proc/{polled['pid']}").st_uid
        assert owner == sshd.home.stat().st_uid  # runs as the SSH login user
        assert live_processes_with(token.encode()) == []
        again = remote.start(spec)
        assert again["started"] is False and again["pid"] == polled["pid"]
        _, after, final = collect(remote.follow(ends["stdout"], ends.get("stderr", 0)))
        assert final["status"] == "exited" and final["exit_code"] == 0
        text = (joined(before, "stdout") + joined(after, "stdout")).decode()
        assert text.splitlines() == [f"step {i:03d}" for i in range(120)]
        assert marker.read_text().splitlines() == [str(polled["pid"])]
        # the follow of the dropped connection noticed and left (nothing lingers on the target)
        job_dir = supervisor.workspace(str(ssh_working_dir), 41).encode()
        wait_for(lambda: not live_processes_with(b"follow\0" + job_dir), timeout=15, what="the old follow to end")
    finally:
        second.close()
