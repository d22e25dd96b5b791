"""Experiments after creation with the real MLflow client (issue 16): rename, delete (with its Runs, hidden
from searches by default), restore; the project's Default experiment (MLflow's "0") cannot be deleted."""
from __future__ import annotations

import pytest

from mado.models import AuditEvent
from tracking.models import Experiment, Run

WRITER = ["read", "runs:write"]


def test_rename_delete_and_restore_an_experiment(world, mlflow_env):
    import mlflow
    from mlflow import MlflowClient
    from mlflow.entities import ViewType
    from mlflow.exceptions import MlflowException

    mlflow_env(world.token(world.member, WRITER))
    client = MlflowClient()
    experiment_id = client.create_experiment("vision")
    with mlflow.start_run(experiment_id=experiment_id) as kept:
        pass
    with mlflow.start_run(experiment_id=experiment_id) as dropped:
        pass
    client.delete_run(dropped.info.run_id)  # deleted on its own, before the experiment

    client.rename_experiment(experiment_id, "vision-v2")
    assert client.get_experiment(experiment_id).name == "vision-v2"
    assert client.get_experiment_by_name("vision") is None
    client.create_experiment("taken")
    with pytest.raises(MlflowException) as taken:
        client.rename_experiment(experiment_id, "taken")
    assert taken.value.error_code == "RESOURCE_ALREADY_EXISTS"

    client.delete_experiment(experiment_id)
    assert client.get_experiment(experiment_id).lifecycle_stage == "deleted"
    names = [e.name for e in client.search_experiments()]
    assert "vision-v2" not in names and "taken" in names
    assert [e.name for e in client.search_experiments(view_type=ViewType.DELETED_ONLY)] == ["vision-v2"]
    assert "vision-v2" in [e.name for e in client.search_experiments(view_type=ViewType.ALL)]
    assert client.get_run(kept.info.run_id).info.lifecycle_stage == "deleted"
    assert client.search_runs([experiment_id]) == []
    for attempt in (lambda: client.create_run(experiment_id),
                    lambda: client.rename_experiment(experiment_id, "renamed-while-deleted")):
        with pytest.raises(MlflowException) as refused:
            attempt()
        assert refused.value.error_code in ("INVALID_PARAMETER_VALUE", "INVALID_STATE")
        assert "active" in refused.value.message
    with pytest.raises(MlflowException) as reused:
        client.create_experiment("vision-v2")
    assert reused.value.error_code == "RESOURCE_ALREADY_EXISTS"

    client.restore_experiment(experiment_id)
    assert client.get_experiment(experiment_id).lifecycle_stage == "active"
    assert client.get_run(kept.info.run_id).info.lifecycle_stage == "active"
    assert client.get_run(dropped.info.run_id).info.lifecycle_stage == "deleted", "deleted before: stays deleted"
    assert [r.info.run_id for r in client.search_runs([experiment_id])] == [kept.info.run_id]
    actions = list(AuditEvent.objects.filter(action__startswith="experiment.").values_list("action", flat=True))
    assert {"experiment.rename", "experiment.delete", "experiment.restore"} <= set(actions)


def test_the_default_experiment_cannot_be_deleted(world, mlflow_env):
    import mlflow
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    mlflow_env(world.token(world.member, WRITER))
    client = MlflowClient()
    with mlflow.start_run():
        pass
    default = Experiment.objects.get(project=world.project, is_default=True)
    for experiment_id in ("0", str(default.pk)):
        with pytest.raises(MlflowException) as refused:
            client.delete_experiment(experiment_id)
        assert refused.value.error_code == "INVALID_PARAMETER_VALUE"
        assert "Cannot delete the default experiment" in refused.value.message
    default.refresh_from_db()
    assert default.lifecycle_stage == "active" and Run.objects.filter(lifecycle_stage="active").count() == 1
    client.rename_experiment("0", "Everything")  # renaming it is fine: Jobs' Runs still go there
    assert client.get_experiment("0").name == "Everything"


def test_who_may_change_experiments(world, mlflow_env, running_job):
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    _job, item, _worker = running_job
    mlflow_env(world.token(world.member, WRITER))
    experiment_id = MlflowClient().create_experiment("guarded")
    for token in (item["job_token"], world.token(world.member, ["read"]), world.token(world.viewer, ["read"])):
        mlflow_env(token)
        client = MlflowClient()
        for attempt in (lambda: client.rename_experiment(experiment_id, "mine"),
                        lambda: client.delete_experiment(experiment_id)):
            with pytest.raises(MlflowException) as refused:
                attempt()
            assert refused.value.error_code == "PERMISSION_DENIED", refused.value.message
    assert Experiment.objects.get(pk=experiment_id).name == "guarded"
    assert Experiment.objects.get(pk=experiment_id).lifecycle_stage == "active"
    mlflow_env(world.token(world.member, WRITER))
    client = MlflowClient()
    for attempt, words in ((lambda: client.restore_experiment(experiment_id), "not deleted"),
                           (lambda: client.rename_experiment(experiment_id, ""), "new_name"),
                           (lambda: client.delete_experiment("123456789"), "123456789")):
        with pytest.raises(MlflowException) as refused:
            attempt()
        assert words in refused.value.message
