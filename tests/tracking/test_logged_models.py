"""MLflow 3 logged models with the real MLflow client (mlflow-skinny) against the live server (issue 16):
what log_model does step by step (create, upload the files to the model's artifact_uri, outputs, finalize),
params and tags, search, register_model from models:/<model_id> and from runs:/<run_id>/<name>, and
downloading the registered version's files; a job token writes only its own Run's logged models.

mlflow.pyfunc.log_model itself needs numpy and pandas, which mlflow-skinny does not bring; these tests make
the same REST calls through MlflowClient, as log_model does."""
from __future__ import annotations

from pathlib import Path

import pytest

from mado.models import AuditEvent
from registry.models import LoggedModel, ModelVersion

WRITER = ["read", "runs:write", "registry:write"]
MLMODEL = b"artifact_path: model\nflavors:\n  python_function: {}\n"
WEIGHTS = b"\x00tiny weights\x01" * 50


@pytest.fixture
def media(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT


def _model_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    (folder / "data").mkdir(parents=True, exist_ok=True)
    (folder / "MLmodel").write_bytes(MLMODEL)
    (folder / "data" / "weights.bin").write_bytes(WEIGHTS)
    return folder


def _files(folder) -> dict[str, bytes]:
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _log_model_like_mlflow(client, run, tmp_path, name="model"):
    """What Model.log does in MLflow 3 (mlflow/models/model.py): create, log_outputs, upload, finalize."""
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus

    model = client.create_logged_model(run.info.experiment_id, name=name, source_run_id=run.info.run_id,
                                       params={"lr": "0.01"}, tags={"mlflow.source.type": "LOCAL"},
                                       model_type="classifier")
    client.log_outputs(run.info.run_id, [LoggedModelOutput(model.model_id, step=3)])
    client.log_model_artifacts(model.model_id, str(_model_folder(tmp_path)))
    return client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)


def test_log_a_model_register_it_and_download_its_files(world, mlflow_env, media, tmp_path):
    import mlflow
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    mlflow_env(world.token(world.member, WRITER))
    client = MlflowClient()
    with mlflow.start_run(run_name="train") as run:
        logged = _log_model_like_mlflow(client, run, tmp_path)
    assert logged.model_id.startswith("m-") and logged.status.to_proto() == 2  # READY
    assert logged.artifact_location == f"mlflow-artifacts:/{run.info.experiment_id}/models/{logged.model_id}/artifacts"
    assert (logged.name, logged.source_run_id, logged.model_type) == ("model", run.info.run_id, "classifier")
    assert logged.params == {"lr": "0.01"} and logged.tags["mlflow.source.type"] == "LOCAL"
    assert LoggedModel.objects.get(pk=logged.model_id).output_step == 3

    mlflow.log_model_params({"epochs": "5"}, model_id=logged.model_id)
    client.set_logged_model_tags(logged.model_id, {"team": "vision"})
    client.delete_logged_model_tag(logged.model_id, "mlflow.source.type")
    again = mlflow.get_logged_model(logged.model_id)
    assert again.params == {"lr": "0.01", "epochs": "5"} and again.tags == {"team": "vision"}
    listed = client.list_logged_model_artifacts(logged.model_id)
    assert sorted((f.path, f.is_dir) for f in listed) == [("MLmodel", False), ("data", True)]

    found = mlflow.search_logged_models(experiment_ids=[run.info.experiment_id], filter_string="name = 'model'",
                                        output_format="list")
    assert [m.model_id for m in found] == [logged.model_id]
    assert mlflow.search_logged_models(experiment_ids=[run.info.experiment_id], output_format="list",
                                       filter_string="tags.team = 'other'") == []
    assert [m.model_id for m in client.search_logged_models(
        experiment_ids=["0"], filter_string="params.epochs = '5'")] == [logged.model_id]

    first = mlflow.register_model(f"models:/{logged.model_id}", "tiny-classifier")
    assert (first.version, first.run_id, first.source) == ("1", run.info.run_id, f"models:/{logged.model_id}")
    # runs:/<run>/<name>: the Run has no artifacts there, so MLflow 3 looks the logged model up by name
    second = mlflow.register_model(f"runs:/{run.info.run_id}/model", "tiny-classifier")
    assert (second.version, second.source) == ("2", f"models:/{logged.model_id}")
    stored = ModelVersion.objects.filter(model__name="tiny-classifier")  # the client drops model_id from answers
    assert {v.logged_model_id for v in stored} == {logged.model_id} and all(v.digest for v in stored)

    expected = _files(_model_folder(tmp_path))
    for uri in ("models:/tiny-classifier/1", "models:/tiny-classifier/2", f"models:/{logged.model_id}"):
        target = tmp_path / uri.replace(":", "").replace("/", "_")
        target.mkdir()
        assert _files(mlflow.artifacts.download_artifacts(uri, dst_path=str(target))) == expected, uri

    client.delete_logged_model(logged.model_id)
    with pytest.raises(MlflowException) as gone:
        client.get_logged_model(logged.model_id)
    assert gone.value.error_code == "RESOURCE_DOES_NOT_EXIST"
    assert client.search_logged_models(experiment_ids=[run.info.experiment_id]) == []
    target = tmp_path / "after-delete"
    target.mkdir()
    assert _files(mlflow.artifacts.download_artifacts("models:/tiny-classifier/1", dst_path=str(target))) == expected
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"logged_model.create", "logged_model.delete", "model_version.create"} <= actions


def test_a_job_token_logs_models_only_for_its_own_run(world, mlflow_env, media, running_job, tmp_path):
    import mlflow
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    _job, item, _worker = running_job
    mlflow_env(world.token(world.member, WRITER))
    with mlflow.start_run(run_name="someone-elses") as other:
        pass
    others = MlflowClient().create_logged_model(other.info.experiment_id, name="theirs",
                                                source_run_id=other.info.run_id)

    mlflow_env(item["job_token"])
    client = MlflowClient()
    run = client.get_run(item["run_id"])
    mine = _log_model_like_mlflow(client, run, tmp_path)
    assert mine.source_run_id == item["run_id"]
    version = mlflow.register_model(f"models:/{mine.model_id}", "job-model")
    assert ModelVersion.objects.get(model__name="job-model", version=int(version.version)).logged_model_id == \
        mine.model_id

    for attempt in (lambda: client.create_logged_model(other.info.experiment_id, source_run_id=other.info.run_id),
                    lambda: client.create_logged_model(other.info.experiment_id, name="no-run"),
                    lambda: client.set_logged_model_tags(others.model_id, {"k": "v"}),
                    lambda: client.delete_logged_model(others.model_id)):
        with pytest.raises(MlflowException) as refused:
            attempt()
        assert refused.value.error_code == "PERMISSION_DENIED", refused.value.message
    with pytest.raises(Exception, match="PERMISSION_DENIED"):  # the upload's HTTP error, as MLflow raises it
        client.log_model_artifacts(others.model_id, str(_model_folder(tmp_path)))
    assert LoggedModel.objects.filter(name="no-run").count() == 0
    assert not (media / "mlflow-artifacts" / str(world.project.pk) / "models" / others.model_id).exists()
    assert client.get_logged_model(others.model_id).name == "theirs", "a job token still reads its project"


def test_bad_logged_model_calls_answer_what_to_fix(world, mlflow_env, media):
    import mlflow
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    mlflow_env(world.token(world.member, WRITER))
    client = MlflowClient()
    with mlflow.start_run() as run:
        pass
    model = client.create_logged_model(run.info.experiment_id)
    assert model.name and model.status.to_proto() == 1  # a generated name, PENDING
    initialized = mlflow.initialize_logged_model(name="init", source_run_id=run.info.run_id,
                                                 experiment_id=run.info.experiment_id)
    assert (initialized.name, initialized.source_run_id) == ("init", run.info.run_id)
    cases = [
        (lambda: client.get_logged_model("m-" + "0" * 32), "RESOURCE_DOES_NOT_EXIST", "not found"),
        (lambda: client.create_logged_model("12345678"), "RESOURCE_DOES_NOT_EXIST", "12345678"),
        (lambda: client.create_logged_model("x"), "INVALID_PARAMETER_VALUE", "Experiment ID"),
        (lambda: client.create_logged_model(run.info.experiment_id, source_run_id="f" * 32),
         "RESOURCE_DOES_NOT_EXIST", "not found"),
        (lambda: client.delete_logged_model_tag(model.model_id, "absent"), "RESOURCE_DOES_NOT_EXIST", "absent"),
        (lambda: client.search_logged_models(experiment_ids=[run.info.experiment_id], filter_string="size > 3"),
         "INVALID_PARAMETER_VALUE", "cannot filter on 'size'"),
        (lambda: client.search_logged_models(experiment_ids=[run.info.experiment_id],
                                             order_by=[{"field_name": "metrics.acc"}]),
         "INVALID_PARAMETER_VALUE", "order logged models by"),
        (lambda: mlflow.register_model("models:/m-" + "1" * 32, "nothing"), "RESOURCE_DOES_NOT_EXIST", "not found"),
    ]
    for call, code, words in cases:
        with pytest.raises(MlflowException) as error:
            call()
        assert error.value.error_code == code and words in error.value.message, error.value.message


def test_raw_logged_model_requests_get_mlflow_errors(world, live_server, media):
    import requests

    token = world.token(world.member, WRITER)
    base = live_server.url + "/mlflow/api/2.0/mlflow/logged-models"
    headers = {"Authorization": f"Bearer {token}"}
    created = requests.post(base, json={"experiment_id": "0", "name": "raw"}, headers=headers, timeout=30)
    assert created.status_code == 200, created.text
    model_id = created.json()["model"]["info"]["model_id"]
    for method, url, body, status, code in [
        ("PATCH", f"{base}/{model_id}", {"status": "DONE"}, 400, "INVALID_PARAMETER_VALUE"),
        ("PATCH", f"{base}/{model_id}", {}, 400, "INVALID_PARAMETER_VALUE"),
        ("POST", base, {"experiment_id": "0", "params": "lr=1"}, 400, "INVALID_PARAMETER_VALUE"),
        ("POST", base, {"experiment_id": "0", "tags": [{"key": "../x", "value": "1"}]}, 400,
         "INVALID_PARAMETER_VALUE"),
        ("POST", base, {}, 400, "INVALID_PARAMETER_VALUE"),
        ("POST", f"{base}/search", {"experiment_ids": ["0"], "order_by": ["name"]}, 400, "INVALID_PARAMETER_VALUE"),
        ("PUT", f"{base}/{model_id}", {}, 405, "ENDPOINT_NOT_FOUND"),
        ("POST", live_server.url + "/mlflow/api/2.0/mlflow/runs/outputs",
         {"run_id": "a" * 32, "models": [{"model_id": model_id}]}, 404, "RESOURCE_DOES_NOT_EXIST"),
    ]:
        answer = requests.request(method, url, json=body, headers=headers, timeout=30)
        assert (answer.status_code, answer.json()["error_code"]) == (status, code), (method, url, body, answer.text)
        assert answer.json()["message"]
    reader = {"Authorization": f"Bearer {world.token(world.member, ['read'])}"}
    refused = requests.patch(f"{base}/{model_id}", json={"status": "LOGGED_MODEL_READY"}, headers=reader, timeout=30)
    assert refused.status_code == 403 and refused.json()["error_code"] == "PERMISSION_DENIED"
    assert LoggedModel.objects.get(pk=model_id).status == "LOGGED_MODEL_PENDING"
