"""Downloading registered versions with the real MLflow client (issue 16): the weights a training job
declared in result.json `models` come down with mlflow.artifacts.download_artifacts("models:/<name>/<version>"),
as do versions registered from a Run's artifacts. (Before, the version's download URI named a single file
under the Run's artifacts where nothing was stored, so the client got an empty folder.)"""
from __future__ import annotations

from pathlib import Path

from registry.models import LoggedModel, ModelVersion
from tests.registry.test_job_models import WEIGHTS, deliver, registry_worker, submit  # noqa: F401  (fixture)

READER = ["read"]


def _download(uri: str, target: Path) -> dict[str, bytes]:
    import mlflow

    target.mkdir()
    folder = Path(mlflow.artifacts.download_artifacts(uri, dst_path=str(target)))
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_jobs_declared_weights_download_through_mlflow(world, gpu_box, registry_worker, mlflow_env, tmp_path):
    from mlflow import MlflowClient

    item = submit(world, gpu_box, registry_worker, run_kind="training")
    deliver(registry_worker, item, [{"path": "model/weights.bin", "modelId": "resnet"}])
    assert registry_worker.complete(item).status_code == 200
    version = ModelVersion.objects.get(model__name="resnet", version=1)
    assert version.logged_model is not None and version.logged_model.source_run_id == version.run_id

    mlflow_env(world.token(world.viewer, READER))
    assert _download("models:/resnet/1", tmp_path / "one") == {"weights.bin": WEIGHTS}
    client = MlflowClient()
    assert client.get_model_version_download_uri("resnet", "1") == version.logged_model.artifact_uri
    assert _download(f"models:/{version.logged_model_id}", tmp_path / "by-id") == {"weights.bin": WEIGHTS}

    # A version registered before logged models existed gets its folder on the first download.
    LoggedModel.objects.all().delete()
    version.refresh_from_db()
    assert version.logged_model is None
    assert _download("models:/resnet/1", tmp_path / "older") == {"weights.bin": WEIGHTS}
    assert LoggedModel.objects.count() == 1, "made once"
    assert _download("models:/resnet/1", tmp_path / "again") == {"weights.bin": WEIGHTS}
    assert LoggedModel.objects.count() == 1


def test_a_version_from_a_runs_artifacts_downloads_its_folder(world, mlflow_env, media, tmp_path):
    import mlflow

    mlflow_env(world.token(world.member, ["read", "runs:write", "registry:write"]))
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "MLmodel").write_bytes(b"artifact_path: model\nflavors: {}\n")
    (folder / "weights.bin").write_bytes(b"w" * 100)
    with mlflow.start_run() as run:
        mlflow.log_artifacts(str(folder), artifact_path="model")
    mlflow.register_model(f"runs:/{run.info.run_id}/model", "from-run")
    mlflow_env(world.token(world.viewer, READER))
    assert _download("models:/from-run/1", tmp_path / "got") == {"MLmodel": (folder / "MLmodel").read_bytes(),
                                                                 "weights.bin": b"w" * 100}
