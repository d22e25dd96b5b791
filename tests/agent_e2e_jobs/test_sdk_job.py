"""The `mado_tracking` SDK inside real jobs (issue 16): a job on the Local computer and on a real sshd
computer runs test_mlflow_job.py's script written with `mado_tracking` alone, and the Run's API and the
job page show exactly what it logged; a job whose tracking server goes away for 5 s mid-run still gets
all its 1000 points stored once; a job canceled mid-run (SIGTERM, SIGKILL after the product's 10 s)
has every point it logged before the cancel stored.

How the job gets the SDK: as a user's job does, through its `requirements`, which the worker installs
into the job's venv. The package is the agent distribution (`mado-tracking`, the worker's own), built
here from this checkout into a wheel and named as `mado-tracking @ file://<wheel>` (a `name @ URL`
line, which requirements allow); its dependencies come from the machine's package index. The job
prints where it imported the SDK from, so the test sees that it came from the job's venv, not this
repository."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from django.db import transaction
from django.test import Client
from django.urls import reverse

from jobs import services as job_services
from jobs.models import Job
from mado.services import Actor
from tests.agent_e2e_jobs.conftest import FlakyPort, local_computer_at, wait_until
from tests.agent_e2e_jobs.test_faults import pid_alive
from tests.support import kill_processes_under

ROOT = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT = 900.0  # the first job of a test builds its venv (the wheel's dependencies from the index)

# test_mlflow_job.py's researcher script, with `mado_tracking` instead of `mlflow`.
TRAIN = '''\
import os, tempfile
import mado_tracking

print("sdk from", mado_tracking.__file__, flush=True)
with mado_tracking.start_run() as run:  # the Job's Run
    assert run.in_job and run.run_id == os.environ["MLFLOW_RUN_ID"] == os.environ["MMT_RUN_ID"], run
    assert run.experiment_id == os.environ["MLFLOW_EXPERIMENT_ID"], run.experiment_id
    mado_tracking.log_params({"lr": "0.01", "optimizer": "adamw"})
    mado_tracking.set_tag("dataset", "cifar10-small")
    for step in range(50):
        mado_tracking.log_metric("loss", 1.0 / (step + 1), step=step)
    mado_tracking.log_metrics({"accuracy": 0.875, "f1": 0.5}, step=50)
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "summary.txt"), "w") as f:
        f.write("loss went from 1.0 to 0.02\\n")
    mado_tracking.log_artifact(os.path.join(folder, "summary.txt"))
    assert mado_tracking.flush(timeout=60)
    fetched = mado_tracking.get_run()
    assert {p["key"]: p["value"] for p in fetched["data"]["params"]} == {"lr": "0.01", "optimizer": "adamw"}
    assert len(mado_tracking.get_metric_history("loss")) == 50
    print("recorded run", run.run_id, "in experiment", run.experiment_id, flush=True)
'''

# Logs 500 points and waits until they are stored; then, once the test took the server away, 500 more,
# and ends the Run (which waits for the server to come back and the buffer to be taken).
AWAY = '''\
import os, time
import mado_tracking

marks = os.environ["MARKS"]
def mark(name, text=""):
    with open(os.path.join(marks, name + ".tmp"), "w") as f:
        f.write(text)
    os.rename(os.path.join(marks, name + ".tmp"), os.path.join(marks, name))
def wait_mark(name):
    deadline = time.monotonic() + 300
    while not os.path.exists(os.path.join(marks, name)):
        assert time.monotonic() < deadline, "no " + name
        time.sleep(0.05)

print("sdk from", mado_tracking.__file__, flush=True)
run = mado_tracking.start_run()
for step in range(500):
    mado_tracking.log_metric("loss", step * 0.5, step=step)
assert mado_tracking.flush(timeout=120)
mark("half")
wait_mark("away")
started = time.monotonic()
for step in range(500, 1000):
    mado_tracking.log_metric("loss", step * 0.5, step=step)
mark("logged", f"{time.monotonic() - started:.3f}")
mado_tracking.end_run()
print("ended the run with", run.metrics.sent_points, "points sent after", run.metrics.failures, "failed tries",
      flush=True)
'''

# Logs 999 points that stay buffered (under a batch, and a flush interval of an hour), then waits to be
# canceled: only the SDK's SIGTERM handler can deliver them. A data-loading process forked after the
# points were logged (as PyTorch's DataLoader forks its workers) gets the SIGTERM too, with a copy of the
# buffer that is not its own to send.
CANCELED = '''\
import multiprocessing, time
import mado_tracking

def load():
    while True:
        time.sleep(0.05)

print("sdk from", mado_tracking.__file__, flush=True)
run = mado_tracking.start_run()
for step in range(999):
    mado_tracking.log_metric("loss", step * 0.5, step=step)
loader = multiprocessing.get_context("fork").Process(target=load, daemon=True)
loader.start()
print("logged", run.metrics.unsent(), "buffered; loader", loader.pid, flush=True)
while True:
    time.sleep(0.05)
'''


# -- the SDK's distribution and where jobs run --------------------------------------------------------

@pytest.fixture(scope="session")
def agent_wheel(tmp_path_factory) -> Path:
    """The agent distribution (`mado-tracking`: worker, CLI and SDK) as a wheel, built from this checkout
    by pip as `pip install .` would, in a copy so the checkout gets no build/ directory."""
    base = tmp_path_factory.mktemp("agent-wheel")
    source = base / "src"
    source.mkdir()
    shutil.copy(ROOT / "pyproject.toml", source)
    for package in ("worker_agent", "mado_tracking"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
                            "-w", str(base / "dist"), str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (base / "dist").glob("mado_tracking-*.whl")
    return wheel


@pytest.fixture(scope="session")
def local_work(tmp_path_factory) -> Path:
    """The Local computers' working directory, shared by this file's tests so that their jobs, which have
    the same requirements, reuse one venv (built by the first)."""
    return tmp_path_factory.mktemp("sdk-local-work")


@pytest.fixture
def where(request, e2e, local_work, agent_wheel, settings):
    """(computer, requirements) of the test's parameter: the Local computer or the sshd computer; the wheel
    lies where the computer's user can read it."""
    settings.PUBLIC_URL = e2e.url  # the address the job's code reaches the API (and /mlflow) at
    if request.param == "ssh":
        wheel = e2e.working_dir / agent_wheel.name
        shutil.copy(agent_wheel, wheel)
        os.chown(wheel, e2e.uid, e2e.gid)
        yield e2e.computer, f"mado-tracking @ file://{wheel}\n"
        return
    computer = local_computer_at(e2e, local_work)
    yield computer, f"mado-tracking @ file://{agent_wheel}\n"
    kill_processes_under(str(local_work))


def run_job(e2e, computer, requirements: str, name: str, script: str, **env) -> Job:
    path = e2e.script(f"{name}.py", script)
    with transaction.atomic():  # as in a request
        return job_services.create_job(Actor(e2e.world.member), e2e.world.project, {
            "computer": computer.pk, "runtime": "python", "name": name, "command": ["python", str(path)],
            "requirements": requirements, "run_kind": "training",
            "env": {"MARKS": str(e2e.marks), **{k: str(v) for k, v in env.items()}}})


def job_output(e2e, job: Job) -> str:
    job = e2e.job(job)
    return (f"{job.status} {job.error}\nstdout: {e2e.stream(job, 'stdout')[-2000:]}\n"
            f"stderr: {e2e.stream(job, 'stderr')[-4000:]}")


def assert_sdk_from_the_jobs_venv(e2e, job: Job, computer) -> None:
    found = re.search(r"^sdk from (\S+)$", e2e.stream(job, "stdout"), re.MULTILINE)
    assert found, job_output(e2e, job)
    assert found.group(1).startswith(f"{computer.working_dir}/.mmt-cache/venvs/"), found.group(1)
    assert not found.group(1).startswith(str(ROOT)), found.group(1)


class Reader:
    """A laptop with a personal read token: MLflow's REST API of the server, no SDK."""

    def __init__(self, e2e):
        self.base = f"{e2e.url}/mlflow/api/2.0/mlflow"
        self.headers = {"Authorization": f"Bearer {e2e.world.token(e2e.world.member, ['read'])}"}

    def get(self, endpoint: str, **query) -> dict:
        response = requests.get(f"{self.base}/{endpoint}", params=query, headers=self.headers, timeout=30)
        assert response.status_code == 200, (endpoint, response.status_code, response.text)
        return response.json()

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        points = self.get("metrics/get-history", run_id=run_id, metric_key=key, max_results=25000)
        return sorted((int(p["step"]), float(p["value"])) for p in points.get("metrics", []))


def run_id_of(job: Job) -> str:
    from tracking.models import Run

    return Run.objects.get(job_id=job.pk).run_id


def assert_each_step_once(points: list[tuple[int, float]], count: int) -> None:
    steps = [step for step, _ in points]
    assert steps == list(range(count)), (
        f"{len(points)} points stored; missing {sorted(set(range(count)) - set(steps))[:10]}, "
        f"twice {sorted({s for s in steps if steps.count(s) > 1})[:10]}")
    assert all(value == step * 0.5 for step, value in points)


def run_panel(e2e, job: Job) -> str:
    """The Run panel of the job page, as the member sees it."""
    browser = Client()
    browser.force_login(e2e.world.member)
    page = browser.get(reverse("job-detail", args=[e2e.world.project.slug, job.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    start = html.index('id="run-panel"')
    return html[start:html.index("</section>", start)]


# -- the tests --------------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["local", "ssh"], indirect=True)
def test_a_script_using_only_the_sdk_records_to_its_jobs_run(e2e, where, tmp_path):
    computer, requirements = where
    e2e.start_worker(MADO_DEV_MODE="true", MMT_ALLOW_LOCAL_EXECUTOR="true")
    job = run_job(e2e, computer, requirements, f"sdk-{computer.kind}", TRAIN)
    job = e2e.wait_ended(job, timeout=INSTALL_TIMEOUT)
    stdout = e2e.stream(job, "stdout")
    assert job.status == "finished" and job.exit_code == 0, job_output(e2e, job)
    assert_sdk_from_the_jobs_venv(e2e, job, computer)
    run_id = run_id_of(job)
    assert re.search(rf"^recorded run {run_id} in experiment \S+$", stdout, re.MULTILINE), stdout

    # The API, read with a personal token: exactly what the script logged.
    reader = Reader(e2e)
    run = reader.get("runs/get", run_id=run_id)["run"]
    assert run["info"]["status"] == "FINISHED" and run["info"]["end_time"], run["info"]
    assert {p["key"]: p["value"] for p in run["data"]["params"]} == {"lr": "0.01", "optimizer": "adamw"}
    user_tags = {t["key"]: t["value"] for t in run["data"]["tags"] if not t["key"].startswith(("mlflow.", "mado."))}
    assert user_tags == {"dataset": "cifar10-small"}
    metrics = {m["key"]: float(m["value"]) for m in run["data"]["metrics"]}
    # The worker's own telemetry of the job's processes joins when a sample lands while the script runs.
    system = {key for key in metrics if key.startswith("system/")}
    assert system <= {"system/cpu/utilization", "system/memory/rss_bytes"}, system
    assert {k: v for k, v in metrics.items() if k not in system} == {"loss": 0.02, "accuracy": 0.875, "f1": 0.5}
    assert reader.history(run_id, "loss") == [(step, 1.0 / (step + 1)) for step in range(50)]
    assert reader.history(run_id, "accuracy") == [(50, 0.875)] and reader.history(run_id, "f1") == [(50, 0.5)]
    listed = reader.get("artifacts/list", run_id=run_id)["files"]
    assert [(f["path"], f.get("is_dir", False), int(f["file_size"])) for f in listed] == [("summary.txt", False, 27)]
    download = requests.get(f"{e2e.url}/mlflow/api/2.0/mlflow-artifacts/artifacts/{_artifact_root(run)}/summary.txt",
                            headers=reader.headers, timeout=30)
    assert download.status_code == 200 and download.text == "loss went from 1.0 to 0.02\n"
    body = requests.get(f"{e2e.url}/api/jobs/{job.pk}", headers=reader.headers, timeout=30).json()
    assert body["status"] == "finished" and body["exit_code"] == 0, body

    # The job page's Run panel: the same parameters, tag, series (with their point counts) and artifact.
    panel = run_panel(e2e, job)
    assert re.findall(r'data-param="([^"]+)"><th scope="row"><code>[^<]*</code></th><td><code>([^<]*)</code>',
                      panel) == [("lr", "0.01"), ("optimizer", "adamw")]
    assert re.findall(r'data-tag="([^"]+)"><th scope="row"><code>[^<]*</code></th><td>([^<]*)</td>', panel) == [
        ("dataset", "cifar10-small")]
    series = dict(re.findall(r'data-metric="([^"]+)" data-points="(\d+)"', panel))
    assert {name for name in series if name.startswith("system/")} == system, series  # as the API listed them
    assert {k: v for k, v in series.items() if k not in system} == {"accuracy": "1", "f1": "1", "loss": "50"}
    assert re.findall(r'data-artifact="([^"]+)"', panel) == ["summary.txt"]


def _artifact_root(run: dict) -> str:
    """`mlflow-artifacts:/<root>` → `<root>`, as MLflow's client resolves it against the tracking URI."""
    uri = run["info"]["artifact_uri"]
    assert uri.startswith("mlflow-artifacts:/"), uri
    return uri[len("mlflow-artifacts:"):].strip("/")


@pytest.mark.parametrize("where", ["local"], indirect=True)
def test_the_server_away_for_5_seconds_mid_run_every_one_of_1000_points_arrives_once(e2e, where, settings):
    computer, requirements = where
    # The job reaches the server through a port that can go away (as the server does when it restarts:
    # connections reset, new ones refused); the worker keeps its own way in, so the job is not disturbed.
    port = FlakyPort(int(e2e.url.rsplit(":", 1)[1]))
    settings.PUBLIC_URL = port.url
    try:
        e2e.start_worker(MADO_DEV_MODE="true", MMT_ALLOW_LOCAL_EXECUTOR="true")
        job = run_job(e2e, computer, requirements, "sdk-away", AWAY)
        wait_until(lambda: (e2e.marks / "half").exists() or e2e.job(job).is_terminal, timeout=INSTALL_TIMEOUT,
                   interval=0.2, what="the job's first 500 points to be stored")
        assert (e2e.marks / "half").exists(), job_output(e2e, job)
        reader = Reader(e2e)
        run_id = run_id_of(job)
        assert_each_step_once(reader.history(run_id, "loss"), 500)

        port.down()
        away = time.monotonic()
        (e2e.marks / "away").touch()
        wait_until(lambda: (e2e.marks / "logged").exists(), timeout=60, what="the job to log its last 500 points")
        # Logging never waited for the network.
        assert float((e2e.marks / "logged").read_text()) < 5.0
        wait_until(lambda: time.monotonic() - away >= 5.0, timeout=10, what="5 s with the server away")
        assert e2e.job(job).status == "running"
        assert_each_step_once(reader.history(run_id, "loss"), 500)  # the rest waits in the job's buffer
        port.up()

        job = e2e.wait_ended(job, timeout=180)
        assert job.status == "finished" and job.exit_code == 0, job_output(e2e, job)
    finally:
        port.close()
    assert_sdk_from_the_jobs_venv(e2e, job, computer)
    found = re.search(r"^ended the run with (\d+) points sent after (\d+) failed tries$", e2e.stream(job, "stdout"),
                      re.MULTILINE)
    assert found and int(found.group(1)) == 1000 and int(found.group(2)) >= 1, job_output(e2e, job)
    assert_each_step_once(reader.history(run_id, "loss"), 1000)
    assert reader.get("runs/get", run_id=run_id)["run"]["info"]["status"] == "FINISHED"


@pytest.mark.parametrize("where", ["local"], indirect=True)
def test_a_job_canceled_mid_run_delivers_its_buffered_points_before_the_sigkill(e2e, where):
    computer, requirements = where
    # The product's grace (10 s between SIGTERM and SIGKILL), not the 3 s of the other e2e tests.
    e2e.start_worker(MADO_DEV_MODE="true", MMT_ALLOW_LOCAL_EXECUTOR="true", MMT_WORKER_CANCEL_GRACE="10")
    job = run_job(e2e, computer, requirements, "sdk-canceled", CANCELED, MADO_TRACKING_FLUSH_INTERVAL=3600)
    e2e.wait_log(job, "logged 999 buffered; loader", timeout=INSTALL_TIMEOUT)
    reader = Reader(e2e)
    run_id = run_id_of(job)
    assert reader.history(run_id, "loss") == []  # all 999 are in the job's buffer

    with transaction.atomic():
        job_services.request_stop(Actor(e2e.world.member), e2e.job(job))
    job = e2e.wait_ended(job, timeout=60)
    assert job.status == "canceled", job_output(e2e, job)
    stderr = e2e.stream(job, "stderr")
    assert "Stop requested: sending SIGTERM; SIGKILL follows after 10 s." in stderr, stderr
    assert "sending SIGKILL" not in stderr, stderr
    # The SDK said nothing went wrong: the loader's copy of the buffer was neither sent nor reported.
    assert "mado_tracking:" not in stderr, stderr
    loader = int(re.search(r"loader (\d+)", e2e.stream(job, "stdout")).group(1))
    assert not pid_alive(loader), "the forked loader ended with the job"
    assert_sdk_from_the_jobs_venv(e2e, job, computer)
    assert_each_step_once(reader.history(run_id, "loss"), 999)
    assert reader.get("runs/get", run_id=run_id)["run"]["info"]["status"] == "KILLED"
