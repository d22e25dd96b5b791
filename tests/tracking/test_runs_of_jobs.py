"""Every Job has its Run; the Job's end closes it; the worker hands the Run to MLflow (issue 16)."""
from __future__ import annotations

import pytest

from jobs import services as job_services
from mado.errors import ServiceError
from mado.services import Actor
from tests.job_fixtures import job_request
from tracking.models import Run
from worker_agent import jobenv


def test_a_job_gets_one_run_named_after_it_in_the_default_experiment(world, gpu_box):
    job = job_services.create_job(Actor(world.member), world.project, job_request(gpu_box, name="prep-data"))
    run = Run.objects.get(job=job)
    assert (run.name, run.kind, run.status, run.created_by) == ("prep-data", "other", "SCHEDULED", world.member)
    assert run.experiment.is_default and run.experiment.project == world.project
    second = job_services.create_job(Actor(world.member), world.project, job_request(gpu_box))
    assert Run.objects.get(job=second).experiment == run.experiment


def test_an_unknown_run_kind_refuses_the_job(world, gpu_box):
    with pytest.raises(ServiceError) as error:
        job_services.create_job(Actor(world.member), world.project, job_request(gpu_box, run_kind="baking"))
    assert "run_kind" in error.value.fields
    assert not Run.objects.exists()


@pytest.mark.parametrize(("ending", "run_status"), [("finished", "FINISHED"), ("failed", "FAILED"),
                                                    ("canceled", "KILLED")])
def test_the_jobs_end_ends_its_run(world, gpu_box, job_worker, ending, run_status):
    job = job_services.create_job(Actor(world.member), world.project, job_request(gpu_box))
    item = job_worker.claim()
    assert job_worker.heartbeat(item, status="running").status_code == 200
    assert job_worker.complete(item, status=ending, exit_code=0 if ending == "finished" else 1).status_code == 200
    run = Run.objects.get(job=job)
    job.refresh_from_db()
    assert run.status == run_status and run.end_time == int(job.finished_at.timestamp() * 1000)


def test_a_queued_job_stopped_kills_its_run(world, gpu_box):
    job = job_services.create_job(Actor(world.member), world.project, job_request(gpu_box))
    job_services.request_stop(Actor(world.member), job)
    assert Run.objects.get(job=job).status == "KILLED"


def test_the_worker_points_mlflow_at_the_jobs_run():
    item = {"id": 7, "job_token": "mado_mtj_x", "api_url": "https://mado.example", "project_id": 1,
            "run_id": "0123456789abcdef0123456789abcdef", "experiment_id": "3"}
    env = jobenv.job_environment(item, jobenv.host_locations("/w/.mmt/jobs/7"))
    assert env["MLFLOW_RUN_ID"] == env["MMT_RUN_ID"] == "0123456789abcdef0123456789abcdef"
    assert env["MLFLOW_EXPERIMENT_ID"] == "3" and env["MMT_JOB_ID"] == "7"
    assert env["MLFLOW_TRACKING_URI"] == "https://mado.example/mlflow"
    assert env["MLFLOW_TRACKING_TOKEN"] == "mado_mtj_x"
