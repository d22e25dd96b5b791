"""The computer in its own network namespace (a veth pair to this host, an sshd listening inside), and
the link cut (`ip link set … down`) while a job runs until the worker has noticed the stalled stream (15 s
without a keepalive): the job runs on meanwhile, the worker reconnects once the link is back, and delivers the
rest of the logs and the completion. Nothing is started twice."""
from __future__ import annotations

import random
import subprocess
import uuid

import pytest

from tests.agent_e2e_jobs.conftest import wait_until
from tests.support import processes_under
from tests.agent_e2e_jobs.test_faults import assert_complete_logs, kill_sshd, pid_alive
from tests.peers.sshd import SSHD, start_sshd
from worker_agent import supervisor


def ip(*args) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def sshd():
    """An sshd inside a network namespace, reached over a veth pair at 10.231.x.2."""
    suffix = uuid.uuid4().hex[:6]
    namespace, host_if, inner_if = f"mmt-{suffix}", f"mh{suffix}", f"mt{suffix}"
    net = random.randint(1, 250)
    host_ip, inner_ip = f"10.231.{net}.1", f"10.231.{net}.2"
    ip("netns", "add", namespace)
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", inner_if)
        ip("link", "set", inner_if, "netns", namespace)
        ip("addr", "add", f"{host_ip}/30", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("netns", "exec", namespace, "ip", "addr", "add", f"{inner_ip}/30", "dev", inner_if)
        ip("netns", "exec", namespace, "ip", "link", "set", inner_if, "up")
        ip("netns", "exec", namespace, "ip", "link", "set", "lo", "up")
        server = start_sshd()  # keys, user and config; then moved into the namespace
        kill_sshd(server)
        config = server.server_dir / "sshd_config"
        config.write_text(config.read_text().replace("ListenAddress 127.0.0.1", f"ListenAddress {inner_ip}"))
        known = server.known_hosts_path
        known.write_text(known.read_text().replace(f"[127.0.0.1]:{server.port}", f"[{inner_ip}]:{server.port}"))
        log = open(server.server_dir / "sshd.log", "ab")
        server.process = subprocess.Popen(["ip", "netns", "exec", namespace, SSHD, "-D", "-e", "-f", str(config)],
                                          stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        server.host = inner_ip
        server.link = host_if

        def listening():
            import socket
            try:
                socket.create_connection((inner_ip, server.port), timeout=0.5).close()
                return True
            except OSError:
                return False

        wait_until(listening, timeout=10, what="sshd in the namespace to listen")
        yield server
        server.stop()
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)


def test_the_network_to_the_target_cut_the_job_runs_on_and_the_worker_reconnects(e2e):
    worker = e2e.start_worker()
    # It holds before line 600 until the link is back, so it runs on however long the worker takes to notice.
    job = e2e.counter_job("netcut", lines=1200, pause=0.005, hold_at=600)
    e2e.wait_log(job, "line 000050", timeout=60)
    ip("link", "set", e2e.sshd.link, "down")
    try:
        pid = int(e2e.starts("netcut")[0])
        wait_until(lambda: "log stream interrupted" in worker.output(), timeout=60,
                   what=lambda: f"the worker to notice the stalled stream: {worker.output()[-3000:]}")
        assert pid_alive(pid), "the job runs on while its computer is unreachable"
        assert e2e.job(job).status == "running"
    finally:
        ip("link", "set", e2e.sshd.link, "up")
        e2e.release("netcut")
    e2e.wait_ended(job, timeout=90)
    job = e2e.assert_ended_once(job, "finished")
    assert_complete_logs(e2e, job, 1200)
    assert e2e.starts("netcut") == [str(pid)], "no second process was started"
    output = worker.output()
    assert "log stream interrupted" in output, output[-3000:]
    assert not processes_under(supervisor.workspace(str(e2e.working_dir), job.pk))
    assert worker.process.poll() is None
