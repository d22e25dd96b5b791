"""Helpers of the site submission tests: a registered launcher with its token, sites it serves, Jobs
on them, and the launcher's, the runner's and a person's calls through the real API."""
from __future__ import annotations

import uuid

import pytest

from jobs.models import Job
from mado.services import Actor
from sites import launchers, services, submissions
from sites.models import Launcher
from tests.conftest import bearer
from tests.sites.conftest import LOGIN_HOST, TEST_ALLOWED_HOSTS


@pytest.fixture
def registered(world):
    """(launcher, its API client): registered by the global administrator, token in hand."""
    launcher, token = launchers.register_launcher(Actor(world.global_admin), "hpc-a", world.project,
                                                  TEST_ALLOWED_HOSTS)
    return launcher, bearer(token)


@pytest.fixture
def launcher(registered) -> Launcher:
    """Overrides tests.sites.conftest's launcher: the sites below are served by the registered one."""
    return registered[0]


@pytest.fixture
def lclient(registered):
    return registered[1]


@pytest.fixture(autouse=True)
def no_expiry_throttle(monkeypatch):
    """Each call may run the timeouts: tests move timestamps and expect the next call to see them."""
    monkeypatch.setattr(submissions, "EXPIRY_INTERVAL_SECONDS", 0.0)


def site_of(owner, host_keys, launcher, **overrides):
    data = {
        "name": "hpc-cluster", "submission": "automatic", "account": "shared", "launcher": launcher.pk,
        "host": LOGIN_HOST, "port": 22, "ssh_user": "mmtshared", "jump_hosts": [],
        "known_hosts": host_keys.login_line + "\n", "working_dir": "/work/mmt", "runner_python": "/usr/bin/python3",
        "runner_api_url": "https://tracking.example.org", "variables": "PARTITION=gpu\nCPUS=4", "template": "slurm",
        "visibility": "public",
    }
    data.update(overrides)
    if data["submission"] == "manual":
        data.pop("launcher")
    return services.create_site(Actor(owner), data)


def queue(target, user, project, n=1, status="queued", **fields) -> list[Job]:
    return [Job.objects.create(project=project, created_by=user, target=target, command=["python", "train.py"],
                               status=status, **fields) for _ in range(n)]


def claim(client, target, limit=None, status=200) -> list[dict]:
    body = {"computer": target.pk, **({"limit": limit} if limit is not None else {})}
    response = client.post("/api/launcher/submissions/claim", body, format="json")
    assert response.status_code == status, response.content
    return response.json()["items"] if status == 200 else response.json()


def report(client, job_ids, outcome="submitted", **extra):
    return client.post("/api/launcher/submissions/report", {"job_ids": job_ids, "outcome": outcome, **extra},
                       format="json")


class Runner:
    """The runner's calls with a Job's job token."""

    def __init__(self, job_id: int, token: str, runner_id: str | None = None):
        self.job_id, self.client = job_id, bearer(token)
        self.runner_id = runner_id or str(uuid.uuid4())

    def post(self, call: str, **body):
        return self.client.post(f"/api/runner/jobs/{self.job_id}/{call}", {"runner_id": self.runner_id, **body},
                                format="json")

    def start(self, **body):
        return self.post("start", hostname="node-01", **body)

    def heartbeat(self, status=None):
        return self.post("heartbeat", **({"status": status} if status else {}))

    def finish(self, status="finished", **body):
        return self.post("finish", status=status, **body)


def submitted(client, target, **report_extra) -> dict:
    """Claim the site's waiting Jobs as one submission and report it submitted; returns the item."""
    item = claim(client, target)[0]
    response = report(client, item["job_ids"], scheduler_job_id=report_extra.pop("scheduler_job_id", "4242"),
                      **report_extra)
    assert response.status_code == 200, response.content
    return item
