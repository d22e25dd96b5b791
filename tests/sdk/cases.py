"""What the `mado_tracking` SDK promises, written once against a `server` fixture (tests/sdk/conftest.py):
test_sdk_mado.py runs them against this project's server, test_sdk_mlflow_peer.py against the real MLflow
tracking server (the same protocol)."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import uuid

import pytest

import mado_tracking
from tests.support import wait_for


def child(server, tmp_path, code: str, **env) -> subprocess.Popen:
    script = tmp_path / f"script-{uuid.uuid4().hex[:6]}.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.Popen([sys.executable, str(script)], env=server.env_for_sdk(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def steps_once(points: list[dict], count: int) -> None:
    steps = sorted(int(point["step"]) for point in points)
    assert steps == list(range(count)), (
        f"{len(points)} points arrived; missing {sorted(set(range(count)) - set(steps))[:10]}, "
        f"twice {sorted({s for s in steps if steps.count(s) > 1})[:10]}")
    for point in points:
        assert float(point["value"]) == int(point["step"]) * 0.5


@pytest.fixture
def laptop(server, monkeypatch):
    """A notebook on a laptop: the tracking URI and a personal token in the environment, no job."""
    for name in ("MLFLOW_RUN_ID", "MMT_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.tracking_uri)
    if server.token:
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", server.token)
    else:
        monkeypatch.delenv("MLFLOW_TRACKING_TOKEN", raising=False)
    yield server
    if mado_tracking.active_run() is not None:
        mado_tracking.active_run().end("KILLED", flush_timeout=5)


def new_run(server, name: str) -> str:
    experiment = f"sdk-{uuid.uuid4().hex[:8]}"
    experiment_id = server.api("POST", "experiments/create", {"name": experiment})["experiment_id"]
    return server.api("POST", "runs/create", {"experiment_id": experiment_id, "run_name": name})["run"]["info"]["run_id"]


def test_inside_a_job_start_run_continues_the_jobs_run_and_all_1000_points_arrive_once(server, tmp_path):
    run_id = new_run(server, "job-run")
    program = child(server, tmp_path, """
        import mado_tracking
        run = mado_tracking.start_run()
        print("run", run.run_id, flush=True)
        for step in range(1000):
            mado_tracking.log_metric("loss", step * 0.5, step=step)
        # no end_run: the interpreter's exit delivers the buffered points; the Job's end owns the Run's status
    """, MLFLOW_RUN_ID=run_id, MMT_RUN_ID=run_id)
    output, _ = program.communicate(timeout=120)
    assert program.returncode == 0, output
    assert f"run {run_id}" in output
    steps_once(server.history(run_id, "loss"), 1000)
    assert server.api("GET", "runs/get", {"run_id": run_id})["run"]["info"]["status"] == "RUNNING"


def test_from_a_laptop_a_new_run_gets_params_tags_metrics_and_an_artifact(laptop, tmp_path):
    experiment = f"notebook-{uuid.uuid4().hex[:8]}"
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"\x00\x01weights")
    with mado_tracking.start_run(experiment=experiment, run_name="laptop") as run:
        mado_tracking.log_params({"lr": 0.001, "batch_size": 32})
        mado_tracking.set_tag("stage", "try")
        for step in range(50):
            mado_tracking.log_metric("loss", step * 0.5, step=step)
        mado_tracking.log_metrics({"accuracy": 0.75, "f1": 0.5}, step=49)
        mado_tracking.log_artifact(str(weights), "model")
    found = laptop.api("GET", "experiments/get-by-name", {"experiment_name": experiment})["experiment"]
    assert str(found["experiment_id"]) == run.experiment_id
    got = laptop.api("GET", "runs/get", {"run_id": run.run_id})["run"]
    assert got["info"]["status"] == "FINISHED" and got["info"].get("end_time")
    assert {(p["key"], p["value"]) for p in got["data"]["params"]} == {("lr", "0.001"), ("batch_size", "32")}
    assert ("stage", "try") in {(t["key"], t["value"]) for t in got["data"]["tags"]}
    steps_once(laptop.history(run.run_id, "loss"), 50)
    assert [float(p["value"]) for p in laptop.history(run.run_id, "accuracy")] == [0.75]
    listed = laptop.api("GET", "artifacts/list", {"run_id": run.run_id, "path": "model"})
    assert [(f["path"], int(f["file_size"])) for f in listed["files"]] == [("model/weights.bin", 9)]


def test_a_parameter_logged_again_with_another_value_raises(laptop):
    with mado_tracking.start_run(experiment=f"params-{uuid.uuid4().hex[:8]}") as run:
        mado_tracking.log_param("lr", 0.1)
        mado_tracking.log_param("lr", 0.1)  # the same value again is fine, as in MLflow
        with pytest.raises(mado_tracking.TrackingError) as refused:
            mado_tracking.log_param("lr", 0.2)
        assert refused.value.error_code == "INVALID_PARAMETER_VALUE"
        assert refused.value.status == 400
        assert "lr" in refused.value.message
    params = laptop.api("GET", "runs/get", {"run_id": run.run_id})["run"]["data"]["params"]
    assert [(p["key"], p["value"]) for p in params] == [("lr", "0.1")]


def test_an_invalid_metric_name_raises_at_the_call(laptop):
    with mado_tracking.start_run(experiment=f"names-{uuid.uuid4().hex[:8]}"):
        with pytest.raises(mado_tracking.TrackingError, match="letters, digits") as refused:
            mado_tracking.log_metric("loss?", 1.0)
        assert refused.value.error_code == "INVALID_PARAMETER_VALUE"


def test_the_server_away_mid_run_every_point_arrives_once(laptop):
    run = mado_tracking.start_run(experiment=f"away-{uuid.uuid4().hex[:8]}")
    for step in range(500):
        run.log_metric("loss", step * 0.5, step=step)
    assert run.flush(timeout=60)
    laptop.down()
    assert laptop.refuses()
    failures = run.metrics.failures
    for step in range(500, 1000):
        run.log_metric("loss", step * 0.5, step=step)
    # The sender keeps trying while the server is away (at least twice), and keeps the points.
    wait_for(lambda: run.metrics.failures >= failures + 2, timeout=30, what="the SDK to retry while the server is away")
    assert run.metrics.unsent() == 500
    laptop.up()
    run.end()
    steps_once(laptop.history(run.run_id, "loss"), 1000)


def test_a_refused_batch_is_raised_at_the_next_call_and_not_sent_again(laptop):
    run = mado_tracking.start_run(experiment=f"refused-{uuid.uuid4().hex[:8]}")
    laptop.api("POST", "runs/delete", {"run_id": run.run_id})  # a deleted Run takes no more metrics
    run.log_metric("loss", 1.0, step=0)
    wait_for(lambda: run.metrics.unsent() == 0, timeout=30, what="the batch to be refused")
    with pytest.raises(mado_tracking.TrackingError) as refused:
        run.log_metric("loss", 2.0, step=1)
    assert refused.value.status is not None and 400 <= refused.value.status < 500
    assert "1 metric points" in str(refused.value)
    run.metrics.close(0)
    mado_tracking._run._forget(run)


def test_sigterm_delivers_the_buffered_points_then_ends_the_program(server, tmp_path):
    program = child(server, tmp_path, f"""
        import time
        import mado_tracking
        run = mado_tracking.start_run(experiment="sigterm-{uuid.uuid4().hex[:8]}")
        for step in range(999):
            mado_tracking.log_metric("loss", step * 0.5, step=step)
        print("logged", run.run_id, run.metrics.unsent(), flush=True)
        time.sleep(600)
    """, MADO_TRACKING_FLUSH_INTERVAL=3600)  # nothing is sent before the signal
    line = program.stdout.readline().split()
    assert line[0] == "logged" and line[2] == "999", line
    run_id = line[1]
    assert server.history(run_id, "loss") == []
    program.send_signal(signal.SIGTERM)
    output, _ = program.communicate(timeout=10)  # the worker's SIGKILL comes 10 s after SIGTERM
    assert program.returncode == -signal.SIGTERM, output
    steps_once(server.history(run_id, "loss"), 999)
    assert server.api("GET", "runs/get", {"run_id": run_id})["run"]["info"]["status"] == "KILLED"


def test_an_answer_lost_on_the_way_the_batch_is_sent_again_and_stored_once(laptop, losing_proxy, monkeypatch):
    proxy = losing_proxy(laptop.port)
    monkeypatch.setenv("MADO_TRACKING_TIMEOUT", "2")
    run = mado_tracking.start_run(experiment=f"lost-{uuid.uuid4().hex[:8]}", run_name="lost-answers",
                                  tracking_uri=laptop.tracking_uri.replace(str(laptop.port), str(proxy.port)))
    proxy.lose_answers = True
    failures = run.metrics.failures
    for step in range(300):
        run.log_metric("loss", step * 0.5, step=step)
    # The server stored the batch, but the SDK never heard so: it keeps the points and sends them again.
    wait_for(lambda: len(laptop.history(run.run_id, "loss")) >= 300, timeout=30, what="the batch to reach the server")
    wait_for(lambda: run.metrics.failures >= failures + 1, timeout=30, what="the SDK to time out waiting")
    assert run.metrics.unsent() == 300
    proxy.lose_answers = False
    run.end()
    steps_once(laptop.history(run.run_id, "loss"), 300)
