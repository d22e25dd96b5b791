"""Computers and a scripted worker for server-side tests of computers, checks and reads."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from computers.models import ComputeTarget
from tests.conftest import bearer

SSH_FIELDS = {"host": "gpu-host-1.example.internal", "port": 22, "ssh_user": "mmt",
              "ssh_key_path": "/home/worker/.ssh/mmt_worker_ed25519",
              "known_hosts_path": "/home/worker/.ssh/mmt_known_hosts"}


def make_computer(owner, name: str, *, visibility="private", **extra) -> ComputeTarget:
    return ComputeTarget.objects.create(owner=owner, name=name, kind="ssh", visibility=visibility,
                                        **{**SSH_FIELDS, **extra})


@dataclass
class Computers:
    researchers_private: ComputeTarget  # owned by alice (a researcher), private
    admins_public: ComputeTarget
    admins_private: ComputeTarget


@pytest.fixture
def computers(world) -> Computers:
    return Computers(
        researchers_private=make_computer(world.project_admin, "alice-box", gpu_ids=["0", "1"], concurrency=2),
        admins_public=make_computer(world.global_admin, "shared-gpu", visibility="public"),
        admins_private=make_computer(world.global_admin, "root-only"),
    )


class ScriptedWorker:
    """Speaks the worker protocol (docs/worker-protocol.md) over HTTP like the real agent would."""

    def __init__(self, token: str, worker_id: str = "lab-worker-1", *, base: str = "", target_ids=None,
                 capabilities=("checks", "reads", "key_candidates")):
        self.client = bearer(token)
        self.base = base
        self.worker_id = worker_id
        self.target_ids = target_ids
        self.capabilities = list(capabilities)

    def post(self, path: str, body: dict):
        return self.client.post(self.base + path, {"worker_id": self.worker_id, **body}, format="json")

    def hello(self, **extra):
        body = {"version": "0.1.0", "hostname": "worker-host", "parallel_jobs": 2, "target_ids": self.target_ids,
                "capabilities": self.capabilities, "ssh_key_candidates": ["/home/worker/.ssh/mmt_worker_ed25519"],
                "known_hosts_candidates": ["/home/worker/.ssh/mmt_known_hosts"], **extra}
        return self.post("/api/worker/hello", body)

    def claim_check(self, wait=0):
        response = self.post("/api/worker/checks/claim", {"wait": wait})
        assert response.status_code == 200, response.content
        return response.json()["item"]

    def complete_check(self, item, status="succeeded", result=None):
        return self.post(f"/api/worker/checks/{item['id']}/complete",
                         {"lease_id": item["lease_id"], "status": status, "result": result or good_result()})

    def claim_read(self, wait=0):
        response = self.post("/api/worker/reads/claim", {"wait": wait})
        assert response.status_code == 200, response.content
        return response.json()["item"]

    def complete_read(self, item, entries=None, error=None):
        return self.post(f"/api/worker/reads/{item['id']}/complete",
                         {"lease_id": item["lease_id"], "entries": entries or [], "error": error})


def good_result() -> dict:
    return {
        "items": [
            {"key": "connection", "status": "ok", "code": None, "detail": "connected as mmt"},
            {"key": "python", "status": "ok", "code": None, "detail": "Python 3.11.2"},
            {"key": "venv", "status": "ok", "code": None, "detail": ""},
            {"key": "pip", "status": "ok", "code": None, "detail": "pip 23.0.1"},
            {"key": "git", "status": "none", "code": "git_missing", "detail": ""},
            {"key": "docker", "status": "ok", "code": None, "detail": "Docker 24.0.5"},
            {"key": "apptainer", "status": "none", "code": "apptainer_missing", "detail": ""},
            {"key": "singularity", "status": "none", "code": "singularity_missing", "detail": ""},
            {"key": "gpu", "status": "ok", "code": None, "detail": "2 GPUs"},
            {"key": "work_directory", "status": "not_checked", "code": None, "detail": ""},
            {"key": "api", "status": "ok", "code": None, "detail": ""},
        ],
        "machine": {"arch": "x86_64", "cores": 32, "memory_bytes": 270_000_000_000, "home": "/home/mmt"},
        "pythons": [{"path": "/usr/bin/python3", "version": "3.11.2"}],
        "workdirs": [{"path": "/data", "writable": True, "free_bytes": 5_000_000_000_000},
                     {"path": "/home/mmt", "writable": True, "free_bytes": 100_000_000_000}],
        "gpus": [{"index": 0, "uuid": "GPU-aaaa", "name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920},
                 {"index": 1, "uuid": "GPU-bbbb", "name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920}],
        "runtimes": ["python", "docker"],
    }


def failed_result() -> dict:
    return {"items": [{"key": "connection", "status": "failed", "code": "ssh_failed", "detail": "authentication failed"},
                      *[{"key": k, "status": "not_checked", "code": None, "detail": ""}
                        for k in ["python", "venv", "pip", "git", "docker", "apptainer", "singularity", "gpu",
                                  "work_directory", "api"]]],
            "machine": {}, "pythons": [], "workdirs": [], "gpus": [], "runtimes": []}
