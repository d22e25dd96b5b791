"""What a researcher's script does with the real MLflow 3 client against Mado (issue 16): log to a Run
with a personal token, read it back and find it; a job token is confined to its own Job's Run."""
from __future__ import annotations

import pytest

from tracking.models import Metric, Param, Run


def _client():
    from mlflow import MlflowClient

    return MlflowClient()


def test_a_notebook_logs_a_run_with_a_personal_token_and_finds_it(world, mlflow_env):
    import mlflow
    from mlflow.entities import Metric as MlflowMetric
    from mlflow.entities import Param as MlflowParam
    from mlflow.entities import RunTag

    mlflow_env(world.token(world.member, ["read", "runs:write"]))
    with mlflow.start_run(run_name="laptop-sweep") as run:
        mlflow.log_params({"lr": "0.01", "batch_size": 32})
        mlflow.set_tag("team", "vision")
        for step in range(50):
            mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
        mlflow.log_metrics({"accuracy": 0.91, "f1": 0.88}, step=49)
        _client().log_batch(run.info.run_id, metrics=[MlflowMetric("val_loss", 0.5 - i / 100, 1000 + i, i)
                                                      for i in range(10)],
                            params=[MlflowParam("optimizer", "adam")], tags=[RunTag("stage", "sweep")])
        run_id = run.info.run_id

    fetched = _client().get_run(run_id)
    assert fetched.info.run_name == "laptop-sweep" and fetched.info.status == "FINISHED"
    assert fetched.info.user_id == "bob" and fetched.info.end_time
    assert fetched.info.artifact_uri == f"mlflow-artifacts:/{fetched.info.experiment_id}/{run_id}/artifacts"
    assert fetched.data.params == {"lr": "0.01", "batch_size": "32", "optimizer": "adam"}
    assert fetched.data.tags["team"] == "vision" and fetched.data.tags["stage"] == "sweep"
    assert fetched.data.metrics == {"loss": pytest.approx(1 / 50), "accuracy": 0.91, "f1": 0.88,
                                    "val_loss": pytest.approx(0.41)}

    history = _client().get_metric_history(run_id, "loss")
    assert [m.step for m in history] == list(range(50))
    assert [m.value for m in history] == pytest.approx([1.0 / (s + 1) for s in range(50)])
    assert Metric.objects.filter(run_id=run_id).count() == 50 + 2 + 10

    experiment = fetched.info.experiment_id
    found = _client().search_runs([experiment], filter_string="params.lr = '0.01' and metrics.accuracy > 0.9 "
                                                              "and tags.team = 'vision'")
    assert [r.info.run_id for r in found] == [run_id]
    assert _client().search_runs([experiment], filter_string="metrics.accuracy > 0.95") == []
    assert [r.info.run_id for r in _client().search_runs(
        [experiment], filter_string="attributes.run_name LIKE 'laptop%'", order_by=["metrics.loss ASC"])] == [run_id]


def test_search_orders_by_a_metric_and_pages(world, mlflow_env):
    import mlflow

    mlflow_env(world.token(world.member, ["read", "runs:write"]))
    experiment_id = mlflow.create_experiment("sweep")
    ids = []
    for accuracy in (0.7, 0.9, 0.8):
        with mlflow.start_run(experiment_id=experiment_id) as run:
            mlflow.log_metric("accuracy", accuracy)
            ids.append(run.info.run_id)
    best_first = _client().search_runs([experiment_id], order_by=["metrics.accuracy DESC"], max_results=2)
    assert [r.info.run_id for r in best_first] == [ids[1], ids[2]] and best_first.token
    rest = _client().search_runs([experiment_id], order_by=["metrics.accuracy DESC"], max_results=2,
                                 page_token=best_first.token)
    assert [r.info.run_id for r in rest] == [ids[0]]
    assert mlflow.get_experiment_by_name("sweep").experiment_id == experiment_id
    with pytest.raises(mlflow.exceptions.MlflowException) as error:
        mlflow.create_experiment("sweep")
    assert error.value.error_code == "RESOURCE_ALREADY_EXISTS"


def test_a_parameter_relogged_with_another_value_is_refused(world, mlflow_env):
    import mlflow

    mlflow_env(world.token(world.member, ["read", "runs:write"]))
    with mlflow.start_run() as run:
        mlflow.log_param("depth", 3)
        mlflow.log_param("depth", 3)  # the same value again is fine, as in MLflow
        with pytest.raises(mlflow.exceptions.MlflowException) as error:
            mlflow.log_param("depth", 5)
    assert error.value.error_code == "INVALID_PARAMETER_VALUE"
    assert "Changing param values is not allowed" in error.value.message
    assert list(Param.objects.filter(run_id=run.info.run_id).values_list("key", "value")) == [("depth", "3")]


def test_a_read_only_token_cannot_write(world, mlflow_env):
    import mlflow

    mlflow_env(world.token(world.member, ["read"]))
    with pytest.raises(mlflow.exceptions.MlflowException) as error:
        mlflow.start_run()
    assert error.value.error_code == "PERMISSION_DENIED"
    assert not Run.objects.filter(job=None).exists()


def test_the_job_token_writes_its_own_run_only_and_stops_when_the_job_ends(world, mlflow_env, running_job,
                                                                          monkeypatch):
    import mlflow

    job, item, worker = running_job
    run = Run.objects.get(job=job)
    assert item["run_id"] == run.run_id and item["experiment_id"] == str(run.experiment_id)
    # The job's process started (its running heartbeat), so its Run is RUNNING from the Job's start.
    assert run.name == "train-resnet" and run.kind == "training" and run.status == "RUNNING"
    job.refresh_from_db()
    assert run.start_time == int(job.started_at.timestamp() * 1000)

    # Someone's notebook Run in the same project.
    mlflow_env(world.token(world.member, ["read", "runs:write"]))
    other = _client().create_run(item["experiment_id"]).info.run_id

    # The running code: the environment the worker gives it (worker_agent/jobenv.py).
    mlflow_env(item["job_token"])
    monkeypatch.setenv("MLFLOW_RUN_ID", item["run_id"])
    monkeypatch.setenv("MLFLOW_EXPERIMENT_ID", item["experiment_id"])
    with mlflow.start_run() as active:
        assert active.info.run_id == run.run_id
        mlflow.log_param("epochs", 3)
        mlflow.log_metric("loss", 0.3, step=1)
        with pytest.raises(mlflow.exceptions.MlflowException) as error:
            _client().log_metric(other, "loss", 0.1)
        assert error.value.error_code == "PERMISSION_DENIED"
        assert _client().get_run(other).info.run_id == other  # reads within the project are fine
        with pytest.raises(mlflow.exceptions.MlflowException) as error:
            mlflow.create_experiment("not-mine")
        assert error.value.error_code == "PERMISSION_DENIED"
        mlflow.end_run()  # the code ending its Run does not end the Job
    run.refresh_from_db()
    assert run.status == "FINISHED"
    job.refresh_from_db()
    assert job.status == "running"

    assert worker.complete(item).status_code == 200
    with pytest.raises(mlflow.exceptions.MlflowException) as error:
        _client().log_metric(run.run_id, "loss", 0.2)
    assert error.value.error_code == "UNAUTHENTICATED"
    assert not Metric.objects.filter(run=run, value=0.2).exists()
    assert Metric.objects.filter(run_id=other).count() == 0


def test_artifacts_go_up_list_and_come_back(world, mlflow_env, tmp_path):
    import mlflow

    mlflow_env(world.token(world.member, ["read", "runs:write"]))
    (tmp_path / "model.txt").write_text("weights")
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "loss.csv").write_text("step,loss\n0,1.0\n")
    with mlflow.start_run() as run:
        mlflow.log_artifact(str(tmp_path / "model.txt"))
        mlflow.log_artifacts(str(tmp_path / "plots"), artifact_path="plots")
    listed = _client().list_artifacts(run.info.run_id)
    assert [(f.path, f.is_dir) for f in listed] == [("model.txt", False), ("plots", True)]
    assert [f.path for f in _client().list_artifacts(run.info.run_id, "plots")] == ["plots/loss.csv"]
    back = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="plots/loss.csv",
                                               dst_path=str(tmp_path / "out"))
    assert open(back).read() == "step,loss\n0,1.0\n"

    mlflow_env(world.token(world.viewer, ["read"]))
    with pytest.raises(Exception) as refused:  # the artifact repository raises requests' HTTPError
        _client().log_artifact(run.info.run_id, str(tmp_path / "model.txt"), "again")
    assert "403" in str(refused.value) and "PERMISSION_DENIED" in str(refused.value)
    assert [f.path for f in _client().list_artifacts(run.info.run_id)] == ["model.txt", "plots"]
