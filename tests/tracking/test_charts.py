"""Charts of series logged without steps (issue 16): MLflow's log_metric without `step` stores every point at
step 0, so such a series is drawn against the time since its first point instead of piling up on x = 0."""
from __future__ import annotations

import re

import pytest
from django.test import Client

from tracking import charts

T0 = 1_750_000_000_000  # ms; the points below are 30 s apart


def _client():
    from mlflow import MlflowClient

    return MlflowClient()


def _polyline_xs(html: str) -> list[float]:
    coordinates = re.search(r'<polyline[^>]*points="([^"]*)"', html).group(1).split()
    return [float(pair.split(",")[0]) for pair in coordinates]


def _figure(html: str, metric: str) -> str:
    match = re.search(rf'<figure class="chart-card" data-metric="{metric}".*?</figure>', html, re.S)
    assert match, f"no chart of {metric}"
    return match.group(0)


def _ticks(figure_html: str) -> list[str]:
    return re.findall(rf'<text class="tick"[^>]*y="{charts.drawing.HEIGHT - 8}"[^>]*>([^<]*)</text>', figure_html)


def _stepless_run(name: str, values: list[float]) -> str:
    """A Run whose `lr` was logged without steps (one point every 30 s) and whose `loss` has steps."""
    client = _client()
    run_id = client.create_run("0", run_name=name).info.run_id  # "0": the project's default experiment
    for i, value in enumerate(values):
        client.log_metric(run_id, "lr", value, timestamp=T0 + i * 30_000)  # no step: MLflow sends step 0
        client.log_metric(run_id, "loss", 1.0 / (i + 1), timestamp=T0 + i * 30_000, step=i)
    return run_id


def test_a_series_logged_without_steps_is_drawn_against_time(world, mlflow_env):
    mlflow_env(world.token(world.member, ["read", "runs:write"]))
    run_id = _stepless_run("warmup", [0.1, 0.08, 0.05, 0.03, 0.01])
    assert {m.step for m in _client().get_metric_history(run_id, "lr")} == {0}

    viewer = Client()
    viewer.force_login(world.viewer)
    html = viewer.get(f"/projects/lab/runs/{run_id}/").content.decode()
    lr = _figure(html, "lr")
    assert 'data-x-axis="time"' in lr
    xs = _polyline_xs(lr)
    assert len(xs) == 5 and xs == sorted(xs) and len(set(xs)) == 5  # spread over time, not all at x = 0
    assert _ticks(lr) == ["0s", "30s", "1m", "1m30s", "2m"]
    assert "Logged without steps: x is the time since the first point." in lr
    # A series with steps keeps its step axis.
    loss = _figure(html, "loss")
    assert 'data-x-axis="step"' in loss and _ticks(loss) == ["0", "1", "2", "3", "4"]

    ja = viewer.get(f"/projects/lab/runs/{run_id}/", HTTP_ACCEPT_LANGUAGE="ja").content.decode()
    assert "ステップなしで記録: 横軸は最初の点からの経過時間です。" in _figure(ja, "lr")


def test_compare_draws_series_without_steps_against_the_time_since_each_runs_first_point(world, mlflow_env):
    mlflow_env(world.token(world.member, ["read", "runs:write"]))
    first = _stepless_run("warmup-a", [0.1, 0.05, 0.01])
    second = _stepless_run("warmup-b", [0.2, 0.1, 0.05, 0.02])
    viewer = Client()
    viewer.force_login(world.viewer)
    html = viewer.get("/projects/lab/runs/compare", {"run": [first, second]}).content.decode()
    lr = _figure(html, "lr")
    assert 'data-x-axis="time"' in lr and "x is the time since each Run" in lr
    lines = re.findall(r'<polyline[^>]*points="([^"]*)"', lr)
    assert [len(set(float(p.split(",")[0]) for p in line.split())) for line in lines] == [3, 4]
    assert _ticks(lr) == ["0s", "30s", "1m", "1m30s"]
    assert 'data-x-axis="step"' in _figure(html, "loss")


@pytest.mark.parametrize("low, high, expected", [
    (0, 90_000, ["0s", "30s", "1m", "1m30s"]),
    (0, 750, ["0s", "0.2s", "0.4s", "0.6s"]),
    (0, 7_200_000, ["0s", "30m", "1h", "1h30m", "2h"]),
    (0, 4 * 86_400_000, ["0s", "1d", "2d", "3d", "4d"]),
    (0, 5 * 86_400_000, ["0s", "2d", "4d"]),
    (0, 40 * 86_400_000, ["0s", "10d", "20d", "30d", "40d"]),
])
def test_time_ticks_are_round_and_few(low, high, expected):
    assert [charts.elapsed_label(t) for t in charts.time_ticks(low, high)] == expected
