"""The real MLflow 3 client (mlflow-skinny) against the live server's /mlflow/ endpoint."""
from __future__ import annotations

import pytest

from jobs import services as job_services
from mado.services import Actor
from tests.job_fixtures import JobWorker, gpu_computer, job_request
from tests.support import mlflow_sessions_closed


@pytest.fixture
def mlflow_env(live_server, monkeypatch):
    """Points the MLflow client at the live server; returns a function that sets the token it sends.
    Retries are off, so an error answer reaches the test at once instead of after minutes of backoff."""
    import mlflow

    uri = live_server.url + "/mlflow"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    mlflow.set_tracking_uri(uri)

    def use(token: str):
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", token)

    with mlflow_sessions_closed():
        yield use
        while mlflow.active_run():
            mlflow.end_run()


@pytest.fixture
def running_job(world):
    """A Job of bob's, claimed by a scripted worker: (job, claim item with job_token and run_id, worker)."""
    worker = JobWorker(world.worker_token, "lab-worker-1")
    assert worker.hello().status_code == 200
    target = gpu_computer(world.global_admin)
    job = job_services.create_job(Actor(world.member), world.project,
                                  job_request(target, name="train-resnet", run_kind="training"))
    item = worker.claim()
    assert item and item["id"] == job.pk
    assert worker.heartbeat(item, status="running").status_code == 200
    return job, item, worker
