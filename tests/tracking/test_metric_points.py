"""Metric points as MLflow's own server keeps them (issue 16): a point sent again is stored once, NaN
included; the project's default experiment is "Default", as MLflow clients expect; and a Job's metrics
(result.json `metrics`, points the running code posts to the jobs API) are its Run's."""
from __future__ import annotations

import hashlib
import json
import math
import uuid

import pytest

from tests.conftest import bearer
from tracking.models import Experiment, LatestMetric, Metric, Run


def _client():
    from mlflow import MlflowClient

    return MlflowClient()


def test_a_batch_sent_again_after_a_lost_answer_is_stored_once(world, mlflow_env):
    from mlflow.entities import Metric as MlflowMetric

    mlflow_env(world.token(world.member, ["read", "runs:write"]))
    run_id = _client().create_run("0", run_name="resent").info.run_id
    batch = [MlflowMetric("loss", 1.0 / (step + 1), 1_000 + step, step) for step in range(200)]
    batch += [MlflowMetric("loss", float("nan"), 5_000, 200), MlflowMetric("loss", 0.0, 5_000, 200)]
    _client().log_batch(run_id, metrics=batch)
    _client().log_batch(run_id, metrics=batch)  # the same batch again: its answer was lost on the way
    _client().log_metric(run_id, "loss", 0.0, timestamp=5_000, step=200)  # and one point of it once more

    history = _client().get_metric_history(run_id, "loss")
    assert len(history) == 202
    assert [(m.step, m.timestamp) for m in history[:200]] == [(s, 1_000 + s) for s in range(200)]
    last = sorted((m.value for m in history[200:]), key=lambda v: (not math.isnan(v), v))
    assert math.isnan(last[0]) and last[1] == 0.0, "NaN and 0.0 at the same step and time are two points"
    # The latest value is MLflow's: largest step, then timestamp, then value (NaN counts as 0 there).
    latest = _client().get_run(run_id).data.metrics["loss"]
    assert latest == 0.0 or math.isnan(latest)
    assert Metric.objects.filter(run_id=run_id).count() == 202

    # A different value at the same step and time is another point, as in MLflow.
    _client().log_metric(run_id, "loss", 0.25, timestamp=5_000, step=200)
    assert len(_client().get_metric_history(run_id, "loss")) == 203


def test_nan_is_kept_as_nan_and_a_later_finite_point_becomes_the_latest(world, mlflow_env):
    mlflow_env(world.token(world.member, ["read", "runs:write"]))
    run_id = _client().create_run("0").info.run_id
    _client().log_metric(run_id, "grad_norm", float("nan"), timestamp=10, step=0)
    _client().log_metric(run_id, "grad_norm", float("nan"), timestamp=10, step=0)
    assert math.isnan(_client().get_run(run_id).data.metrics["grad_norm"])
    _client().log_metric(run_id, "grad_norm", 3.5, timestamp=20, step=1)
    assert [m.step for m in _client().get_metric_history(run_id, "grad_norm")] == [0, 1]
    assert _client().get_run(run_id).data.metrics["grad_norm"] == 3.5
    found = _client().search_runs(["0"], filter_string="metrics.grad_norm > 3")
    assert [r.info.run_id for r in found] == [run_id]
    assert LatestMetric.objects.get(run_id=run_id, key="grad_norm").value == 3.5


def test_the_projects_default_experiment_is_named_default(world, mlflow_env, monkeypatch):
    import mlflow

    import mado_tracking

    mlflow_env(world.token(world.member, ["read", "runs:write"]))
    default = mlflow.get_experiment_by_name("Default")
    assert default is not None and default.name == "Default"
    assert mlflow.get_experiment("0").experiment_id == default.experiment_id
    assert Experiment.objects.get(project=world.project, is_default=True).pk == int(default.experiment_id)

    with mlflow.start_run() as run:  # no experiment: MLflow's default experiment, "0"
        pass
    assert run.info.experiment_id == default.experiment_id
    with mado_tracking.start_run() as sdk_run:  # no experiment, outside a job
        mado_tracking.log_metric("loss", 0.5)
    assert sdk_run.experiment_id == default.experiment_id
    assert Run.objects.get(pk=sdk_run.run_id).experiment_id == int(default.experiment_id)
    assert [r.info.run_id for r in mlflow.search_runs(experiment_names=["Default"], output_format="list")] == [
        sdk_run.run_id, run.info.run_id]
    assert Experiment.objects.filter(project=world.project).count() == 1


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_jobs_result_json_metrics_and_posted_points_are_its_runs(world, mlflow_env, running_job, settings,
                                                                   tmp_path):
    settings.MEDIA_ROOT = tmp_path
    job, item, worker = running_job
    # The running code posts points to the jobs API with its job token ...
    posted = bearer(item["job_token"]).post(
        f"/api/jobs/{job.pk}/metrics", {"metrics": [{"name": "train.loss", "value": 0.8, "step": 1,
                                                     "timestamp": "2026-01-02T03:04:05Z"}]}, format="json")
    assert posted.status_code == 200, posted.content
    # ... and result.json declares more when it ends.
    report = b"accuracy 0.93\n"
    result = {"version": 2, "complete": True,
              "artifacts": [{"path": "report.txt", "sha256": _sha(report), "size": len(report)}],
              "metrics": [{"name": "eval.accuracy", "value": 0.93, "step": 10},
                          {"name": "eval.accuracy", "value": 0.95, "step": 20, "timestamp": "2026-01-02T04:00:00Z"},
                          {"name": "train.loss", "value": 0.4, "step": 2}]}
    files = [{"path": "report.txt", "size": len(report), "sha256": _sha(report), "kind": "file"},
             {"path": "result.json", "size": 10, "sha256": "0" * 64, "kind": "file"}]
    answer = worker.leased(item, "outputs", result=json.dumps(result), files=files, manifest=None)
    assert answer.status_code == 200, answer.content
    assert worker.leased(item, "outputs", result=json.dumps(result), files=files).status_code == 200  # resent

    mlflow_env(world.token(world.viewer, ["read"]))
    run_id = Run.objects.get(job=job).run_id
    accuracy = _client().get_metric_history(run_id, "eval.accuracy")
    assert [(m.step, m.value) for m in accuracy] == [(10, 0.93), (20, 0.95)]
    assert accuracy[1].timestamp == 1767326400000  # 2026-01-02T04:00:00Z in milliseconds
    loss = _client().get_metric_history(run_id, "train.loss")
    assert [(m.step, m.value, m.timestamp) for m in loss] == [(1, 0.8, 1767323045000), (2, 0.4, loss[1].timestamp)]
    assert _client().get_run(run_id).data.metrics == {"eval.accuracy": 0.95, "train.loss": 0.4}
    # The jobs API still answers them as before.
    listed = bearer(world.token(world.viewer, ["read"])).get(f"/api/jobs/{job.pk}/metrics").json()["items"]
    assert sorted((m["name"], m["step"]) for m in listed) == [("eval.accuracy", 10), ("eval.accuracy", 20),
                                                             ("train.loss", 1), ("train.loss", 2)]


@pytest.mark.parametrize("name", ["loss@top-1", "ÄCC (val)"])
def test_a_job_metric_named_outside_mlflows_characters_is_still_readable(world, mlflow_env, running_job, name):
    job, item, _worker = running_job
    assert bearer(item["job_token"]).post(f"/api/jobs/{job.pk}/metrics",
                                          {"metrics": [{"name": name, "value": 1.5, "step": 0}]},
                                          format="json").status_code == 200
    mlflow_env(world.token(world.viewer, ["read"]))
    run_id = Run.objects.get(job=job).run_id
    assert [m.value for m in _client().get_metric_history(run_id, name)] == [1.5]
    assert _client().get_metric_history(run_id, f"unknown-{uuid.uuid4().hex[:6]}") == []
