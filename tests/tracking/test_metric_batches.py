"""Full metric batches, as a training loop sends them with the real MLflow client (issue 16): a
1000-point batch over a few keys keeps each key's latest value, a point repeated in a batch is stored
once, and the history gives back every point, in order, with the values as they were logged."""
from __future__ import annotations

import json
import math
import random

from tests.conftest import bearer
from tracking.models import LatestMetric, Metric, Run

P = "/mlflow/api/2.0/mlflow/"


def _client():
    from mlflow import MlflowClient

    return MlflowClient()


def _new_run(world, mlflow_env) -> str:
    mlflow_env(world.token(world.member, ["read", "runs:write"]))
    return _client().create_run("0", run_name="batches").info.run_id


def test_a_full_batch_over_repeated_keys_keeps_each_keys_latest_point(world, mlflow_env):
    from mlflow.entities import Metric as MlflowMetric

    run_id = _new_run(world, mlflow_env)
    # Three series interleaved and shuffled: the latest is the largest step, then timestamp, then value,
    # wherever it sits in the batch.
    batch = [MlflowMetric(key, step * 0.5 + len(key), 10_000 + step, step)
             for step in range(333) for key in ("loss", "acc", "lr")]
    batch.append(MlflowMetric("loss", 999.0, 10_000 + 332, 332))  # same step and time, larger value: the latest
    random.Random(16).shuffle(batch)
    assert len(batch) == 1000
    _client().log_batch(run_id, metrics=batch)

    latest = _client().get_run(run_id).data.metrics
    assert latest == {"loss": 999.0, "acc": 332 * 0.5 + 3, "lr": 332 * 0.5 + 2}
    # An earlier point sent afterwards does not replace the latest; a later one does.
    _client().log_batch(run_id, metrics=[MlflowMetric("acc", 0.0, 1, 5), MlflowMetric("lr", 7.0, 1, 400)])
    assert _client().get_run(run_id).data.metrics == {"loss": 999.0, "acc": 332 * 0.5 + 3, "lr": 7.0}
    assert {(m.key, m.step) for m in LatestMetric.objects.filter(run_id=run_id)} == {
        ("loss", 332), ("acc", 332), ("lr", 400)}
    assert [r.info.run_id for r in _client().search_runs(["0"], filter_string="metrics.loss > 998")] == [run_id]


def test_a_point_repeated_within_a_batch_is_stored_once(world, mlflow_env):
    from mlflow.entities import Metric as MlflowMetric

    run_id = _new_run(world, mlflow_env)
    points = [MlflowMetric("loss", 1.0 / (step + 1), 2_000 + step, step) for step in range(400)]
    nan = [MlflowMetric("loss", float("nan"), 9_000, 400)] * 3
    _client().log_batch(run_id, metrics=points + points[:300] + nan + [MlflowMetric("loss", 0.0, 9_000, 400)])
    _client().log_batch(run_id, metrics=points[100:200])  # part of it again

    assert Metric.objects.filter(run_id=run_id).count() == 400 + 2  # NaN and 0.0 at one step are two points
    assert LatestMetric.objects.get(run_id=run_id, key="loss").points == 402  # what the job page's stamp counts
    history = _client().get_metric_history(run_id, "loss")
    assert [(m.step, m.timestamp) for m in history[:400]] == [(s, 2_000 + s) for s in range(400)]
    assert sorted((math.isnan(m.value), m.value if not math.isnan(m.value) else 0) for m in history[400:]) == [
        (False, 0.0), (True, 0)]


def test_the_history_gives_back_every_point_in_order_with_its_value(world, mlflow_env):
    from mlflow.entities import Metric as MlflowMetric

    run_id = _new_run(world, mlflow_env)
    values = [1.0 / 3, -0.0, 1e300, 5e-324, 2.0**53 + 1, 123456789.123456789, float("inf"), float("-inf")]
    rng = random.Random(3)
    expected = [(step, 1_000 + step % 7, rng.choice(values) * (1 if step % 2 else -1)) for step in range(2_500)]
    order = list(expected)
    rng.shuffle(order)  # sent out of order, in three batches
    for start in range(0, len(order), 1000):
        _client().log_batch(run_id, metrics=[MlflowMetric("val/loss", v, t, s)
                                             for s, t, v in order[start:start + 1000]])

    history = _client().get_metric_history(run_id, "val/loss")
    assert [(m.step, m.timestamp, m.value) for m in history] == expected
    assert all(m.key == "val/loss" for m in history)

    # The same series in pages, as MLflow's REST API gives it with max_results and page_token.
    api = bearer(world.token(world.viewer, ["read"]))
    pages, token = [], None
    while True:
        query = {"run_id": run_id, "metric_key": "val/loss", "max_results": 1000}
        if token:
            query["page_token"] = token
        answer = api.get(P + "metrics/get-history", query)
        assert answer.status_code == 200 and answer["Content-Type"] == "application/json"
        body = json.loads(answer.content)
        pages.append(body["metrics"])
        token = body.get("next_page_token")
        if not token:
            break
    assert [len(p) for p in pages] == [1000, 1000, 500]
    shown = {math.inf: "Infinity", -math.inf: "-Infinity"}
    assert [m for page in pages for m in page] == [
        {"key": "val/loss", "value": shown.get(v, v), "timestamp": t, "step": s} for s, t, v in expected]


def test_a_bad_point_after_good_ones_of_its_key_refuses_the_whole_batch(world, mlflow_env):
    from mlflow.entities import Metric as MlflowMetric

    run_id = _new_run(world, mlflow_env)
    api = bearer(world.token(world.member, ["read", "runs:write"]))
    good = [{"key": "loss", "value": 0.5, "timestamp": 1, "step": step} for step in range(10)]
    for bad, field in (({"value": True}, "value"), ({"step": 1.5}, "step"), ({"timestamp": -1}, "timestamp"),
                       ({"step": 2**63}, "step"), ({"value": "lots"}, "value")):
        answer = api.post(P + "runs/log-batch", {"run_id": run_id, "metrics": [*good, {**good[0], **bad}]},
                          format="json")
        assert answer.status_code == 400, (bad, answer.content)
        assert answer.json()["error_code"] == "INVALID_PARAMETER_VALUE"
        assert f"metrics[10].{field}" in answer.json()["message"], answer.json()
    answer = api.post(P + "runs/log-batch", {"run_id": run_id, "metrics": [*good, {**good[0], "key": "../up"}]},
                      format="json")
    assert answer.status_code == 400 and "metrics[10].key" in answer.json()["message"], answer.content
    assert not Metric.objects.filter(run_id=run_id).exists()
    _client().log_batch(run_id, metrics=[MlflowMetric("loss", 1.0, 1, 0)])  # the run still takes good ones
    assert Metric.objects.filter(run_id=run_id).count() == 1


def test_a_job_metric_name_with_quotes_and_backslashes_is_stored_as_sent(world, mlflow_env, running_job):
    job, item, _worker = running_job
    names = ['say "hi"', "C:\\temp\\loss", "{a,b}", "NULL", " padded "]
    answer = bearer(item["job_token"]).post(f"/api/jobs/{job.pk}/metrics", {"metrics": [
        {"name": name, "value": float(i), "step": i} for i, name in enumerate(names)]}, format="json")
    assert answer.status_code == 200, answer.content
    mlflow_env(world.token(world.viewer, ["read"]))
    run_id = Run.objects.get(job=job).run_id
    for i, name in enumerate(names):
        assert [(m.key, m.value, m.step) for m in _client().get_metric_history(run_id, name)] == [(name, float(i), i)]
    assert _client().get_run(run_id).data.metrics == {name: float(i) for i, name in enumerate(names)}
