"""Helpers of the launcher and submit tests: the live server, a registered launcher with its token, a
site served by it whose login node is the real sshd, and Jobs waiting on it."""
from __future__ import annotations

import pytest

from jobs.models import Job
from mado.services import Actor
from sites import launchers, services, submissions
from tests.site_agent.conftest import known_hosts_text
from worker_agent.site.launcher import Launcher, SiteApi

# A job shell without a scheduler: it checks that the spec directory was written, says so on stderr
# and prints a made-up scheduler id (77<first Job id>); mmt_cancel records the id it was asked to cancel.
FAKE_SCHEDULER = """\
# test job shell: no scheduler, a made-up id
mmt_submit() {
    exec 3>&1 1>&2
    [ -f "$MMT_SPEC_DIR/job.json" ] && [ -x "$MMT_RUNNER" ] || { echo "no spec directory" >&2; exit 2; }
    echo "submitting $MMT_JOB_IDS"
    printf '%s\\n' "77${MMT_JOB_IDS%%,*}" >&3
}
mmt_cancel() {
    printf '%s\\n' "$MMT_SCHEDULER_JOB_ID" >> "$MMT_VAR_OUT/canceled"
}
"""
# One whose submit fails after printing the spec directory's job.json (which holds the job token) to stderr.
FAILING = """\
mmt_submit() {
    cat "$MMT_SPEC_DIR/job.json" >&2
    echo "sbatch: error: Batch job submission failed: Invalid account" >&2
    exit 1
}
mmt_cancel() { :; }
"""


_made: list[Launcher] = []


@pytest.fixture
def server(transactional_db, live_server, world, monkeypatch):
    monkeypatch.setattr(submissions, "EXPIRY_INTERVAL_SECONDS", 0.0)
    yield live_server.url
    # Kept-alive HTTP connections keep the live server's threads, and their database sessions, open.
    while _made:
        _made.pop().close()


@pytest.fixture
def registered(world):
    # The sites of these tests log in to the sshd on this host (sites.allowed_hosts).
    return launchers.register_launcher(Actor(world.global_admin), "hpc-a", world.project, ["127.0.0.1"])


def make_site(world, launcher, sshd, work_dir, api_url, *, job_shell=FAKE_SCHEDULER, **overrides):
    data = {
        "name": "hpc-cluster", "submission": "automatic", "account": "shared", "launcher": launcher.pk,
        "host": "127.0.0.1", "port": sshd.port, "ssh_user": sshd.user, "jump_hosts": [],
        "known_hosts": known_hosts_text(sshd), "working_dir": str(work_dir), "runner_python": "/usr/bin/python3",
        "runner_api_url": api_url, "variables": f"OUT={work_dir}", "job_shell": job_shell, "visibility": "public",
    }
    data.update(overrides)
    if data["submission"] == "manual":
        for name in ("launcher", "host", "port", "ssh_user", "jump_hosts", "known_hosts"):
            data.pop(name, None)
    return services.create_site(Actor(world.project_admin), data)


def queue(target, user, project, n=1, status="queued", **fields) -> list[Job]:
    return [Job.objects.create(project=project, created_by=user, target=target, command=["python", "train.py"],
                               status=status, **fields) for _ in range(n)]


def launcher_for(url, token, state_dir, **kwargs) -> Launcher:
    launcher = Launcher(SiteApi(url, token, attempts=2), state_dir, long_poll=0, **kwargs)
    _made.append(launcher)
    return launcher
