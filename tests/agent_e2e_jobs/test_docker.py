"""A docker-runtime job against a real Docker daemon (docker.io's dockerd on its own socket, no
registry: the image is imported from a busybox-static root filesystem made here). The job reports from
inside the container what it sees: the host's network (it reaches the live server on 127.0.0.1), the
read-only /mmt/source and /mmt/inputs, its uid; it writes outputs and result.json, which land as an
artifact and a metric. The container is started once and removed afterwards.

The target's sshd sets DOCKER_HOST for the session (`SetEnv`), the way an operator points the docker
CLI of the SSH user at a daemon; the worker passes DOCKER_HOST through to the docker CLI only."""
from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from jobs import outputs
from jobs.models import Artifact, Metric
from mado.services import Actor
from tests.agent_e2e_jobs.conftest import source_archive, wait_until
from tests.agent_e2e_jobs.test_faults import kill_sshd, restart_sshd
from tests.peers.sshd import start_sshd

IMAGE = "mado/e2e-busybox:1"
RUN_SH = '''\
echo "uid $(id -u)"
echo "interfaces: $(ls /sys/class/net | tr '\\n' ' ')"
if wget -q -O /dev/null "http://127.0.0.1:$API_PORT/api/health"; then
  echo "host network: reached 127.0.0.1:$API_PORT"
fi
for d in /mmt/source /mmt/inputs; do
  if touch "$d/probe" 2>/dev/null; then echo "$d writable"; else echo "$d read-only"; fi
done
echo "parameters: $(tr -d ' \\n' < "$MMT_PARAMETERS_FILE")"
echo "outputs: $MMT_OUTPUTS_DIR, job token given: ${MMT_API_TOKEN:+yes}"
echo "from the container" > /mmt/outputs/out.txt
sum=$(sha256sum /mmt/outputs/out.txt | cut -d' ' -f1)
artifacts='[{"path": "out.txt", "sha256": "'$sum'", "size": 19}]'
metrics='[{"name": "container.ok", "value": 1, "step": 0}]'
echo '{"version": 1, "complete": true, "artifacts": '"$artifacts"', "metrics": '"$metrics"'}' > "$MMT_RESULT_FILE"
i=0
while [ $i -lt 300 ]; do echo "line $i"; i=$((i+1)); done
'''


class Dockerd:
    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="mado-dockerd-"))
        os.chmod(self.dir, 0o755)
        self.socket = self.dir / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.log = open(self.dir / "dockerd.log", "wb")
        self.process = subprocess.Popen(
            ["dockerd", "--data-root", str(self.dir / "data"), "--exec-root", str(self.dir / "exec"),
             "--pidfile", str(self.dir / "dockerd.pid"), "-H", self.host, "--iptables=false", "--ip6tables=false",
             "--bridge=none", "--ip-masq=false"], stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_until(lambda: self.docker("version", check=False).returncode == 0, timeout=30, what="dockerd to answer")
        os.chmod(self.socket, 0o666)  # the SSH login user of the target talks to it

    def docker(self, *args, check=True, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", *args], env={**os.environ, "DOCKER_HOST": self.host}, capture_output=True,
                              check=check, timeout=120, **kwargs)

    def import_busybox(self, tag: str) -> None:
        rootfs = self.dir / "rootfs"
        (rootfs / "bin").mkdir(parents=True)
        (rootfs / "tmp").mkdir(mode=0o1777)
        shutil.copy("/bin/busybox", rootfs / "bin" / "busybox")
        for applet in subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True,
                                     check=True).stdout.split():
            if applet != "busybox":
                os.symlink("busybox", rootfs / "bin" / applet)
        tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], capture_output=True, check=True).stdout
        self.docker("import", "-", tag, input=tar)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        subprocess.run(["umount", str(self.dir / "exec" / "netns" / "default")], capture_output=True, check=False)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def dockerd():
    if shutil.which("dockerd") is None or not os.path.exists("/bin/busybox"):
        pytest.fail("dockerd and busybox are needed: apt-get install docker.io busybox-static")
    daemon = Dockerd()
    try:
        daemon.import_busybox(IMAGE)
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture
def sshd(dockerd):
    """An sshd of this test whose sessions have DOCKER_HOST set to the test's daemon."""
    server = start_sshd()
    kill_sshd(server)
    with open(server.server_dir / "sshd_config", "a") as config:
        config.write(f"SetEnv DOCKER_HOST={dockerd.host}\n")
    restart_sshd(server)
    yield server
    server.stop()


def test_a_docker_job_runs_in_its_container_with_host_network_and_read_only_mounts(e2e, dockerd):
    started_at = int(time.time()) - 1
    worker = e2e.start_worker()
    archive = outputs.store_source(Actor(e2e.world.member), e2e.world.project,
                                   io.BytesIO(source_archive({"run.sh": RUN_SH})))
    job = e2e.create_job(runtime="docker", image=IMAGE, command=["sh", "/mmt/source/run.sh"],
                         source={"kind": "archive", "id": archive.pk}, parameters={"lr": 0.5},
                         env={"API_PORT": str(e2e.live_server.thread.port)})
    e2e.wait_ended(job, timeout=90)
    ended = e2e.assert_ended_once(job, "finished")
    assert ended.exit_code == 0
    lines = e2e.stream(job, "stdout").splitlines()
    assert lines[0] == f"uid {e2e.uid}", "the container runs as the target's SSH user (--user uid:gid)"
    assert "lo" in lines[1] and "eth0" in lines[1], "the host's interfaces: --network host"
    assert lines[2] == f"host network: reached 127.0.0.1:{e2e.live_server.thread.port}"
    assert lines[3:5] == ["/mmt/source read-only", "/mmt/inputs read-only"]
    assert lines[5] == 'parameters: {"lr":0.5}'
    assert lines[6] == "outputs: /mmt/outputs, job token given: yes"
    assert lines[7:] == [f"line {i}" for i in range(300)]
    e2e.assert_delivered_in_order(job)
    artifact = Artifact.objects.get(job_id=job.pk)
    assert (artifact.path, artifact.size, artifact.complete) == ("out.txt", 19, True)
    assert list(Metric.objects.filter(job_id=job.pk).values_list("name", "value")) == [("container.ok", 1.0)]

    name = f"mmt-job-{job.pk}"
    assert dockerd.docker("ps", "-a", "--filter", f"name={name}", "--format", "{{.Names}}").stdout.strip() == b"", \
        "the container is removed once the job ended"
    events = dockerd.docker("events", "--since", str(started_at), "--until", str(int(time.time()) + 1),
                            "--filter", f"container={name}", "--filter", "event=start", "--format",
                            "{{.Status}}").stdout.split()
    assert events == [b"start"], "the container was started exactly once"
    assert worker.process.poll() is None
