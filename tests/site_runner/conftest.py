"""The runner on a compute node, end to end: the Django live server on PostgreSQL, a real automatic
site (sites.services.create_site) whose Jobs are claimed and reported through the launcher's service
(sites.submissions), a spec directory written exactly as docs/sites-protocol.md says (job.json 600,
the `mmt-runner` wrapper 700, `lib/` with the bundled modules, copied here by hand), and the runner
started as a real process through that wrapper, as a job shell starts it, with the site's runner
Python = this interpreter. No scheduler is involved: what a scheduler does to the runner (its
environment, SIGTERM before the time limit) the tests do themselves.

The working directory is shared by the session, so the python runtime's venv (one per Python and
requirements) is built once. Teardown kills, by PID, runners and supervisors a failed test left."""
from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from jobs import outputs
from jobs import services as job_services
from jobs.models import Job, LogChunk
from mado.services import Actor
from sites import services as site_services
from sites import submissions
from tests.sites.conftest import host_keys, launcher, site_fields  # noqa: F401  (fixtures)
from tests.support import database_now, kill_processes_under, other_sessions, wait_for
from worker_agent.site import spec

REPO = Path(__file__).resolve().parents[2]
BUNDLE = spec.BUNDLE  # what the launcher copies into lib/
SCHEDULER_JOB_ID = "4242"


def write_spec_dir(spec_dir: Path, *, api_url: str, token: str, job: dict, runner_python: str) -> Path:
    """`<spec_dir>/` 700 with job.json 600, mmt-runner 700 and lib/ (docs/sites-protocol.md)."""
    spec_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    spec_dir.chmod(0o700)
    job_json = spec_dir / "job.json"
    fd = os.open(job_json, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"format": 1, "api_url": api_url, "token": token, "job": job}, f)
    for rel in BUNDLE:
        target = spec_dir / "lib" / rel
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, target)
        target.chmod(0o600)
    runner = spec_dir / "mmt-runner"
    runner.write_text("#!/bin/sh\n"
                      f"exec {shlex.quote(runner_python)} -I {shlex.quote(str(spec_dir / 'lib/worker_agent/site/runner.py'))}"
                      ' "$@"\n')
    runner.chmod(0o700)
    return spec_dir


def lib_runner(spec_dir: Path) -> Path:
    return spec_dir / "lib" / "worker_agent" / "site" / "runner.py"


class RunnerProcess:
    """One `mmt-runner SPEC_DIR`, as a job shell starts it; its stderr (the scheduler's log) in a file."""

    def __init__(self, spec_dir: Path, log: Path, env: dict):
        self.log = log
        self.log_file = open(log, "wb")  # noqa: SIM115 -- closed in wait()
        self.process = subprocess.Popen([str(spec_dir / "mmt-runner"), str(spec_dir)], env=env,
                                        stdin=subprocess.DEVNULL, stdout=self.log_file, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait(self, timeout: float = 90) -> int:
        try:
            return self.process.wait(timeout=timeout)
        finally:
            self.log_file.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def signal(self, sig=signal.SIGTERM) -> None:
        self.process.send_signal(sig)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if not self.log_file.closed:
            self.log_file.close()


class FlakyProxy:
    """A TCP proxy to the live server that can fail for a while, as a network between a compute node
    and the server does: `mode` "503" answers every request 503, "reset" drops every connection at once,
    None forwards."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.upstream = (parts.hostname, parts.port)
        self.mode: str | None = None
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client:
            if self.mode == "reset":
                return
            if self.mode == "503":
                client.recv(65536)
                client.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            with socket.create_connection(self.upstream) as server:
                back = threading.Thread(target=self._pump, args=(server, client), daemon=True)
                back.start()
                self._pump(client, server)
                back.join(timeout=60)

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()


class SiteRunner:
    """An automatic site on the live server, Jobs on it, their submission and their runners."""

    def __init__(self, live_server, world, fields, launcher_row, work_dir: Path, tmp: Path):
        self.url = live_server.url
        self.world = world
        self.launcher = launcher_row
        self.work_dir = work_dir
        self.tmp = tmp
        self.target = site_services.create_site(Actor(world.global_admin), fields(
            name=f"cluster-{uuid.uuid4().hex[:6]}", working_dir=str(work_dir), runner_python=sys.executable,
            runner_api_url=self.url, runtimes=["python"], visibility="public"))
        self.runners: list[RunnerProcess] = []
        self.jobs: list[int] = []

    # -- Jobs ------------------------------------------------------------------------------------

    def source(self, files: dict[str, str]) -> dict:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
            for name, text in files.items():
                data = text.encode()
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                archive.addfile(info, io.BytesIO(data))
        buffer.seek(0)
        stored = outputs.store_source(Actor(self.world.project_admin), self.world.project, buffer)
        return {"kind": "archive", "id": stored.pk}

    def job(self, command: list[str], **fields) -> Job:
        job = job_services.create_job(Actor(self.world.project_admin), self.world.project,
                                      {"computer": self.target.pk, "runtime": "python", "command": command, **fields})
        self.jobs.append(job.pk)
        return job

    def submit(self, job: Job) -> tuple[Path, dict]:
        """Claim as the launcher does, report it submitted, write the spec directory: (spec_dir, job.json)."""
        [submission] = submissions.launcher_claim(self.launcher, self.target.pk, 1)
        assert submission["job_ids"] == [job.pk], submission
        submissions.report(Actor(None), {"job_ids": [job.pk], "outcome": "submitted",
                                         "scheduler_job_id": SCHEDULER_JOB_ID}, launcher=self.launcher)
        [item] = submission["jobs"]
        assert item["spec_dir"] == f"{self.work_dir}/.mmt-submissions/{job.pk}"
        spec = {"api_url": submission["api_url"], "token": item["token"], "job": item["job"]}
        spec_dir = write_spec_dir(Path(item["spec_dir"]), runner_python=submission["runner_python"], **spec)
        return spec_dir, spec

    # -- runners ---------------------------------------------------------------------------------

    def start_runner(self, spec_dir: Path, **env) -> RunnerProcess:
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("MMT_", "MADO_", "SLURM_", "PBS_", "PJM_", "SGE_")) and k != "JOB_ID"}
        base.update({"SLURM_JOB_ID": SCHEDULER_JOB_ID, **{k: str(v) for k, v in env.items()}})
        runner = RunnerProcess(spec_dir, self.tmp / f"runner-{len(self.runners)}.log", base)
        self.runners.append(runner)
        return runner

    # -- what reached the server -----------------------------------------------------------------

    def status(self, job: Job) -> str:
        return Job.objects.get(pk=job.pk).status

    def wait_status(self, job: Job, *statuses: str, timeout: float = 60) -> Job:
        return wait_for(lambda: (j := Job.objects.get(pk=job.pk)).status in statuses and j, timeout=timeout,
                        interval=0.1, what=f"job {job.pk} to become {' or '.join(statuses)}")

    def log(self, job: Job, stream: str) -> str:
        """The stored stream, checked to be contiguous from byte 0 (no gap, no overlap)."""
        text, at = [], 0
        for chunk in LogChunk.objects.filter(job_id=job.pk, stream=stream).order_by("offset"):
            assert chunk.offset == at, f"{stream} chunk at byte {chunk.offset}, expected {at}"
            text.append(chunk.data)
            at += len(chunk.data.encode())
        return "".join(text)

    # -- teardown --------------------------------------------------------------------------------

    def close(self) -> None:
        for runner in self.runners:
            runner.kill()
        for job_id in self.jobs:
            kill_processes_under(f"{self.work_dir}/.mmt/jobs/{job_id}")




@pytest.fixture(scope="session")
def site_work_dir(tmp_path_factory) -> Path:
    """One working directory for the session: the venv of the python runtime is built once."""
    return tmp_path_factory.mktemp("site-work")


@pytest.fixture
def site(transactional_db, live_server, world, site_fields, launcher, site_work_dir, tmp_path):  # noqa: F811
    since = database_now()
    setup = SiteRunner(live_server, world, site_fields, launcher, site_work_dir, tmp_path)
    yield setup
    setup.close()
    # The live server holds a database connection per open HTTP connection: let this test's end, so the
    # test database can be flushed.
    wait_for(lambda: not other_sessions(since), timeout=20, interval=0.1,
             what="the live server's database sessions")
