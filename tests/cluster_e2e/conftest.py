"""Cluster jobs end to end (docs/cluster-jobs.md): the Django live server on PostgreSQL, a real
`mado-tracking-worker run` process, and real OpenSSH servers as the computers.

`hosts` makes three "hosts": network namespaces `mmtc-*` joined by a bridge in the root namespace,
each with its own sshd listening only on its own address (10.231.0.11, .12, .13). The worker runs in
the root namespace and reaches each host by its address; the job's replicas reach each other the same
way. Only the worker talks to the server. Teardown removes the namespaces and the bridge, and stops
the sshds, even when a test failed (and a run killed earlier is cleaned up at the next start).

`cluster` registers the computers and helpers to create cluster jobs, start the worker and read each
replica's logs through the API. Teardown stops the workers and kills whatever a test left running in
the working directories, by PID."""
from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import transaction
from rest_framework.test import APIClient

from computers.models import ComputeGroup, ComputeTarget
from jobs import services as job_services
from jobs.models import Job, LogChunk
from mado.services import Actor
from tests.agent_e2e_jobs.conftest import (
    CLAIM_WAIT,
    TARGET_PYTHON,
    WorkerProcess,
    other_sessions,
    wait_until,
)
from tests.peers.sshd import CONFIG, SSHD, ensure_login_user, keygen, sshd  # noqa: F401  (sshd: the fixture)
from tests.support import kill_all, processes_under

PREFIX = "mmtc"
BRIDGE = f"{PREFIX}-br"
SUBNET = "10.231.0"
BRIDGE_ADDRESS = f"{SUBNET}.1"
HOST_NAMES = ("a", "b", "c")
LOCK = "/tmp/mado-cluster-netns.lock"


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    argv = ["ip", *(["netns", "exec", netns, "ip"] if netns else []), *args]
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=20)


@dataclass
class NetHost:
    """One "host": a namespace with its own address and sshd on port 22."""
    name: str
    netns: str
    address: str
    port: int
    user: str
    key_path: Path
    known_hosts_path: Path
    process: subprocess.Popen | None = None

    def reachable(self) -> bool:
        try:
            socket.create_connection((self.address, self.port), timeout=0.5).close()
            return True
        except OSError:
            return False


class NetHosts:
    def __init__(self, count: int = len(HOST_NAMES)):
        self.user = ensure_login_user()
        self.dir = Path(tempfile.mkdtemp(prefix="mado-netns-"))
        os.chmod(self.dir, 0o755)
        self.client_dir = Path(tempfile.mkdtemp(prefix="mado-netns-client-"))
        self.client_key = self.client_dir / "id_ed25519"
        public = keygen(self.client_key)
        (self.dir / "authorized_keys").write_text(public + "\n")
        os.chmod(self.dir / "authorized_keys", 0o644)
        self.known_hosts = self.client_dir / "known_hosts"
        self.hosts: list[NetHost] = []
        self.count = count

    def up(self) -> list[NetHost]:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        ip("link", "add", BRIDGE, "type", "bridge")
        ip("addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE)
        ip("link", "set", BRIDGE, "up")
        known = []
        for number, name in enumerate(HOST_NAMES[:self.count], start=11):
            host = self.add_host(name, f"{SUBNET}.{number}")
            known.append(f"{host.address} " + (self.dir / name / "host_ed25519.pub").read_text().strip())
            self.hosts.append(host)
        self.known_hosts.write_text("\n".join(known) + "\n")
        os.chmod(self.known_hosts, 0o644)
        for host in self.hosts:
            wait_until(host.reachable, timeout=10, what=f"sshd on {host.address}")
        return self.hosts

    def add_host(self, name: str, address: str) -> NetHost:
        netns, outside, inside = f"{PREFIX}-{name}", f"{PREFIX}-{name}0", f"{PREFIX}-{name}1"
        ip("netns", "add", netns)
        ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        ip("link", "set", inside, "netns", netns)
        ip("link", "set", outside, "master", BRIDGE)
        ip("link", "set", outside, "up")
        ip("addr", "add", f"{address}/24", "dev", inside, netns=netns)
        ip("link", "set", inside, "up", netns=netns)
        ip("link", "set", "lo", "up", netns=netns)
        server_dir = self.dir / name
        server_dir.mkdir(mode=0o755)
        keygen(server_dir / "host_ed25519")
        config = CONFIG.format(port=22, dir=server_dir, user=self.user.pw_name).replace(
            "ListenAddress 127.0.0.1", f"ListenAddress {address}").replace(
            f"AuthorizedKeysFile {server_dir}/authorized_keys", f"AuthorizedKeysFile {self.dir}/authorized_keys")
        (server_dir / "sshd_config").write_text(config)
        log = open(server_dir / "sshd.log", "wb")  # noqa: SIM115  (sshd writes it until the fixture ends)
        # Its own UTS namespace too, so `hostname` over SSH names this host (mado-a, mado-b, ...); the config
        # path stays the last argument.
        argv = ["ip", "netns", "exec", netns, "unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"',
                f"mado-{name}", SSHD, "-D", "-e", "-f", str(server_dir / "sshd_config")]
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return NetHost(name=name, netns=netns, address=address, port=22, user=self.user.pw_name,
                       key_path=self.client_key, known_hosts_path=self.known_hosts, process=process)

    def down(self) -> None:
        for host in self.hosts:
            if host.process is not None and host.process.poll() is None:
                host.process.send_signal(signal.SIGTERM)
                try:
                    host.process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    host.process.kill()
                    host.process.wait()
        remove_namespaces()
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.client_dir, ignore_errors=True)


def remove_namespaces() -> None:
    """Every `mmtc-*` namespace (its veth ends go with it) and the bridge. Processes still inside a
    namespace (an sshd left by a killed run) are killed by PID first."""
    listed = ip("netns", "list", check=False).stdout.split()
    for netns in [n for n in listed if n.startswith(f"{PREFIX}-")]:
        pids = ip("netns", "pids", netns, check=False).stdout.split()
        kill_all(int(p) for p in pids if p.isdigit())
        ip("netns", "del", netns, check=False)
    for name in HOST_NAMES:
        ip("link", "del", f"{PREFIX}-{name}0", check=False)
    ip("link", "del", BRIDGE, check=False)


@pytest.fixture(scope="module")
def hosts():
    # One run at a time owns the `mmtc-*` names (a second run would remove the first one's namespaces).
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        remove_namespaces()  # what a killed run may have left
        net = NetHosts()
        try:
            yield net.up()
        finally:
            net.down()


class Cluster:
    def __init__(self, live_server, world, tmp_path: Path):
        self.url = live_server.url
        self.world = world
        self.tmp = tmp_path
        user = pwd.getpwnam(ensure_login_user().pw_name)
        self.home, self.uid, self.gid = Path(user.pw_dir), user.pw_uid, user.pw_gid
        self.tag = uuid.uuid4().hex[:8]
        self.shared = self.directory(f"cluster-e2e-{self.tag}")  # the job scripts, readable on every "host"
        self.working_dirs: list[Path] = [self.shared]
        self.state_dir = tmp_path / "state"
        (tmp_path / "home").mkdir()
        self.workers: list[WorkerProcess] = []
        self.client = APIClient()
        self.client.force_login(world.member)

    def directory(self, name: str) -> Path:
        path = self.home / name
        path.mkdir(mode=0o755)
        os.chown(path, self.uid, self.gid)
        return path

    # -- computers -------------------------------------------------------------------------------

    def computer(self, name: str, *, host: str, port: int, key_path, known_hosts_path, gpu_ids=(),
                 concurrency: int = 1) -> ComputeTarget:
        """An SSH computer with its own working directory (several may live on one machine)."""
        working_dir = self.directory(f"cluster-e2e-{self.tag}-{name}")
        self.working_dirs.append(working_dir)
        return ComputeTarget.objects.create(
            owner=self.world.global_admin, name=f"{name}-{self.tag}", kind="ssh", visibility="public", enabled=True,
            host=host, port=port, ssh_user="mmt", ssh_key_path=str(key_path), known_hosts_path=str(known_hosts_path),
            working_dir=str(working_dir), python_path=TARGET_PYTHON, runtimes=["python"], gpu_ids=list(gpu_ids),
            concurrency=concurrency)

    def group(self, computers) -> ComputeGroup:
        group = ComputeGroup.objects.create(name=f"nodes-{self.tag}", created_by=self.world.global_admin)
        group.computers.set(computers)
        return group

    # -- workers and jobs ------------------------------------------------------------------------

    def start_worker(self, ssh_dir: Path) -> WorkerProcess:
        worker = WorkerProcess(self.url, self.world.worker_token, self.state_dir, self.tmp / "home", ssh_dir,
                               self.tmp, extra_env={"MMT_WORKER_CANCEL_GRACE": "3"})
        self.workers.append(worker)
        return worker

    def worker_output(self) -> str:
        return "\n".join(w.output() for w in self.workers)

    def script(self, name: str, text: str) -> Path:
        path = self.shared / name
        path.write_text(text)
        os.chown(path, self.uid, self.gid)
        return path

    def create_job(self, **data) -> Job:
        with transaction.atomic():  # as in a request
            return job_services.create_job(Actor(self.world.member), self.world.project, {"runtime": "python", **data})

    def job(self, job: Job) -> Job:
        return Job.objects.get(pk=job.pk)

    def wait_status(self, job: Job, *statuses, timeout=90.0) -> Job:
        try:
            return wait_until(lambda: (j := self.job(job)).status in statuses and j, timeout=timeout,
                              what=f"job {job.pk} to be {'/'.join(statuses)}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; it is {self.job(job).status}; the worker said: "
                                 f"{self.worker_output()[-6000:]}") from None

    def wait_ended(self, job: Job, timeout=120.0) -> Job:
        return self.wait_status(job, "finished", "failed", "canceled", timeout=timeout)

    def logs(self, job: Job, replica: str) -> list[dict]:
        """GET /api/jobs/{id}/logs?replica=… as a person reads them, every page."""
        items, after = [], 0
        while True:
            answer = self.client.get(f"/api/jobs/{job.pk}/logs?replica={replica}&after={after}")
            assert answer.status_code == 200, answer.content
            page = answer.json()
            if not page["items"]:
                return items
            items += page["items"]
            after = page["next"]

    def stream(self, job: Job, replica: str, stream: str = "stdout") -> str:
        """One replica's stream, checked to be contiguous (no byte twice, none missing) and labelled."""
        chunks = sorted((c for c in self.logs(job, replica) if c["stream"] == stream), key=lambda c: c["offset"])
        end, text = 0, []
        for chunk in chunks:
            assert chunk["replica"] == replica
            assert chunk["offset"] == end, f"{replica} {stream} chunk at {chunk['offset']}, expected {end}"
            end += len(chunk["data"].encode("utf-8"))
            text.append(chunk["data"])
        return "".join(text)

    def wait_log(self, job: Job, replica: str, text: str, timeout=90.0) -> None:
        try:
            wait_until(lambda: LogChunk.objects.filter(job_id=job.pk, replica=replica, data__contains=text).exists(),
                       timeout=timeout, what=f"{text!r} in the logs of {replica} of job {job.pk}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the worker said: {self.worker_output()[-6000:]}") from None

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        for directory in self.working_dirs:
            kill_all(processes_under(str(directory)))
        for directory in self.working_dirs:
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def cluster(transactional_db, live_server, world, tmp_path):
    setup = Cluster(live_server, world, tmp_path)
    yield setup
    setup.close()
    try:  # the live server's connections end with their long-polls: then the test database can go
        wait_until(lambda: not other_sessions(), timeout=CLAIM_WAIT + 15, interval=0.1)
    except AssertionError:
        raise AssertionError(f"database sessions still open: {other_sessions()}") from None


def replica_env(stdout: str) -> dict[str, str]:
    """The `NAME=value` lines a replica printed of its environment."""
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line and line.split("=", 1)[0].isupper())


# The job of the rendezvous tests: every replica prints its cluster environment; main1 serves a TCP
# rendezvous on MASTER_PORT, every sub connects to MMT_CLUSTER_MAIN_ADDR:MASTER_PORT (plain sockets).
RENDEZVOUS = '''\
import os, socket, sys, time
NAMES = ("MMT_CLUSTER_", "MASTER_", "WORLD_SIZE", "RANK", "NODE_RANK", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES",
         "MMT_JOB_ID")
for key in sorted(os.environ):
    if key.startswith(NAMES):
        print(f"{key}={os.environ[key]}", flush=True)
with open(os.environ["MMT_CLUSTER_HOSTS_FILE"]) as f:
    hosts = dict(reversed(line.split()) for line in f if line.strip())
print("hosts file: " + " ".join(f"{n}@{a}" for n, a in hosts.items()), flush=True)
name, size, port = os.environ["MMT_CLUSTER_HOST"], int(os.environ["WORLD_SIZE"]), int(os.environ["MASTER_PORT"])
if os.environ["MMT_CLUSTER_ROLE"] == "main":
    server = socket.create_server(("0.0.0.0", port))
    server.settimeout(120)
    peers = []
    while len(peers) < size - 1:
        conn, address = server.accept()
        hello = conn.makefile().readline().strip()
        print(f"connected: {hello} from {address[0]}", flush=True)
        conn.sendall(b"welcome\\n")
        peers.append((hello, conn))
    for hello, conn in peers:  # each sub says bye once it has printed everything
        assert conn.makefile().readline().strip() == "bye", hello
        conn.close()
    print(f"all {size - 1} connected", flush=True)
else:
    deadline = time.monotonic() + 120
    while True:
        try:
            conn = socket.create_connection((os.environ["MMT_CLUSTER_MAIN_ADDR"], port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    conn.sendall(f"{name}\\n".encode())
    print("main1 says " + conn.makefile().readline().strip(), flush=True)
    conn.sendall(b"bye\\n")
    conn.close()
'''
