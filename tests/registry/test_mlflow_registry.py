"""The model registry with the real MLflow 3 client (mlflow-skinny) against the live server (issue 16):
register_model from a Run's logged model, versions, aliases, stages, search, rename, delete, and who may."""
from __future__ import annotations

import hashlib

import pytest

from mado.models import AuditEvent
from registry.models import ModelVersion, RegisteredModel

WRITER = ["read", "runs:write", "registry:write"]
MLMODEL = b"artifact_path: model\nflavors: {}\n"


def _client():
    from mlflow import MlflowClient

    return MlflowClient()


def _log_model(tmp_path, weights: bytes = b"weights-v1") -> None:
    """What a flavor's log_model leaves in a Run's artifacts: a directory with an MLmodel file."""
    import mlflow

    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "MLmodel").write_bytes(MLMODEL)
    (folder / "weights.bin").write_bytes(weights)
    mlflow.log_artifacts(str(folder), artifact_path="model")


def test_register_model_versions_aliases_search_rename_delete(world, mlflow_env, media, tmp_path):
    import mlflow
    from mlflow.exceptions import MlflowException

    mlflow_env(world.token(world.member, WRITER))
    with mlflow.start_run(run_name="train-a") as run:
        _log_model(tmp_path)
    first = mlflow.register_model(f"runs:/{run.info.run_id}/model", "resnet")
    assert (first.name, first.version, first.status) == ("resnet", "1", "READY")
    assert first.run_id == run.info.run_id
    assert first.source == f"{run.info.artifact_uri}/model"
    second = mlflow.register_model(f"runs:/{run.info.run_id}/model", "resnet")
    assert second.version == "2"

    stored = ModelVersion.objects.get(model__name="resnet", version=1)
    mlmodel, weights = (hashlib.sha256(data).hexdigest() for data in (MLMODEL, b"weights-v1"))
    expected = hashlib.sha256(f"MLmodel {mlmodel}\nweights.bin {weights}\n".encode()).hexdigest()
    assert stored.digest == expected and stored.run_id == run.info.run_id and stored.stored_path

    client = _client()
    client.set_registered_model_alias("resnet", "champion", "1")
    assert client.get_model_version_by_alias("resnet", "champion").version == "1"
    client.set_registered_model_alias("resnet", "champion", "2")
    assert client.get_model_version_by_alias("resnet", "champion").version == "2"
    assert client.get_registered_model("resnet").aliases == {"champion": "2"}
    assert client.get_model_version("resnet", "2").aliases == ["champion"]

    client.transition_model_version_stage("resnet", "1", "Production")
    client.transition_model_version_stage("resnet", "2", "Production", archive_existing_versions=True)
    assert client.get_model_version("resnet", "1").current_stage == "Archived"
    assert [v.version for v in client.get_latest_versions("resnet", stages=["Production"])] == ["2"]

    client.create_registered_model("bert", description="text encoder")
    assert client.get_registered_model("bert").description == "text encoder"
    with pytest.raises(MlflowException) as again:
        client.create_registered_model("bert")
    assert again.value.error_code == "RESOURCE_ALREADY_EXISTS"
    assert [m.name for m in client.search_registered_models()] == ["bert", "resnet"]
    assert [m.name for m in client.search_registered_models(filter_string="name LIKE 'res%'")] == ["resnet"]
    found = client.search_model_versions(f"run_id = '{run.info.run_id}'")
    assert sorted(v.version for v in found) == ["1", "2"]
    assert [v.version for v in client.search_model_versions("name = 'resnet' and version_number > 1")] == ["2"]
    assert mlflow.search_model_versions(filter_string="name = 'bert'") == []

    client.rename_registered_model("resnet", "resnet50")
    assert client.get_model_version("resnet50", "1").run_id == run.info.run_id
    with pytest.raises(MlflowException) as gone:
        client.get_registered_model("resnet")
    assert gone.value.error_code == "RESOURCE_DOES_NOT_EXIST"
    client.delete_registered_model("resnet50")
    assert [m.name for m in client.search_registered_models()] == ["bert"]
    actions = list(AuditEvent.objects.filter(action__startswith="registered_model.").values_list("action", flat=True))
    assert sorted(actions) == ["registered_model.create", "registered_model.create", "registered_model.delete",
                               "registered_model.rename"]


def test_a_read_only_token_reads_but_cannot_register(world, mlflow_env, media, tmp_path):
    import mlflow
    from mlflow.exceptions import MlflowException

    mlflow_env(world.token(world.member, WRITER))
    with mlflow.start_run() as run:
        _log_model(tmp_path)
    mlflow.register_model(f"runs:/{run.info.run_id}/model", "resnet")

    mlflow_env(world.token(world.viewer, ["read"]))
    assert _client().get_registered_model("resnet").latest_versions[0].version == "1"
    for attempt in (lambda: _client().create_registered_model("mine"),
                    lambda: _client().rename_registered_model("resnet", "x"),
                    lambda: _client().set_registered_model_alias("resnet", "prod", "1"),
                    lambda: _client().delete_registered_model("resnet")):
        with pytest.raises(MlflowException) as refused:
            attempt()
        assert refused.value.error_code == "PERMISSION_DENIED"
        assert "registry:write" in refused.value.message
    assert list(RegisteredModel.objects.values_list("name", flat=True)) == ["resnet"]


def test_the_job_token_registers_from_its_own_run_only(world, mlflow_env, media, tmp_path, running_job):
    import mlflow
    from mlflow.exceptions import MlflowException

    job, item, _worker = running_job
    mlflow_env(world.token(world.member, WRITER))
    with mlflow.start_run(run_name="someone-elses") as other:
        _log_model(tmp_path)

    mlflow_env(item["job_token"])
    with mlflow.start_run(run_id=item["run_id"]):
        _log_model(tmp_path, b"job weights")
    version = mlflow.register_model(f"runs:/{item['run_id']}/model", "job-model")
    assert version.version == "1" and version.run_id == item["run_id"]
    with pytest.raises(MlflowException) as refused:
        mlflow.register_model(f"runs:/{other.info.run_id}/model", "job-model")
    assert refused.value.error_code == "PERMISSION_DENIED"
    assert "its own Job's Run" in refused.value.message
    with pytest.raises(MlflowException) as refused:
        _client().delete_registered_model("job-model")
    assert refused.value.error_code == "PERMISSION_DENIED"
    assert ModelVersion.objects.filter(model__name="job-model").count() == 1
