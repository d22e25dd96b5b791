"""Fixtures of the sites end-to-end tests: the live server on PostgreSQL, the real sshd as a site's
login node, the real Slurm and Grid Engine (tests/peers), a registered launcher driven in-process one
round at a time, and Jobs created the way people create them (jobs.services.create_job). Nothing is
stood in for: the launcher logs in over SSH, writes the spec directories, runs the rendered job shell,
the scheduler starts the runner from the spec directory, and the runner reports with the job token.

The login node's environment: the tests' schedulers listen on free ports (Slurm) or need SGE_ROOT and
SGE_CELL (Grid Engine), so each site's job shell starts with one line that exports them from site
variables, the way an owner adds `module load slurm` to a job shell, rather than changing the shared
sshd. The login user's working directory is shared by the session, so the python runtime's venv (one
per Python and requirements) is built once. Run under flock /tmp/mado-schedulers.lock."""
from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from jobs import services as job_services
from jobs.choices import TERMINAL_STATUSES
from jobs.models import Job, LogChunk
from mado.services import Actor
from sites import services as site_services
from sites import shells
from sites.models import LauncherKey, Submission
from tests.peers.sshd import sshd  # noqa: F401  (session fixture)
from tests.site_agent.conftest import authorize, known_hosts_text
from tests.site_agent.site_world import launcher_for, registered, server  # noqa: F401  (fixtures)
from tests.support import database_now, kill_processes_under, other_sessions, wait_for

SLURM_PREFIX = 'export SLURM_CONF="$MMT_VAR_SLURM_CONF"  # this cluster\'s configuration\n'
GRIDENGINE_PREFIX = 'export SGE_ROOT="$MMT_VAR_SGE_ROOT" SGE_CELL="$MMT_VAR_SGE_CELL"  # this cell\n'


# Numbered lines, then a metric through result.json.
NUMBERED = '''\
import json, os, time
time.sleep(1)
for i in range(1, {lines} + 1):
    print(f"line {{i:03d}} of job {{os.environ['MMT_JOB_ID']}}", flush=True)
    time.sleep(0.01)
with open(os.environ["MMT_RESULT_FILE"], "w") as f:
    json.dump({{"version": 1, "complete": True, "metrics": [{{"name": "loss", "value": 0.25, "step": 1}}]}}, f)
'''

# A numbered line every 0.2 s for five minutes.
TICKER = '''\
import time
for i in range(1500):
    print(f"tick {i}", flush=True)
    time.sleep(0.2)
'''


def numbered(lines: int) -> str:
    return NUMBERED.format(lines=lines)


def expected_lines(job, lines: int) -> str:
    return "".join(f"line {i:03d} of job {job.pk}\n" for i in range(1, lines + 1))


def ticks(text: str) -> list[int]:
    return [int(line.split()[1]) for line in text.splitlines() if line.startswith("tick ")]


def slurm_job_shell() -> str:
    return SLURM_PREFIX + shells.builtin_template("slurm")


def gridengine_job_shell() -> str:
    return GRIDENGINE_PREFIX + shells.builtin_template("gridengine")


@pytest.fixture(scope="session")
def login_home(sshd):  # noqa: F811
    """A directory of the login user for the session (755): the copied scheduler configuration and the
    sites' working directory `work`, which the launcher's writer creates as the login user."""
    path = sshd.home / f"e2e-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o755)
    owner = sshd.home.stat()
    os.chown(path, owner.st_uid, owner.st_gid)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_conf(login_home, slurm) -> Path:  # noqa: F811
    """The cluster's slurm.conf where the login user can read it."""
    conf = login_home / "slurm.conf"
    shutil.copy(slurm.conf, conf)
    conf.chmod(0o644)
    return conf


class Site:
    """One automatic site on the live server served by an in-process launcher, its Jobs, and what the
    scheduler and the server made of them."""

    def __init__(self, world, url: str, target, agent, work_dir: Path, launcher_token: str = ""):
        self.world = world
        self.url = url
        self.target = target
        self.agent = agent
        self.launcher_token = launcher_token
        self.work_dir = work_dir
        self.jobs: list[int] = []
        self.since = database_now()  # sessions idle since before this are other tests' (support.other_sessions)

    def job(self, code: str, **fields) -> Job:
        """A python-runtime Job running `python -c code`, created by alice as in the Jobs page."""
        job = job_services.create_job(Actor(self.world.project_admin), self.world.project,
                                      {"computer": self.target.pk, "runtime": "python",
                                       "command": ["python", "-c", code], **fields})
        self.jobs.append(job.pk)
        return job

    def round(self) -> dict:
        return self.agent.round(wait=0)

    def submission(self, job: Job) -> Submission:
        return Submission.objects.get(job_id=job.pk)

    def spec_dir(self, job: Job) -> Path:
        return self.work_dir / ".mmt-submissions" / str(job.pk)

    def wait_status(self, job: Job, *statuses: str, timeout: float = 90) -> Job:
        def reached():
            current = Job.objects.get(pk=job.pk)
            return current if current.status in statuses else None
        try:
            return wait_for(reached, timeout=timeout, interval=0.2,
                            what=f"Job {job.pk} to become {' or '.join(statuses)}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; it is {Job.objects.get(pk=job.pk).status}. {self.scheduler_logs(job)}") \
                from None

    def scheduler_logs(self, job: Job) -> str:
        """The batch job's own output files (the runner's notes), for a failure's message."""
        found = {}
        for spec_dir in {self.spec_dir(job), *self.work_dir.glob(".mmt-submissions/*")}:
            for path in sorted(spec_dir.glob("*.out")) if spec_dir.is_dir() else []:
                if path.parent == self.spec_dir(job) or f"mmt-{job.pk}" in path.read_text(errors="replace"):
                    found[str(path)] = path.read_text(errors="replace")[-3000:]
        return f"Batch job output: {found}"

    @staticmethod
    def log(job: Job, stream: str = "stdout") -> str:
        """The stored stream, checked to be contiguous from byte 0 (no gap, no overlap)."""
        text, at = [], 0
        for chunk in LogChunk.objects.filter(job_id=job.pk, stream=stream).order_by("offset"):
            assert chunk.offset == at, f"{stream} chunk at byte {chunk.offset}, expected {at}"
            text.append(chunk.data)
            at += len(chunk.data.encode())
        return "".join(text)

    def scheduler_ids(self) -> set[str]:
        return {s for s in Submission.objects.filter(job_id__in=self.jobs).values_list("scheduler_job_id", flat=True)
                if s}

    def kill_leftovers(self) -> None:
        for job_id in self.jobs:
            kill_processes_under(f"{self.work_dir}/.mmt/jobs/{job_id}")


def make_site(world, launcher_row, sshd, work_dir: Path, url: str, *, job_shell: str, variables: str,  # noqa: F811
              **overrides):
    data = {
        "name": f"cluster-{uuid.uuid4().hex[:6]}", "submission": "automatic", "account": "shared",
        "launcher": launcher_row.pk, "host": "127.0.0.1", "port": sshd.port, "ssh_user": sshd.user,
        "jump_hosts": [], "known_hosts": known_hosts_text(sshd), "working_dir": str(work_dir),
        "runner_python": "/usr/bin/python3", "runner_api_url": url, "variables": variables,
        "job_shell": job_shell, "visibility": "public", "runtimes": ["python"],
    }
    data.update(overrides)
    return site_services.create_site(Actor(world.project_admin), data)


def open_site(world, url, registered, sshd, tmp_path, work_dir, *, job_shell, variables,  # noqa: F811
              **overrides) -> Site:
    """The site, its launcher's first round (its key published), and that key authorized on the login node."""
    target = make_site(world, registered[0], sshd, work_dir, url, job_shell=job_shell, variables=variables,
                       **overrides)
    state = tmp_path / "launcher-state"
    state.mkdir(mode=0o700)
    agent = launcher_for(url, registered[1], state)
    agent.round(wait=0)
    authorize(sshd, LauncherKey.objects.get(target=target).public_key)
    return Site(world, url, target, agent, work_dir, registered[1])


def settle(site: Site, cancel, in_queue, timeout: float = 60) -> None:
    """Teardown: the scheduler jobs a test left are canceled and leave the queue (their runners report
    their end meanwhile), stray processes are killed, and the live server's sessions end before the
    database is flushed."""
    ids = site.scheduler_ids()
    for scheduler_id in ids:
        if in_queue(scheduler_id):
            cancel(scheduler_id)
    for scheduler_id in ids:
        wait_for(lambda: not in_queue(scheduler_id), timeout=timeout, interval=0.2,  # noqa: B023
                 what=f"scheduler job {scheduler_id} to leave the queue")
    # A runner that got the scheduler's signal reports its end before the live server goes away.
    started = Submission.objects.filter(job_id__in=site.jobs, runner_started_at__isnull=False)
    for job_id in started.values_list("job_id", flat=True):
        wait_for(lambda: Job.objects.get(pk=job_id).status in TERMINAL_STATUSES, timeout=30,  # noqa: B023
                 what=f"the runner of Job {job_id} to report its end")
    site.kill_leftovers()
    if site.agent is not None:
        site.agent.close()
    wait_for(lambda: not other_sessions(site.since), timeout=20, interval=0.1,
             what="the live server's database sessions")


@pytest.fixture
def slurm_site(server, registered, world, sshd, slurm, slurm_conf, login_home, tmp_path):  # noqa: F811
    site = open_site(world, server, registered, sshd, tmp_path, login_home / "work", job_shell=slurm_job_shell(),
                     variables=f"SLURM_CONF={slurm_conf}\nPARTITION=debug")
    yield site
    settle(site, lambda i: slurm.run("scancel", i, check=False), lambda i: bool(slurm.queue(i)))


@pytest.fixture
def gridengine_site(server, registered, world, sshd, gridengine, login_home, tmp_path):  # noqa: F811
    site = open_site(world, server, registered, sshd, tmp_path, login_home / "work",
                     job_shell=gridengine_job_shell(), variables="SGE_ROOT=/var/lib/gridengine\nSGE_CELL=default")
    yield site
    settle(site, lambda i: gridengine.run("qdel", i, check=False), lambda i: gridengine.state(i) is not None)


@contextmanager
def node_taken(slurm):  # noqa: F811
    """Another job holds the whole node meanwhile, so a site's job stays pending; yields its id."""
    blocker = slurm.run("sbatch", "--parsable", "--exclusive", "--job-name=blocker", "--output=/dev/null", "--wrap", "sleep 300").stdout
    blocker = blocker.strip().split(";")[0]
    try:
        wait_for(lambda: slurm.queue(blocker) == [(blocker, "RUNNING")], timeout=30, what="the blocker running")
        yield blocker
    finally:
        slurm.run("scancel", blocker, check=False)


def run_cli(argv: list[str], env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          check=False)
