"""Jobs end to end with real processes: the Django live server on PostgreSQL, a real
`mado-tracking-worker run` process, and a real OpenSSH server as the computer (tests/peers/sshd.py).

The `e2e` fixture registers an enabled SSH computer at that sshd with two GPU ids, a working directory
in the login user's home, and helpers to create jobs, start and kill workers, and read what reached
the server. Every job script of these tests records its PID in a `starts` file, so a test can say
that no second process was ever started. Teardown stops the workers and whatever a test left running
on the target, by PID."""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.db import transaction

from computers.models import ComputeTarget
from jobs import services as job_services
from jobs.models import GpuReservation, Job, JobEvent, LogChunk
from mado.services import Actor
from tests.peers.sshd import Sshd, sshd, start_sshd  # noqa: F401  (sshd: the shared fixture)
from tests.support import database_now, kill_all, other_sessions, processes_under, tar_gz, wait_for

WORKER = str(Path(sys.executable).with_name("mado-tracking-worker"))
CLAIM_WAIT = 2
TARGET_PYTHON = "/usr/bin/python3"


def local_computer_at(e2e, working_dir) -> ComputeTarget:
    """A public Local computer (development only): the worker runs its jobs as its own user, in `working_dir`."""
    return ComputeTarget.objects.create(
        owner=e2e.world.global_admin, name=f"local-{uuid.uuid4().hex[:6]}", kind="local", visibility="public",
        enabled=True, working_dir=str(working_dir), python_path=TARGET_PYTHON, runtimes=["python"], gpu_ids=[],
        concurrency=1)


def wait_until(predicate, timeout=30.0, interval=0.05, what="condition"):
    """tests.support.wait_for with the longer default that these end-to-end jobs need."""
    return wait_for(predicate, timeout, interval, what)


class WorkerProcess:
    """A real `mado-tracking-worker run` with its own log file."""

    def __init__(self, url: str, token: str, state_dir: Path, home: Path, ssh_dir: Path, log_dir: Path,
                 worker_id: str = "lab-worker-1", extra_env: dict | None = None):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MMT_", "MADO_"))}
        env.update(HOME=str(home), MMT_API_URL=url, MMT_API_TOKEN=token, MMT_WORKER_ID=worker_id,
                   MMT_WORKER_STATE_DIR=str(state_dir), MMT_WORKER_SSH_DIR=str(ssh_dir), MMT_LOG_LEVEL="debug",
                   MMT_WORKER_CLAIM_WAIT=str(CLAIM_WAIT))
        env.update(extra_env or {})
        self.claim_wait = int(env["MMT_WORKER_CLAIM_WAIT"])  # how long its long-polls outlive it on the server
        self.log = log_dir / f"{worker_id}-{uuid.uuid4().hex[:6]}.log"
        self.log_file = open(self.log, "wb")
        self.process = subprocess.Popen([WORKER, "run"], env=env, stdout=self.log_file, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()

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


class E2E:
    def __init__(self, live_server, world, sshd: Sshd, tmp_path: Path):
        self.url = live_server.url
        self.live_server = live_server
        self.world = world
        self.sshd = sshd
        self.tmp = tmp_path
        user = pwd.getpwnam(sshd.user)
        self.uid, self.gid = user.pw_uid, user.pw_gid
        self.working_dir = sshd.home / f"e2e-{uuid.uuid4().hex[:8]}"
        self.working_dir.mkdir(mode=0o755)
        os.chown(self.working_dir, self.uid, self.gid)
        self.marks = self.working_dir / "marks"  # the job scripts' own records (PIDs, signals seen)
        self.marks.mkdir(mode=0o777)
        os.chown(self.marks, self.uid, self.gid)
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.state_dir = tmp_path / "state"
        self.workers: list[WorkerProcess] = []
        self.computer = ComputeTarget.objects.create(
            owner=world.global_admin, name=f"sshd-{uuid.uuid4().hex[:6]}", kind="ssh", visibility="public",
            enabled=True, host=getattr(sshd, "host", "127.0.0.1"), port=sshd.port, ssh_user=sshd.user,
            ssh_key_path=str(sshd.key_path),
            known_hosts_path=str(sshd.known_hosts_path), working_dir=str(self.working_dir), python_path=TARGET_PYTHON,
            runtimes=["python", "docker"], gpu_ids=["0", "1"], concurrency=2)

    # -- workers -------------------------------------------------------------------------------

    def start_worker(self, url: str | None = None, **env) -> WorkerProcess:
        extra = {"MMT_WORKER_CANCEL_GRACE": "3"}
        extra.update({k: str(v) for k, v in env.items()})
        worker = WorkerProcess(url or self.url, self.world.worker_token, self.state_dir, self.home,
                               self.sshd.client_dir, self.tmp, extra_env=extra)
        self.workers.append(worker)
        return worker

    def worker_output(self) -> str:
        return "\n".join(w.output() for w in self.workers)

    # -- jobs ----------------------------------------------------------------------------------

    def script(self, name: str, text: str) -> Path:
        """A job script on the target, readable by the login user."""
        path = self.working_dir / name
        path.write_text(text)
        os.chown(path, self.uid, self.gid)
        return path

    def counter_job(self, mark: str, lines: int, pause: float, hold_at: int | None = None, **data) -> Job:
        """A job printing `lines` numbered lines, one every `pause` seconds (and one stderr line in 50);
        with `hold_at`, it waits before that line until `release(mark)`."""
        script = self.working_dir / "counter.py"
        if not script.exists():
            self.script("counter.py", COUNTER)
        hold = {"HOLD_AT": str(hold_at), "HOLD_FILE": str(self.working_dir / f"{mark}.go")} if hold_at else {}
        return self.create_job(command=["python", str(script), str(lines), str(pause)],
                               env={"MARKS": str(self.marks), "MARK": mark, **hold}, **data)

    def release(self, mark: str) -> None:
        """Lets a counter job held with `hold_at` go on."""
        (self.working_dir / f"{mark}.go").write_text("")

    def create_job(self, **data) -> Job:
        body = {"computer": self.computer.pk, "runtime": "python", **data}
        with transaction.atomic():  # as in a request
            return job_services.create_job(Actor(self.world.member), self.world.project, body)

    def job(self, job: Job) -> Job:
        return Job.objects.get(pk=job.pk)

    def wait_status(self, job: Job, *statuses, timeout=60.0) -> Job:
        return wait_until(lambda: (j := self.job(job)).status in statuses and j, timeout=timeout,
                          what=f"job {job.pk} to be {'/'.join(statuses)} "
                               f"(workers said: {self.worker_output()[-3000:]})")

    def wait_ended(self, job: Job, timeout=60.0) -> Job:
        return self.wait_status(job, "finished", "failed", "canceled", timeout=timeout)

    def wait_log(self, job: Job, text: str, timeout=30.0) -> None:
        wait_until(lambda: text in self.stream(job, "stdout") + self.stream(job, "stderr"), timeout=timeout,
                   what=f"{text!r} in the logs of job {job.pk}")

    def stream(self, job: Job, stream: str) -> str:
        """The stream as the server holds it, checked to be contiguous: no byte twice, none missing."""
        text = []
        end = 0
        chunks = list(LogChunk.objects.filter(job_id=job.pk, stream=stream).order_by("offset"))
        for chunk in chunks:
            assert chunk.offset == end, f"{stream} chunk at {chunk.offset}, expected {end}: a gap or an overlap"
            end += len(chunk.data.encode("utf-8"))
            text.append(chunk.data)
        return "".join(text)

    def assert_delivered_in_order(self, job: Job) -> None:
        """Chunks arrived in the order of their offsets (ids grow with offsets in each stream)."""
        for stream in ("stdout", "stderr"):
            ids = list(LogChunk.objects.filter(job_id=job.pk, stream=stream).order_by("offset")
                       .values_list("id", flat=True))
            assert ids == sorted(ids), f"{stream} chunks were stored out of order"

    def assert_ended_once(self, job: Job, status: str) -> Job:
        job = self.job(job)
        assert job.status == status, (job.status, job.end_reason, job.error, self.worker_output()[-4000:])
        events = list(JobEvent.objects.filter(job_id=job.pk).values_list("kind", flat=True))
        assert events.count(status) == 1, events
        assert sum(events.count(k) for k in ("finished", "failed", "canceled")) == 1, events
        assert events.count("started") == 1, events
        assert not GpuReservation.objects.filter(job_id=job.pk).exists(), "the job's GPUs are still reserved"
        return job

    def starts(self, name: str) -> list[str]:
        path = self.marks / name
        return path.read_text().split() if path.exists() else []

    def journal(self) -> list[str]:
        jobs = self.state_dir / "jobs"
        return sorted(p.name for p in jobs.glob("*.json")) if jobs.exists() else []

    # -- teardown ------------------------------------------------------------------------------

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        kill_all(processes_under(str(self.working_dir)))
        shutil.rmtree(self.working_dir, ignore_errors=True)


@pytest.fixture
def e2e(transactional_db, live_server, world, sshd, tmp_path):
    since = database_now()
    setup = E2E(live_server, world, sshd, tmp_path)
    yield setup
    setup.close()
    # The live server keeps a database connection per open HTTP connection and holds a long-poll until
    # its wait ends (the longest any of this test's workers asked for): let them end, so that the test
    # database can be dropped.
    longest = max([CLAIM_WAIT, *(worker.claim_wait for worker in setup.workers)])
    try:
        wait_until(lambda: not other_sessions(since), timeout=longest + 15, interval=0.1)
    except AssertionError:
        raise AssertionError(f"database sessions still open: {other_sessions(since)}") from None


# -- material for jobs ------------------------------------------------------------------------------

def build_wheel(directory: Path, name: str = "mmt_e2e_dep", version: str = "0.1",
                module: str = 'VALUE = "from-the-local-wheel"\n') -> Path:
    """A pure-Python wheel made by hand (a wheel is a zip with METADATA, WHEEL and RECORD), so pip
    installs it with --no-index and nothing is downloaded."""
    import base64
    import hashlib
    import zipfile

    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": module.encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: mado-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


source_archive = tar_gz  # the job source uploads of these tests


FAKE_PYNVML = '''\
"""A stand-in for nvidia-ml-py (no NVIDIA GPU on these machines): fixed readings."""
class NVMLError(Exception):
    pass
def nvmlInit():
    pass
def nvmlDeviceGetHandleByIndex(index):
    if int(index) > 3:
        raise NVMLError("no such GPU")
    return int(index)
class _Rates:
    gpu = 37
    memory = 5
class _Memory:
    used = 1536 * 2 ** 20
    total = 80 * 2 ** 30
    free = total - used
def nvmlDeviceGetUtilizationRates(handle):
    return _Rates()
def nvmlDeviceGetMemoryInfo(handle):
    return _Memory()
'''


COUNTER = '''\
import os, sys, time
with open(os.path.join(os.environ["MARKS"], os.environ["MARK"]), "a") as f:
    f.write(f"{os.getpid()}\\n")
lines, pause = int(sys.argv[1]), float(sys.argv[2])
hold_at, hold_file = int(os.environ.get("HOLD_AT") or -1), os.environ.get("HOLD_FILE", "")
for i in range(lines):
    if i == hold_at:
        sys.stdout.flush()
        while not os.path.exists(hold_file):
            time.sleep(0.05)
    print(f"line {i:06d}")
    if i % 50 == 0:
        print(f"err {i:06d}", file=sys.stderr)
    time.sleep(pause)
print("done")
'''


def counter_lines(count: int) -> list[str]:
    return [f"line {i:06d}" for i in range(count)] + ["done"]


def counter_errors(count: int) -> list[str]:
    return [f"err {i:06d}" for i in range(0, count, 50)]


def job_lines(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


# -- an API port that can go away -------------------------------------------------------------------

class FlakyPort:
    """A TCP forwarder in front of the live server. `down()` closes the listening socket and resets
    every open connection, as a server restart does; `up()` listens on the same port again;
    `swallow_answers` lets requests through but drops the server's answers (a response lost on the way)."""

    def __init__(self, upstream_port: int):
        import socket
        import threading

        self.upstream = ("127.0.0.1", upstream_port)
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.lock = threading.Lock()
        self.sockets: set = set()
        self.listener = None
        self.swallow_answers = False
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        import socket
        import threading

        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.sockets.update((client, server))
            for a, b, answers in ((client, server, False), (server, client, True)):
                threading.Thread(target=self._pump, args=(a, b, answers), daemon=True).start()

    def _pump(self, source, sink, answers: bool) -> None:
        try:
            while True:
                data = source.recv(1 << 16)
                if not data:
                    break
                if answers and self.swallow_answers:
                    continue  # the request reached the server; its answer never comes back
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(2)
                except OSError:
                    pass

    def down(self) -> None:
        import socket
        import struct

        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() in progress; close() alone would not
        except OSError:
            pass
        self.listener.close()
        with self.lock:
            sockets, self.sockets = list(self.sockets), set()
        for s in sockets:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
                s.shutdown(socket.SHUT_RDWR)  # wakes the pump blocked in recv(); close() alone would not
                s.close()
            except OSError:
                pass

    def close(self) -> None:
        self.down()
