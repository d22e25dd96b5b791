"""Fixtures of the tracking pages' tests: a running Job of bob's (its Run made by tracking's hook) and
helpers that log to Runs through tracking.services, as the MLflow API does."""
from __future__ import annotations

import pytest

import tracking.page_blocks  # noqa: F401  (registers the Run panel on the job page; TrackingConfig.ready() should)
from jobs import services as job_services
from mado.services import Actor
from tests.job_fixtures import JobWorker, gpu_computer, job_request
from tracking import services
from tracking.models import Run, now_ms


def log(run: Run, user, key: str, values, *, first_step: int = 0) -> None:
    """Logs values at consecutive steps, in batches of MLflow's 1000-metric limit."""
    points = [{"key": key, "value": v, "timestamp": now_ms(), "step": first_step + i} for i, v in enumerate(values)]
    for start in range(0, len(points), 1000):
        services.log_batch(Actor(user), None, run, metrics=points[start:start + 1000])


def log_params(run: Run, user, **params) -> None:
    services.log_batch(Actor(user), None, run, params=[{"key": k, "value": str(v)} for k, v in params.items()])


def set_tags(run: Run, user, **tags) -> None:
    services.log_batch(Actor(user), None, run, tags=[{"key": k, "value": str(v)} for k, v in tags.items()])


def standalone_run(user, project, name: str, *, kind: str = "other", experiment_id=None) -> Run:
    return services.create_run(Actor(user), None, project, run_name=name, experiment_id=experiment_id,
                               tags=[{"key": "mado.kind", "value": kind}])


@pytest.fixture
def running_job(world):
    """A Job of bob's claimed by a scripted worker and running: (job, claim item, worker)."""
    worker = JobWorker(world.worker_token, "lab-worker-1")
    assert worker.hello().status_code == 200
    target = gpu_computer(world.global_admin)
    job = job_services.create_job(Actor(world.member), world.project,
                                  job_request(target, name="train-resnet", run_kind="training"))
    item = worker.claim()
    assert item and item["id"] == job.pk
    assert worker.heartbeat(item, status="running").status_code == 200
    return job, item, worker
