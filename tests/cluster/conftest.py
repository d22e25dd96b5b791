"""Fixtures of the cluster-job tests: GPU computers in a compute group, and the sites fixtures for
the refusal of cluster jobs on site computers."""
from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from computers.models import ComputeGroup, ComputeTarget
from tests.job_fixtures import gpu_computer
from tests.sites.conftest import host_keys, launcher, make_site, site_fields  # noqa: F401  (fixtures)


def session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def make_group(world, name: str, computers) -> ComputeGroup:
    group = ComputeGroup.objects.create(name=name, created_by=world.global_admin)
    group.computers.set(computers)
    return group


@pytest.fixture
def node_a(world):
    return gpu_computer(world.global_admin, "node-a", gpus=("0", "1"), concurrency=2)


@pytest.fixture
def node_b(world):
    return gpu_computer(world.global_admin, "node-b", gpus=("0", "1", "2", "3"), concurrency=4)


@pytest.fixture
def lab_nodes(world, node_a, node_b) -> ComputeGroup:
    return make_group(world, "lab-nodes", [node_a, node_b])


def cluster_request(**fields) -> dict:
    return {"runtime": "python", "command": ["python", "train.py"], **fields}


def create(world, user=None, **fields) -> dict:
    response = session(user or world.member).post("/api/projects/lab/jobs", cluster_request(**fields), format="json")
    assert response.status_code == 201, response.content
    return response.json()


def refused_create(world, user=None, **fields) -> dict:
    """A cluster job the server refuses at creation: the 422 error body (nothing was created)."""
    response = session(user or world.member).post("/api/projects/lab/jobs", cluster_request(**fields), format="json")
    assert response.status_code == 422, response.content
    return response.json()


def created_then_shrunk(world, computer, *, gpus=(), concurrency=None, **fields) -> dict:
    """A cluster job created while `computer` could hold it, which then lost GPUs or concurrent-job slots
    (its owner changed it while the job was queued): what creation now refuses, for the claim and the
    queued reason to meet."""
    ComputeTarget.objects.filter(pk=computer.pk).update(gpu_ids=[str(i) for i in range(16)], concurrency=16)
    job = create(world, computer=computer.pk, **fields)
    ComputeTarget.objects.filter(pk=computer.pk).update(gpu_ids=list(gpus),
                                                        concurrency=concurrency or computer.concurrency)
    return job
