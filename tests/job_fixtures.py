"""An enabled GPU computer and a scripted worker that speaks the job protocol."""
from __future__ import annotations

import pytest

from computers.models import ComputeTarget
from tests.computer_fixtures import SSH_FIELDS, ScriptedWorker


def gpu_computer(owner, name="gpu-host-1", *, gpus=("0", "1", "2", "3"), concurrency=4, visibility="public",
                 runtimes=("python", "docker")) -> ComputeTarget:
    return ComputeTarget.objects.create(
        owner=owner, name=name, kind="ssh", visibility=visibility, enabled=True, working_dir="/data/mmt",
        python_path="/usr/bin/python3", runtimes=list(runtimes), gpu_ids=list(gpus), concurrency=concurrency,
        **SSH_FIELDS)


class JobWorker(ScriptedWorker):
    """A worker that runs jobs, cluster jobs included (it says so in its hello)."""

    def __init__(self, token: str, worker_id: str = "lab-worker-1", **kwargs):
        kwargs.setdefault("capabilities", ("checks", "reads", "key_candidates", "jobs", "cluster_jobs"))
        super().__init__(token, worker_id, **kwargs)

    def claim(self, active=(), wait=0):
        response = self.post("/api/worker/claim", {"active_job_ids": list(active), "wait": wait})
        assert response.status_code == 200, response.content
        return response.json()["item"]

    def leased(self, item, call: str, **body):
        return self.post(f"/api/worker/jobs/{item['id']}/{call}", {"lease_id": item["lease_id"], **body})

    def heartbeat(self, item, status=None):
        return self.leased(item, "heartbeat", **({"status": status} if status else {}))

    def complete(self, item, status="finished", exit_code=0, **extra):
        return self.leased(item, "complete", status=status, exit_code=exit_code, **extra)


@pytest.fixture
def gpu_box(world):
    return gpu_computer(world.global_admin)


@pytest.fixture
def job_worker(world):
    worker = JobWorker(world.worker_token, "lab-worker-1")
    assert worker.hello().status_code == 200
    return worker


def job_request(target, **extra) -> dict:
    return {"computer": target.pk, "runtime": "python", "command": ["python", "train.py"], **extra}
