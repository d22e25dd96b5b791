"""Bad input to /mlflow/ gets MLflow's error codes and messages, never a server error. These endpoints
are outside /api/schema/ (their contract is MLflow's), so this replaces the schema fuzzer for them."""
from __future__ import annotations

import base64
import json

import pytest
from django.test import Client

from tracking.models import Metric, Run

P = "/mlflow/api/2.0/mlflow/"


class Mlflow:
    def __init__(self, token: str):
        self.client = Client()
        self.headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"}

    def post(self, path, body):
        data = body if isinstance(body, (str, bytes)) else json.dumps(body)
        return self.client.post(P + path, data=data, content_type="application/json", **self.headers)

    def get(self, path, **params):
        return self.client.get(P + path, params, **self.headers)


def error(response, status: int, code: str) -> str:
    assert response.status_code == status, response.content
    body = response.json()
    assert body["error_code"] == code and isinstance(body["message"], str) and body["message"], body
    return body["message"]


@pytest.fixture
def api(world):
    return Mlflow(world.token(world.member, ["read", "runs:write"]))


@pytest.fixture
def run_id(api):
    response = api.post("runs/create", {"experiment_id": "0", "run_name": "r"})
    assert response.status_code == 200, response.content
    return response.json()["run"]["info"]["run_id"]


def metric(key="loss", value=1.0, step=0, timestamp=1700000000000):
    return {"key": key, "value": value, "timestamp": timestamp, "step": step}


def test_a_batch_over_the_limits_is_refused_whole(api, run_id):
    message = error(api.post("runs/log-batch", {"run_id": run_id, "metrics": [metric(step=i) for i in range(1001)]}),
                    400, "INVALID_PARAMETER_VALUE")
    assert "at most 1000 metrics" in message
    params = [{"key": f"p{i}", "value": "1"} for i in range(101)]
    assert "at most 100 params" in error(api.post("runs/log-batch", {"run_id": run_id, "params": params}),
                                         400, "INVALID_PARAMETER_VALUE")
    tags = [{"key": f"t{i}", "value": "1"} for i in range(101)]
    assert "at most 100 tags" in error(api.post("runs/log-batch", {"run_id": run_id, "tags": tags}),
                                       400, "INVALID_PARAMETER_VALUE")
    both = {"run_id": run_id, "metrics": [metric(step=i) for i in range(950)], "params": params[:60]}
    assert "at most 1000 metrics, params, and tags" in error(api.post("runs/log-batch", both), 400,
                                                            "INVALID_PARAMETER_VALUE")
    assert not Metric.objects.exists()
    assert api.post("runs/log-batch", {"run_id": run_id, "metrics": [metric(step=i) for i in range(1000)]}
                    ).status_code == 200
    assert Metric.objects.filter(run_id=run_id).count() == 1000


@pytest.mark.parametrize("key", ["bad*key", "../escape", "/abs", "a//b", "x" * 251, "", None, 5])
def test_invalid_keys_are_refused(api, run_id, key):
    error(api.post("runs/log-metric", {"run_id": run_id, **metric(key=key)}), 400, "INVALID_PARAMETER_VALUE")
    error(api.post("runs/log-parameter", {"run_id": run_id, "key": key, "value": "1"}), 400, "INVALID_PARAMETER_VALUE")
    error(api.post("runs/set-tag", {"run_id": run_id, "key": key, "value": "1"}), 400, "INVALID_PARAMETER_VALUE")


def test_over_long_values_are_refused(api, run_id):
    assert "6000" in error(api.post("runs/log-parameter", {"run_id": run_id, "key": "k", "value": "v" * 6001}),
                           400, "INVALID_PARAMETER_VALUE")
    assert "8000" in error(api.post("runs/set-tag", {"run_id": run_id, "key": "k", "value": "v" * 8001}),
                           400, "INVALID_PARAMETER_VALUE")
    assert api.post("runs/log-parameter", {"run_id": run_id, "key": "k", "value": "v" * 6000}).status_code == 200


@pytest.mark.parametrize("value", ["abc", True, None, [1], {"a": 1}])
def test_metric_values_that_are_not_doubles_are_refused(api, run_id, value):
    error(api.post("runs/log-metric", {"run_id": run_id, **metric(value=value)}), 400, "INVALID_PARAMETER_VALUE")


def test_nan_and_infinity_are_stored_as_mlflow_does(api, run_id):
    for step, value in enumerate(["NaN", "Infinity", "-Infinity", 1.5]):
        assert api.post("runs/log-metric", {"run_id": run_id, **metric(value=value, step=step)}).status_code == 200
    history = api.get("metrics/get-history", run_id=run_id, metric_key="loss").json()["metrics"]
    assert [m["value"] for m in history] == ["NaN", "Infinity", "-Infinity", 1.5]


@pytest.mark.parametrize(("field", "value"), [("timestamp", -1), ("timestamp", "soon"), ("step", "x"),
                                              ("step", 2**63), ("timestamp", None)])
def test_bad_steps_and_timestamps_are_refused(api, run_id, field, value):
    error(api.post("runs/log-metric", {"run_id": run_id, **metric(**{field: value})}), 400, "INVALID_PARAMETER_VALUE")


@pytest.mark.parametrize("body", ["not json", "[1, 2]", '"text"', json.dumps({"run_id": ["a"], "metrics": "x"})])
def test_malformed_bodies(api, body):
    response = api.post("runs/log-batch", body)
    assert response.status_code == 400 and response.json()["error_code"] in ("MALFORMED_REQUEST",
                                                                             "INVALID_PARAMETER_VALUE")


def test_unknown_runs_and_experiments(api):
    error(api.get("runs/get", run_id="0" * 32), 404, "RESOURCE_DOES_NOT_EXIST")
    error(api.get("runs/get", run_id="bad id!"), 400, "INVALID_PARAMETER_VALUE")
    error(api.get("runs/get"), 400, "INVALID_PARAMETER_VALUE")
    error(api.get("experiments/get", experiment_id="999999"), 404, "RESOURCE_DOES_NOT_EXIST")
    error(api.get("experiments/get", experiment_id="x"), 400, "INVALID_PARAMETER_VALUE")
    error(api.get("experiments/get-by-name", experiment_name="nope"), 404, "RESOURCE_DOES_NOT_EXIST")
    error(api.post("runs/create", {"experiment_id": "99999999999999999999999"}), 400, "INVALID_PARAMETER_VALUE")
    error(api.post("experiments/create", {"name": ""}), 400, "INVALID_PARAMETER_VALUE")
    error(api.post("experiments/create", {"name": "x" * 501}), 400, "INVALID_PARAMETER_VALUE")
    error(api.get("nothing/here"), 404, "ENDPOINT_NOT_FOUND")


@pytest.mark.parametrize("text", ["metrics.acc >", "metrics.acc > 'x'", "params.lr ~ 1", "foo.bar = 1",
                                  "attributes.nope = 'x'", "metrics.acc > 1 or metrics.acc < 0", "(((",
                                  "params.a IN 1", "tags.t IS maybe", "'", "metrics.acc > 1 and"])
def test_bad_filter_strings(api, run_id, text):
    error(api.post("runs/search", {"experiment_ids": ["0"], "filter": text}), 400, "INVALID_PARAMETER_VALUE")


@pytest.mark.parametrize("order", ["metrics.", "nonsense DESC", "params.lr sideways", 5])
def test_bad_order_by(api, run_id, order):
    error(api.post("runs/search", {"experiment_ids": ["0"], "order_by": [order]}), 400, "INVALID_PARAMETER_VALUE")


def test_search_paging_and_limits(api, run_id):
    error(api.post("runs/search", {"max_results": 50001}), 400, "INVALID_PARAMETER_VALUE")
    error(api.post("runs/search", {"page_token": "%%%"}), 400, "INVALID_PARAMETER_VALUE")
    found = api.post("runs/search", {"filter": "tags.mlflow.runName = 'r' and attributes.status != 'FAILED'"})
    assert [r["info"]["run_id"] for r in found.json()["runs"]] == [run_id]


def test_tokens(world, run_id):
    error(Client().post(P + "runs/create", "{}", content_type="application/json"), 401, "UNAUTHENTICATED")
    error(Mlflow("mmt_not-a-token").get("runs/get", run_id=run_id), 401, "UNAUTHENTICATED")
    error(Mlflow(world.token(world.member, ["jobs:write"])).get("runs/get", run_id=run_id), 403, "PERMISSION_DENIED")
    viewer = Mlflow(world.token(world.viewer, ["read"]))
    assert viewer.get("runs/get", run_id=run_id).status_code == 200
    outsider = Mlflow(world.token(world.outsider, ["read", "runs:write"], project=world.other_project))
    error(outsider.get("runs/get", run_id=run_id), 404, "RESOURCE_DOES_NOT_EXIST")
    error(outsider.post("runs/log-metric", {"run_id": run_id, **metric()}), 404, "RESOURCE_DOES_NOT_EXIST")


def test_deleted_runs_take_no_writes_until_restored(api, run_id):
    assert api.post("runs/delete", {"run_id": run_id}).status_code == 200
    assert "active" in error(api.post("runs/log-metric", {"run_id": run_id, **metric()}), 400,
                             "INVALID_PARAMETER_VALUE")
    assert api.post("runs/search", {"experiment_ids": ["0"]}).json().get("runs", []) == []
    assert api.post("runs/restore", {"run_id": run_id}).status_code == 200
    assert api.post("runs/log-metric", {"run_id": run_id, **metric()}).status_code == 200
    assert Run.objects.get(pk=run_id).lifecycle_stage == "active"


def test_wrong_method(api):
    response = api.post("runs/get", {})
    assert response.status_code == 405 and response.json()["error_code"] == "ENDPOINT_NOT_FOUND"


# Every endpoint, every kind of bad input ---------------------------------------------------------------

ARTIFACTS = "/mlflow/api/2.0/mlflow-artifacts/artifacts"
METHODS = {"GET", "POST", "PATCH", "DELETE", "PUT"}


def call(api: Mlflow, method: str, path: str, body=None):
    url = path if path.startswith("/") else P + path
    if method == "GET":
        return api.client.get(url, body or {}, **api.headers)
    if method == "PUT":
        return api.client.generic("PUT", url, body if isinstance(body, bytes) else b"data",
                                  content_type="application/octet-stream", **api.headers)
    data = body if isinstance(body, (str, bytes)) else json.dumps(body if body is not None else {})
    return api.client.generic(method, url, data, content_type="application/json", **api.headers)


def seed(api: Mlflow) -> tuple[str, str]:
    """A fresh Run with a metric, a param, a tag and an artifact: (experiment id, run id)."""
    created = api.post("runs/create", {"experiment_id": "0", "run_name": "seeded"})
    assert created.status_code == 200, created.content
    info = created.json()["run"]["info"]
    run, experiment = info["run_id"], info["experiment_id"]
    assert api.post("runs/log-batch", {"run_id": run, "metrics": [metric()], "params": [{"key": "lr", "value": "1"}],
                                       "tags": [{"key": "team", "value": "vision"}]}).status_code == 200
    assert call(api, "PUT", f"{ARTIFACTS}/{experiment}/{run}/artifacts/model.txt", b"weights").status_code == 200
    return experiment, run


def endpoints(experiment: str, run: str) -> list[tuple[str, str, dict]]:
    """Every tracking endpoint: (method, path, a valid body for the seeded Run)."""
    file = f"{ARTIFACTS}/{experiment}/{run}/artifacts/model.txt"
    return [
        ("POST", "experiments/create", {"name": "exp-new", "tags": [{"key": "k", "value": "v"}]}),
        ("GET", "experiments/get", {"experiment_id": experiment}),
        ("GET", "experiments/get-by-name", {"experiment_name": "Default"}),
        ("GET", "experiments/search", {"filter": "name = 'Default'", "max_results": "10", "view_type": "ALL"}),
        ("POST", "experiments/search", {"filter": "name LIKE 'D%'", "max_results": 10, "view_type": "ACTIVE_ONLY"}),
        ("POST", "runs/create", {"experiment_id": experiment, "run_name": "second", "start_time": 1700000000000,
                                 "tags": [{"key": "k", "value": "v"}]}),
        ("POST", "runs/update", {"run_id": run, "status": "FINISHED", "end_time": 1700000001000,
                                 "run_name": "renamed"}),
        ("POST", "runs/delete", {"run_id": run}),
        ("POST", "runs/restore", {"run_id": run}),
        ("GET", "runs/get", {"run_id": run}),
        ("POST", "runs/search", {"experiment_ids": [experiment], "filter": "metrics.loss < 2 and params.lr = '1'",
                                 "order_by": ["metrics.loss DESC"], "max_results": 10, "run_view_type": "ALL"}),
        ("POST", "runs/log-metric", {"run_id": run, **metric(step=1)}),
        ("POST", "runs/log-parameter", {"run_id": run, "key": "epochs", "value": "3"}),
        ("POST", "runs/set-tag", {"run_id": run, "key": "k", "value": "v"}),
        ("POST", "runs/delete-tag", {"run_id": run, "key": "team"}),
        ("POST", "runs/log-batch", {"run_id": run, "metrics": [metric(step=2)], "params": [{"key": "b", "value": "2"}],
                                    "tags": [{"key": "t", "value": "v"}]}),
        ("POST", "runs/log-inputs", {"run_id": run, "datasets": [
            {"dataset": {"name": "mnist", "digest": "abc123", "source_type": "local", "source": "{}"},
             "tags": [{"key": "mlflow.data.context", "value": "train"}]}]}),
        ("GET", "metrics/get-history", {"run_id": run, "metric_key": "loss", "max_results": "10"}),
        ("POST", "logged-models/search", {"experiment_ids": [experiment]}),
        ("GET", "artifacts/list", {"run_id": run, "path": ""}),
        ("GET", ARTIFACTS, {"path": f"{experiment}/{run}/artifacts"}),
        ("GET", file, {}),
        ("PUT", file, {}),
    ]


def state() -> tuple:
    """What a refused call must leave as it was."""
    from tracking.models import Experiment, LatestMetric, Param, RunInput, Tag
    return (sorted(Experiment.objects.values_list("name", "lifecycle_stage")),
            sorted(Run.objects.values_list("run_id", "name", "status", "lifecycle_stage", "end_time")),
            Metric.objects.count(), LatestMetric.objects.count(), sorted(Param.objects.values_list("key", "value")),
            sorted(Tag.objects.values_list("key", "value")), RunInput.objects.count())


@pytest.fixture
def seeded(api):
    return seed(api)


def test_every_endpoint_answers_its_valid_call(api):
    """The baseline the refusals below are measured against (a fresh Run for each)."""
    for method, path, valid in endpoints(*seed(api)):
        response = call(api, method, path, valid)
        assert response.status_code == 200, (method, path, response.content[:300])


@pytest.mark.parametrize("body", ["not json", "{", "[1, 2]", '"text"', "null", b"\xff\xfe{}",
                                  '{"run_id": ' + "[" * 1000 + "]" * 1000 + "}",
                                  '{"name": ' + '{"a": ' * 1000 + "1" + "}" * 1001,
                                  "[" * 100_000 + "]" * 100_000,
                                  '{"tags": ' + "[" * 20 + "]" * 20 + "}"])
def test_malformed_and_deeply_nested_bodies(api, seeded, body):
    before = state()
    for method, path, _valid in endpoints(*seeded):
        if method in ("GET", "PUT"):
            continue
        response = call(api, method, path, body)
        assert response.status_code == 400, (path, response.status_code, response.content[:300])
        assert response.json()["error_code"] in ("MALFORMED_REQUEST", "INVALID_PARAMETER_VALUE"), path
    assert state() == before


def _leaves(value, trail=()):
    """The paths to every string in a body (inside lists and objects too)."""
    if isinstance(value, str):
        yield trail
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*trail, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaves(item, (*trail, index))


def _replaced(body, trail, new):
    body = json.loads(json.dumps(body))
    holder = body
    for step in trail[:-1]:
        holder = holder[step]
    holder[trail[-1]] = new
    return body


@pytest.mark.parametrize("bad", ["\ud800", "a\udfffb", "nul\x00here"])
def test_nul_and_lone_surrogates_in_any_field(api, seeded, bad):
    """Text PostgreSQL cannot take, in every string of every body (names, run ids, keys, values, filters,
    order_by, dataset fields) and every query string: a 400 that says so, never a database error."""
    before = state()
    for method, path, valid in endpoints(*seeded):
        if method == "PUT" or (method == "GET" and "\x00" not in bad):
            continue  # a query string cannot carry a lone surrogate: Django decodes it to U+FFFD
        for trail in _leaves(valid):
            message = error(call(api, method, path, _replaced(valid, trail, bad)), 400, "INVALID_PARAMETER_VALUE")
            assert "NUL" in message and "surrogate" in message, (path, trail, message)
        if method != "GET":
            message = error(call(api, method, path, {**valid, bad: "x"}), 400, "INVALID_PARAMETER_VALUE")
            assert "NUL" in message
    for path in ("runs/search", "experiments/search"):
        for text in (f"name = '{bad}'", f"tags.`{bad}` = 'x'", f"params.lr = '{bad}'"):
            error(api.post(path, {"filter": text}), 400, "INVALID_PARAMETER_VALUE")
    assert state() == before


def test_nul_in_artifact_paths(api, seeded):
    experiment, run = seeded
    for method in ("PUT", "GET"):
        response = call(api, method, f"{ARTIFACTS}/{experiment}/{run}/artifacts/a%00b")
        assert response.status_code in (400, 404), (method, response.content)
    # Bytes that are not UTF-8 stay percent-encoded (Django), so they name a file, as any other name does
    broken = f"{ARTIFACTS}/{experiment}/{run}/artifacts/%ED%A0%80"
    assert call(api, "PUT", broken, b"half").status_code == 200
    assert b"".join(call(api, "GET", broken).streaming_content) == b"half"
    error(call(api, "GET", ARTIFACTS, {"path": f"{experiment}/{run}/artifacts/a\x00b"}), 400,
          "INVALID_PARAMETER_VALUE")


@pytest.mark.parametrize("wrong", [["a", "b"], {"a": 1}, True])
def test_wrong_types(api, seeded, wrong):
    before = state()
    for method, path, valid in endpoints(*seeded):
        if method == "PUT":
            continue
        for field in valid:
            if method == "GET":
                if not isinstance(wrong, list) or path.startswith("/") and field != "path":
                    continue
                if field == "view_type":
                    continue
            if isinstance(wrong, list) and field in ("experiment_ids", "order_by", "tags", "metrics", "params",
                                                     "datasets"):
                continue  # lists are these fields' type
            response = call(api, method, path, {**valid, field: wrong})
            assert response.status_code == 400, (method, path, field, response.content[:300])
            assert response.json()["error_code"] == "INVALID_PARAMETER_VALUE", (path, field)
    for field, wrong_item in (("tags", 5), ("tags", ["k"]), ("tags", {"key": 5, "value": "v"}), ("metrics", 5),
                              ("params", "p"), ("metrics", {"key": "k"})):
        error(api.post("runs/log-batch", {"run_id": seeded[1], field: [wrong_item]}), 400, "INVALID_PARAMETER_VALUE")
    for datasets in ([5], [{"dataset": 5}], [{"dataset": {"name": "d", "digest": "x"}, "tags": 5}],
                     [{"dataset": {"name": ["d"], "digest": "x"}}], [{"dataset": {"name": "d"}}]):
        error(api.post("runs/log-inputs", {"run_id": seeded[1], "datasets": datasets}), 400, "INVALID_PARAMETER_VALUE")
    assert state() == before


@pytest.mark.parametrize("experiment_id", ["\u00b2", "\u0661", "-1", "1.5", "x", str(2**63), "9" * 400, " 1"])
def test_odd_experiment_ids(api, seeded, experiment_id):
    before = state()
    error(api.get("experiments/get", experiment_id=experiment_id), 400, "INVALID_PARAMETER_VALUE")
    error(api.post("runs/search", {"experiment_ids": [experiment_id]}), 400, "INVALID_PARAMETER_VALUE")
    error(api.post("logged-models/search", {"experiment_ids": [experiment_id]}), 400, "INVALID_PARAMETER_VALUE")
    error(api.post("runs/create", {"experiment_id": experiment_id}), 400, "INVALID_PARAMETER_VALUE")
    assert state() == before


@pytest.mark.parametrize("token", ["%%%", "bm90IGpzb24=", base64.b64encode(b'{"offset": -1}').decode(),
                                   base64.b64encode(b'{"offset": "x"}').decode(), base64.b64encode(b"[1]").decode(),
                                   base64.b64encode(b'{"offset": 1e400}').decode(),
                                   base64.b64encode(b'{"offset": NaN}').decode(),
                                   base64.b64encode(b'{"offset": ' + b"[" * 5000 + b"]" * 5000 + b"}").decode(),
                                   base64.b64encode(json.dumps({"offset": 2**64}).encode()).decode(), "\u00e9\u00e9"])
def test_bad_page_tokens(api, seeded, token):
    for method, path, extra in (("GET", "experiments/search", {}), ("POST", "experiments/search", {}),
                                ("POST", "runs/search", {}),
                                ("GET", "metrics/get-history", {"run_id": seeded[1], "metric_key": "loss"})):
        message = error(call(api, method, path, {**extra, "page_token": token}), 400, "INVALID_PARAMETER_VALUE")
        assert "page token" in message, (path, message)


def test_paging_limits_and_far_pages(api, seeded):
    far = base64.b64encode(json.dumps({"offset": 2**63 - 1}).encode()).decode()
    history = {"run_id": seeded[1], "metric_key": "loss"}
    for method, path, limit, extra in (("GET", "experiments/search", 50000, {}),
                                       ("POST", "experiments/search", 50000, {}),
                                       ("POST", "runs/search", 50000, {}),
                                       ("GET", "metrics/get-history", None, history)):
        if limit:
            error(call(api, method, path, {**extra, "max_results": limit + 1}), 400, "INVALID_PARAMETER_VALUE")
        for bad in (-1, "x", 10**30, 1.5):
            error(call(api, method, path, {**extra, "max_results": bad}), 400, "INVALID_PARAMETER_VALUE")
        answer = call(api, method, path, {**extra, "page_token": far})
        assert answer.status_code == 200, (path, answer.content)
        assert all(not v for v in answer.json().values()), (path, answer.content)
    for body in ('{"max_results": NaN}', '{"max_results": Infinity}', '{"max_results": 1e400}'):
        error(api.post("runs/search", body), 400, "INVALID_PARAMETER_VALUE")


@pytest.mark.parametrize("text", ["name", "name =", "= 'x'", "name ~ 'x'", "name = 'x' OR name = 'y'",
                                  "name = 'x' AND", "(((", "'", "name IN ('x')", "foo = 'x'", "name = 5",
                                  "tags.t = 'x'", "\u00e9 = 'x'", "name = `x"])
def test_bad_experiment_filter_strings(api, seeded, text):
    for method in ("GET", "POST"):
        error(call(api, method, "experiments/search", {"filter": text}), 400, "INVALID_PARAMETER_VALUE")


@pytest.mark.parametrize("text", ["attributes.start_time > 1e400", "attributes.start_time = 'x'",
                                  "attributes.start_time IN ('1')", "metrics.loss = NaN", "metrics.loss IS NULL",
                                  "params.lr > 1", "attributes.artifact_uri = 'x'", "run_id IN ('a', 5)",
                                  "tags.t = ('a')", "metrics.`loss` >", "status = 'x' status = 'y'", "=" * 10_000])
def test_more_bad_run_filter_strings(api, seeded, text):
    error(api.post("runs/search", {"filter": text}), 400, "INVALID_PARAMETER_VALUE")


@pytest.mark.parametrize(("text", "found"), [("attributes.start_time > 99999999999999999999999", False),
                                             ("attributes.start_time < 99999999999999999999999", True),
                                             ("attributes.start_time > -99999999999999999999999", True),
                                             ("attributes.start_time >= 1.5", True),
                                             ("metrics.loss < 1e308", True), ("metrics.loss > -1e308", True),
                                             ("tags.team LIKE '" + "%_" * 3000 + "'", False),
                                             ("tags.team LIKE '%%%%%%vision%%%%'", True),
                                             ("attributes.status IN ()", False)])
def test_extreme_but_valid_run_filters(api, seeded, text, found):
    answer = api.post("runs/search", {"filter": text})
    assert answer.status_code == 200, (text, answer.content[:300])
    assert [r["info"]["run_id"] for r in answer.json().get("runs", [])] == ([seeded[1]] if found else []), text


@pytest.mark.parametrize("order", ["", "(((", "'", "`", "metrics.loss DESC DESC", "attributes.artifact_uri",
                                   "tags.", {"a": 1}, ["x"], "x" * 10_000])
def test_more_bad_order_by(api, seeded, order):
    error(api.post("runs/search", {"order_by": [order]}), 400, "INVALID_PARAMETER_VALUE")


def test_wrong_methods_on_every_endpoint(api, seeded):
    allowed: dict[str, set] = {}
    for method, path, _valid in endpoints(*seeded):
        allowed.setdefault(path, set()).add(method)
    allowed["experiments/search"] = {"GET", "POST"}
    for path, methods in allowed.items():
        for method in METHODS - methods:
            message = error(call(api, method, path, {}), 405, "ENDPOINT_NOT_FOUND")
            assert method in message, (path, message)


def test_over_long_names_keys_and_values(api, seeded):
    experiment, run = seeded
    before = state()
    k251 = "k" * 251
    for path, body in (("runs/log-metric", {"run_id": run, **metric(key=k251)}),
                       ("runs/log-parameter", {"run_id": run, "key": k251, "value": "1"}),
                       ("runs/set-tag", {"run_id": run, "key": k251, "value": "1"}),
                       ("runs/delete-tag", {"run_id": run, "key": k251}),
                       ("runs/log-batch", {"run_id": run, "metrics": [metric(key=k251)]}),
                       ("runs/log-batch", {"run_id": run, "params": [{"key": k251, "value": "1"}]}),
                       ("runs/log-batch", {"run_id": run, "tags": [{"key": k251, "value": "1"}]}),
                       ("runs/create", {"experiment_id": "0", "run_name": "n" * 251}),
                       ("runs/create", {"experiment_id": "0", "tags": [{"key": k251, "value": "v"}]}),
                       ("runs/update", {"run_id": run, "run_name": "n" * 251}),
                       ("experiments/create", {"name": "e" * 501}),
                       ("experiments/create", {"name": "e", "tags": [{"key": k251, "value": "v"}]}),
                       ("experiments/create", {"name": "e", "tags": [{"key": "k", "value": "v" * 20001}]}),
                       ("runs/log-inputs", {"run_id": run, "datasets": [{"dataset": {"name": "d" * 501,
                                                                                     "digest": "x"}}]}),
                       ("runs/log-inputs", {"run_id": run, "datasets": [{"dataset": {"name": "d",
                                                                                     "digest": "x" * 37}}]}),
                       ("runs/log-inputs", {"run_id": run, "datasets": [{"dataset": {"name": "d", "digest": "x"},
                                                                         "tags": [{"key": "k" * 256, "value": "v"}]}]}),
                       ("runs/get", None)):
        if body is None:
            error(api.get(path, run_id="r" * 300), 400, "INVALID_PARAMETER_VALUE")
            continue
        message = error(api.post(path, body), 400, "INVALID_PARAMETER_VALUE")
        assert "maximum length" in message or "exceeds" in message, (path, message)
    assert state() == before
    assert api.get("metrics/get-history", run_id=run, metric_key="m" * 10_000).json() == {"metrics": []}
    error(api.get("experiments/get-by-name", experiment_name="e" * 10_000), 404, "RESOURCE_DOES_NOT_EXIST")
    long_name = "a" * 300
    for method in ("GET", "PUT"):
        response = call(api, method, f"{ARTIFACTS}/{experiment}/{run}/artifacts/{long_name}")
        assert response.status_code in (400, 404), (method, response.status_code)
        assert response.json()["error_code"] in ("INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST")
    error(call(api, "GET", ARTIFACTS, {"path": f"{experiment}/{run}/artifacts/{long_name}"}), 400,
          "INVALID_PARAMETER_VALUE")
    error(call(api, "GET", "artifacts/list", {"run_id": run, "path": long_name}), 400, "INVALID_PARAMETER_VALUE")
    # A file where a directory is asked for
    error(call(api, "PUT", f"{ARTIFACTS}/{experiment}/{run}/artifacts/model.txt/inner"), 400,
          "INVALID_PARAMETER_VALUE")
    assert call(api, "GET", f"{ARTIFACTS}/{experiment}/{run}/artifacts/model.txt/inner").status_code == 404
    assert call(api, "GET", "artifacts/list", {"run_id": run, "path": "model.txt"}).json()["files"] == []


@pytest.mark.parametrize(("field", "literal"), [("timestamp", "NaN"), ("timestamp", "Infinity"), ("step", "NaN"),
                                                ("step", "-Infinity"), ("step", "1e400")])
def test_nan_and_infinity_where_mlflow_refuses_them(api, seeded, field, literal):
    before = state()
    run = seeded[1]
    body = json.dumps({"run_id": run, **metric()}).replace(f'"{field}": ' + str(metric()[field]), f'"{field}": {literal}')
    error(api.post("runs/log-metric", body), 400, "INVALID_PARAMETER_VALUE")
    for path, raw in (("runs/log-parameter", f'{{"run_id": "{run}", "key": "p", "value": {literal}}}'),
                      ("runs/set-tag", f'{{"run_id": "{run}", "key": "t", "value": {literal}}}'),
                      ("runs/update", f'{{"run_id": "{run}", "end_time": {literal}}}'),
                      ("runs/create", f'{{"experiment_id": "0", "start_time": {literal}}}'),
                      ("runs/create", f'{{"experiment_id": {literal}}}'),
                      ("experiments/create", f'{{"name": "e", "tags": [{{"key": "k", "value": {literal}}}]}}')):
        error(api.post(path, raw), 400, "INVALID_PARAMETER_VALUE")
    assert state() == before
    for literal_value in ("NaN", "Infinity", "-Infinity", "1e400"):  # metric values: MLflow keeps them
        raw = json.dumps({"run_id": run, **metric(key="odd")}).replace('"value": 1.0', f'"value": {literal_value}')
        assert api.post("runs/log-metric", raw).status_code == 200, literal_value


def test_a_body_over_the_upload_limit_gets_mlflows_error_shape(api, seeded, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    body = {"run_id": seeded[1], "params": [{"key": f"p{i}", "value": "v" * 100} for i in range(99)]}
    assert "over 10000 bytes" in error(api.post("runs/log-batch", body), 400, "INVALID_PARAMETER_VALUE")
