"""Seed 001, "Running code gets a Job-scoped token" (issue 16, the first "Done when"): a real job on the
Local computer and on a real sshd computer runs a script that uses only `mlflow`, installed from PyPI by
the job's `requirements` as a user would, with nothing but what the worker puts in its environment
(MLFLOW_TRACKING_URI, MLFLOW_TRACKING_TOKEN = the job token, MLFLOW_RUN_ID, MLFLOW_EXPERIMENT_ID).
A "laptop" with a personal token then finds exactly what the script recorded through the MLflow client,
the job API says the job finished, and the job's token no longer works."""
from __future__ import annotations


import pytest
import requests

from jobs import services as job_services
from mado.services import Actor
from tests.agent_e2e_jobs.conftest import local_computer_at
from tests.support import mlflow_sessions_closed

MLFLOW_REQUIREMENT = "mlflow-skinny==3.18.0\n"
INSTALL_TIMEOUT = 900.0  # the job's venv installs mlflow-skinny and its dependencies from PyPI

# The researcher's script: nothing of Mado's, only mlflow and what the job's environment says.
TRAIN = '''\
import os, sys, tempfile
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")  # fail in seconds, not after minutes of backoff
import mlflow

with open(os.path.join(os.environ["MARKS"], "token-" + os.environ["MARK"]), "w") as f:
    f.write(os.environ["MLFLOW_TRACKING_TOKEN"])  # what a leaked token would be: the test tries it later
given = os.environ["MLFLOW_RUN_ID"]  # start_run() takes it out of the environment once it continues the Run
run = mlflow.start_run()
assert run.info.run_id == given == os.environ["MMT_RUN_ID"], (run.info.run_id, given)
assert run.info.experiment_id == os.environ["MLFLOW_EXPERIMENT_ID"], run.info.experiment_id
mlflow.log_params({"lr": "0.01", "optimizer": "adamw"})
mlflow.set_tag("dataset", "cifar10-small")
for step in range(50):
    mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
mlflow.log_metrics({"accuracy": 0.875, "f1": 0.5}, step=50)
folder = tempfile.mkdtemp()
with open(os.path.join(folder, "summary.txt"), "w") as f:
    f.write("loss went from 1.0 to 0.02\\n")
mlflow.log_artifact(os.path.join(folder, "summary.txt"))
fetched = mlflow.get_run(run.info.run_id)
assert fetched.data.params == {"lr": "0.01", "optimizer": "adamw"}, fetched.data.params
# The worker adds the job's system metrics (system/..., as MLflow's own system metrics logging names them).
logged = {k: v for k, v in fetched.data.metrics.items() if not k.startswith("system/")}
assert logged == {"loss": 0.02, "accuracy": 0.875, "f1": 0.5}, fetched.data.metrics
print("recorded run", run.info.run_id, "in experiment", run.info.experiment_id)
mlflow.end_run()
'''


@pytest.fixture
def local_computer(e2e, tmp_path):
    """A Local computer (development only): the worker runs its jobs as its own user, here."""
    working_dir = tmp_path / "local-work"
    working_dir.mkdir()
    return local_computer_at(e2e, working_dir)


def _run_mlflow_job(e2e, computer, mark: str):
    script = e2e.script("train_mlflow.py", TRAIN)
    body = {"computer": computer.pk, "runtime": "python", "name": f"mlflow-{mark}",
            "command": ["python", str(script)], "requirements": MLFLOW_REQUIREMENT, "run_kind": "training",
            "env": {"MARKS": str(e2e.marks), "MARK": mark}}
    job = job_services.create_job(Actor(e2e.world.member), e2e.world.project, body)
    return e2e.wait_ended(job, timeout=INSTALL_TIMEOUT)


@pytest.fixture
def laptop(e2e):
    """The MLflow client of the test process keeps its HTTP sessions (and so the live server its database
    connections) open; close them before e2e's teardown checks that no session is left."""
    with mlflow_sessions_closed():
        yield


@pytest.mark.parametrize("where", ["local", "ssh"])
def test_a_script_using_only_mlflow_records_to_its_jobs_run(e2e, laptop, local_computer, where, monkeypatch,
                                                            tmp_path, settings):
    import mlflow
    from mlflow import MlflowClient

    settings.PUBLIC_URL = e2e.url  # the address the job's code reaches the API (and /mlflow) at
    e2e.start_worker(MADO_DEV_MODE="true", MMT_ALLOW_LOCAL_EXECUTOR="true")
    computer = local_computer if where == "local" else e2e.computer
    job = _run_mlflow_job(e2e, computer, where)
    stdout, stderr = e2e.stream(job, "stdout"), e2e.stream(job, "stderr")
    assert "recorded run" in stdout, f"{job.status} {job.error}\nstderr: {stderr[-3000:]}\nstdout: {stdout[-500:]}"
    job_token = (e2e.marks / f"token-{where}").read_text()
    assert job_token.startswith("mado_mtj_")

    # The laptop: a personal read token and the MLflow client, nothing else.
    laptop = e2e.world.token(e2e.world.member, ["read"])
    uri = e2e.url + "/mlflow"
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", laptop)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    mlflow.set_tracking_uri(uri)
    experiments = mlflow.search_experiments()
    found = mlflow.search_runs(experiment_ids=[e.experiment_id for e in experiments],
                               filter_string=f"tags.mlflow.runName = 'mlflow-{where}'", output_format="list")
    assert len(found) == 1, found
    run = found[0]
    assert f"recorded run {run.info.run_id} in experiment {run.info.experiment_id}" in stdout
    assert run.info.status == "FINISHED" and run.info.end_time
    assert run.data.params == {"lr": "0.01", "optimizer": "adamw"}
    user_tags = {k: v for k, v in run.data.tags.items() if not k.startswith(("mlflow.", "mado."))}
    assert user_tags == {"dataset": "cifar10-small"}
    # Exactly the script's metrics, beside the system metrics the worker samples (system/cpu/..., system/memory/...).
    assert {k: v for k, v in run.data.metrics.items() if not k.startswith("system/")} == \
        {"loss": 0.02, "accuracy": 0.875, "f1": 0.5}
    assert set(run.data.metrics) - {"loss", "accuracy", "f1"} <= {"system/cpu/utilization", "system/memory/rss_bytes"}
    client = MlflowClient(uri)
    history = sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in history] == [(step, 1.0 / (step + 1)) for step in range(50)]
    for key, value in (("accuracy", 0.875), ("f1", 0.5)):
        assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)] == [(50, value)]
    assert [(f.path, f.is_dir) for f in client.list_artifacts(run.info.run_id)] == [("summary.txt", False)]
    downloaded = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="summary.txt",
                                                     dst_path=str(tmp_path / "download"))
    assert open(downloaded).read() == "loss went from 1.0 to 0.02\n"

    # The job API agrees, and the job's token ended with the job.
    headers = {"Authorization": f"Bearer {laptop}"}
    body = requests.get(f"{e2e.url}/api/jobs/{job.pk}", headers=headers, timeout=30).json()
    assert body["status"] == "finished" and body["exit_code"] == 0, body
    after = requests.get(f"{uri}/api/2.0/mlflow/runs/get", params={"run_id": run.info.run_id},
                         headers={"Authorization": f"Bearer {job_token}"}, timeout=30)
    assert after.status_code == 401, after.text
    assert requests.get(f"{e2e.url}/api/auth/token", headers={"Authorization": f"Bearer {job_token}"},
                        timeout=30).status_code == 401
    assert job_token not in e2e.worker_output() and job_token not in stdout + stderr
