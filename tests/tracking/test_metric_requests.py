"""What one metric request costs and what a long history looks like through the real MLflow client
(issue 16's speed goals: one log_metric ≤ 10 ms, a 100,000-point history ≤ 1 s). Times are measured by
bench/tracking_throughput.py, not here; these tests pin what the times rest on: the number of database
round trips per log_metric, and a history that the client reads in pages arriving whole and in order."""
from __future__ import annotations

from django.test import Client

from mado.choices import Role
from mado.services import Actor
from tracking import services
from tracking.models import LatestMetric, Metric, Run

P = "/mlflow/api/2.0/mlflow/"


def _log_metric(token: str, run_id: str, step: int):
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}").post(
        P + "runs/log-metric", {"run_id": run_id, "key": "loss", "value": 1.0 / (step + 1), "timestamp": 1_000 + step,
                                "step": step}, content_type="application/json")


def test_one_log_metric_is_three_queries_with_a_personal_token_or_a_job_token(
        world, running_job, django_assert_max_num_queries):
    """The token with its user's role in its project (read once, though reading the Run needs viewer and
    writing member; a job token's creator's service account comes with it too), the Run, and one statement
    for the point and the series' latest value and count (mado.authentication, tracking.access)."""
    job, item, _worker = running_job
    personal = world.token(world.member, ["read", "runs:write"])
    assert _log_metric(personal, item["run_id"], 0).status_code == 200  # a token's first use writes its time
    for step, (token, queries) in enumerate(((item["job_token"], 3), (personal, 3), (item["job_token"], 3)), start=1):
        with django_assert_max_num_queries(queries):
            assert _log_metric(token, item["run_id"], step).status_code == 200
    assert list(Metric.objects.filter(run_id=item["run_id"]).values_list("step", flat=True)) == [0, 1, 2, 3]
    latest = LatestMetric.objects.get(run_id=item["run_id"], key="loss")
    assert (latest.step, latest.value, latest.points) == (3, 0.25, 4)


def test_a_role_taken_away_between_requests_is_seen_by_the_next_one(world, running_job):
    """The role is remembered within one request only: a member made viewer can no longer write."""
    _job, item, _worker = running_job
    token = world.token(world.member, ["read", "runs:write"])
    assert _log_metric(token, item["run_id"], 0).status_code == 200
    world.project.memberships.filter(user=world.member).update(role=Role.VIEWER)
    refused = _log_metric(token, item["run_id"], 1)
    assert refused.status_code == 403 and refused.json()["error_code"] == "PERMISSION_DENIED"


def test_a_history_longer_than_the_clients_page_arrives_whole_and_in_order(world, mlflow_env):
    """MLflow's client asks for 25,000 points a page and follows next_page_token: 25,600 points (two per
    step, so equal steps straddle the page edge) come back once each, in (step, timestamp) order."""
    from mlflow import MlflowClient

    mlflow_env(world.token(world.member, ["read", "runs:write"]))
    run_id = MlflowClient().create_run("0", run_name="long-history").info.run_id
    run = Run.objects.get(pk=run_id)
    points = [{"key": "loss", "value": (i % 977) / 7, "timestamp": 5_000 - i % 2, "step": i // 2}
              for i in range(25_600)]
    for start in range(0, len(points), 1000):  # in-process: the test is about reading, not sending
        services.log_batch(Actor(world.member), None, run, metrics=points[start:start + 1000])

    history = MlflowClient().get_metric_history(run_id, "loss")
    expected = sorted((p["step"], p["timestamp"], p["value"]) for p in points)
    assert [(m.step, m.timestamp, m.value) for m in history] == expected
    assert LatestMetric.objects.get(run_id=run_id, key="loss").points == 25_600
