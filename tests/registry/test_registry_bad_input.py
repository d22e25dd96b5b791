"""Bad input to the model registry's MLflow endpoints (registered-models/…, model-versions/…) gets MLflow's
error body {"error_code", "message"} with MLflow's status, never a server error: malformed and deeply nested
JSON, wrong types, NUL and lone surrogates, over-long names, missing fields, unknown names and versions,
bad version numbers, page tokens, filters and order_by, wrong methods, and tokens that may not."""
from __future__ import annotations

import base64
import json

import pytest
from django.test import Client

from registry.models import ModelAlias, ModelVersion, RegisteredModel

P = "/mlflow/api/2.0/mlflow/"
WRITER = ["read", "runs:write", "registry:write"]
M, V = "registered-models/", "model-versions/"


class Mlflow:
    def __init__(self, token: str | None):
        self.client = Client()
        self.headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}

    def call(self, method: str, path: str, body=None):
        if method == "GET":
            return self.client.get(P + path, body or {}, **self.headers)
        data = body if isinstance(body, (str, bytes)) else json.dumps(body if body is not None else {})
        return self.client.generic(method, P + path, data, content_type="application/json", **self.headers)


def error(response, status: int, code: str) -> str:
    assert response.status_code == status, (response.status_code, response.content[:500])
    body = response.json()
    assert body["error_code"] == code and isinstance(body["message"], str) and body["message"], body
    return body["message"]


@pytest.fixture
def api(world):
    return Mlflow(world.token(world.member, WRITER))


@pytest.fixture
def run_id(api):
    response = api.call("POST", "runs/create", {"experiment_id": "0", "run_name": "train"})
    assert response.status_code == 200, response.content
    return response.json()["run"]["info"]["run_id"]


@pytest.fixture
def resnet(api, run_id):
    """Model resnet with version 1 (from run_id), tag team=vision on both, alias champion → v1."""
    assert api.call("POST", M + "create", {"name": "resnet", "tags": [{"key": "team", "value": "vision"}]}
                    ).status_code == 200
    created = api.call("POST", V + "create", {"name": "resnet", "source": f"runs:/{run_id}/model", "run_id": run_id,
                                              "tags": [{"key": "team", "value": "vision"}]})
    assert created.status_code == 200, created.content
    assert api.call("POST", M + "alias", {"name": "resnet", "alias": "champion", "version": "1"}).status_code == 200
    return run_id


def endpoints(run_id: str) -> list[tuple[str, str, dict, tuple[str, ...]]]:
    """Every registry endpoint: (method, path, a valid body for resnet v1, its required fields)."""
    v1 = {"name": "resnet", "version": "1"}
    return [
        ("POST", M + "create", {"name": "new-model", "description": "d"}, ("name",)),
        ("GET", M + "get", {"name": "resnet"}, ("name",)),
        ("POST", M + "rename", {"name": "resnet", "new_name": "resnet2"}, ("name", "new_name")),
        ("PATCH", M + "update", {"name": "resnet", "description": "d"}, ("name",)),
        ("DELETE", M + "delete", {"name": "resnet"}, ("name",)),
        ("GET", M + "search", {"filter": "name = 'resnet'"}, ()),
        ("POST", M + "search", {"filter": "name = 'resnet'", "order_by": ["name ASC"]}, ()),
        ("GET", M + "get-latest-versions", {"name": "resnet"}, ("name",)),
        ("POST", M + "get-latest-versions", {"name": "resnet", "stages": ["None"]}, ("name",)),
        ("POST", M + "set-tag", {"name": "resnet", "key": "k", "value": "v"}, ("name", "key", "value")),
        ("DELETE", M + "delete-tag", {"name": "resnet", "key": "team"}, ("name", "key")),
        ("POST", M + "alias", {"name": "resnet", "alias": "prod", "version": "1"}, ("name", "alias", "version")),
        ("GET", M + "alias", {"name": "resnet", "alias": "champion"}, ("name", "alias")),
        ("DELETE", M + "alias", {"name": "resnet", "alias": "champion"}, ("name", "alias")),
        ("POST", V + "create", {"name": "resnet", "source": f"runs:/{run_id}/model", "run_id": run_id},
         ("name", "source")),
        ("GET", V + "get", v1, ("name", "version")),
        ("PATCH", V + "update", {**v1, "description": "d"}, ("name", "version")),
        ("DELETE", V + "delete", v1, ("name", "version")),
        ("GET", V + "search", {"filter": "name = 'resnet'"}, ()),
        ("POST", V + "search", {"filter": "name = 'resnet'", "order_by": ["version_number DESC"]}, ()),
        ("POST", V + "transition-stage", {**v1, "stage": "Staging", "archive_existing_versions": False},
         ("name", "version", "stage")),
        ("GET", V + "get-download-uri", v1, ("name", "version")),
        ("POST", V + "set-tag", {**v1, "key": "k", "value": "v"}, ("name", "version", "key", "value")),
        ("DELETE", V + "delete-tag", {**v1, "key": "team"}, ("name", "version", "key")),
    ]


def each_endpoint(run_id, *, body=False):
    for method, path, valid, required in endpoints(run_id):
        if not body or method != "GET":
            yield method, path, valid, required


def state() -> tuple:
    """What a refused call must leave as it was."""
    return (sorted(RegisteredModel.objects.values_list("name", "description", "tags")),
            sorted(ModelVersion.objects.values_list("model__name", "version", "stage", "description", "tags")),
            sorted(ModelAlias.objects.values_list("alias", "version__version")))


def test_every_endpoint_answers_its_valid_call(api, resnet):
    """The baseline the refusals below are measured against: each valid body succeeds (fresh data each)."""
    for method, path, valid, _required in endpoints(resnet):
        RegisteredModel.objects.filter(name__in=["resnet", "resnet2", "new-model"]).delete()
        assert api.call("POST", M + "create", {"name": "resnet", "tags": [{"key": "team", "value": "v"}]}
                        ).status_code == 200
        assert api.call("POST", V + "create", {"name": "resnet", "source": "s3://b/m", "tags": [
            {"key": "team", "value": "v"}]}).status_code == 200
        assert api.call("POST", M + "alias", {"name": "resnet", "alias": "champion", "version": "1"}
                        ).status_code == 200
        response = api.call(method, path, valid)
        assert response.status_code == 200, (method, path, response.content)


@pytest.mark.parametrize("body", ["not json", "{", "[1, 2]", '"text"', "null", b"\xff\xfe{}",
                                  '{"name": ' + "[" * 1000 + "]" * 1000 + "}",
                                  '{"name": ' + '{"a": ' * 1000 + "1" + "}" * 1001,
                                  "[" * 100_000 + "]" * 100_000,
                                  '{"name": "resnet", "tags": ' + "[" * 20 + "]" * 20 + "}"])
def test_malformed_and_deeply_nested_bodies(api, resnet, body):
    before = state()
    for method, path, _valid, _required in each_endpoint(resnet, body=True):
        response = api.call(method, path, body)
        assert response.status_code == 400, (method, path, response.status_code, response.content[:300])
        assert response.json()["error_code"] in ("MALFORMED_REQUEST", "INVALID_PARAMETER_VALUE"), (path, response)
    assert state() == before


@pytest.mark.parametrize("bad", ["\ud800", "a\udfffb", "nul\x00here"])
def test_nul_and_lone_surrogates_in_any_field(api, resnet, bad):
    """Text PostgreSQL cannot take: in every string field, in tag keys and values, and in query strings."""
    before = state()
    for method, path, valid, _required in endpoints(resnet):
        fields = [f for f, v in valid.items() if isinstance(v, str)] + (["tags"] if path.endswith("create") else [])
        for field in fields:
            value = [{"key": bad, "value": "v"}] if field == "tags" else bad
            if method == "GET" and "\x00" not in bad:
                continue  # a query string cannot carry a lone surrogate: Django decodes it to U+FFFD
            message = error(api.call(method, path, {**valid, field: value}), 400, "INVALID_PARAMETER_VALUE")
            assert "NUL" in message and "surrogate" in message
    for method, path, valid, _required in each_endpoint(resnet, body=True):
        error(api.call(method, path, {**valid, "tags": [{"key": "k", "value": bad}]}), 400, "INVALID_PARAMETER_VALUE")
    assert state() == before


@pytest.mark.parametrize("wrong", [["resnet"], {"a": 1}, True, 1.5])
def test_wrong_types(api, resnet, wrong):
    before = state()
    for method, path, valid, _required in each_endpoint(resnet, body=True):
        for field in valid:
            if field == "archive_existing_versions" and isinstance(wrong, bool):
                continue  # a boolean is this field's type
            response = api.call(method, path, {**valid, field: wrong})
            assert response.status_code == 400, (method, path, field, response.content)
            assert response.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    error(api.call("POST", M + "create", {"name": "x", "tags": {"k": "v"}}), 400, "INVALID_PARAMETER_VALUE")
    error(api.call("POST", M + "create", {"name": "x", "tags": [{"key": 5, "value": "v"}]}), 400,
          "INVALID_PARAMETER_VALUE")
    error(api.call("POST", M + "create", {"name": "x", "tags": ["k"]}), 400, "INVALID_PARAMETER_VALUE")
    error(api.call("GET", M + "get", {"name": ["a", "b"]}), 400, "INVALID_PARAMETER_VALUE")
    assert state() == before


def test_missing_required_fields(api, resnet):
    before = state()
    for method, path, valid, required in endpoints(resnet):
        for field in required:
            body = {k: v for k, v in valid.items() if k != field}
            message = error(api.call(method, path, body), 400, "INVALID_PARAMETER_VALUE")
            assert field in message, (path, field, message)
            if field != "value":  # an empty tag value is a value
                error(api.call(method, path, {**body, field: ""}), 400, "INVALID_PARAMETER_VALUE")
    assert state() == before


def test_over_long_and_invalid_names(api, resnet):
    message = error(api.call("POST", M + "create", {"name": "m" * 257}), 400, "INVALID_PARAMETER_VALUE")
    assert "256" in message
    assert api.call("POST", M + "create", {"name": "m" * 256}).status_code == 200
    for name in ("a/b", "a:b", "tab\there", "   "):
        error(api.call("POST", M + "create", {"name": name}), 400, "INVALID_PARAMETER_VALUE")
    error(api.call("POST", M + "rename", {"name": "resnet", "new_name": "n" * 257}), 400, "INVALID_PARAMETER_VALUE")
    error(api.call("POST", M + "create", {"name": "resnet"}), 400, "RESOURCE_ALREADY_EXISTS")
    error(api.call("POST", M + "rename", {"name": "m" * 256, "new_name": "resnet"}), 400, "RESOURCE_ALREADY_EXISTS")
    error(api.call("GET", M + "get", {"name": "x" * 10_000}), 404, "RESOURCE_DOES_NOT_EXIST")
    error(api.call("POST", M + "set-tag", {"name": "resnet", "key": "k" * 251, "value": "v"}), 400,
          "INVALID_PARAMETER_VALUE")
    error(api.call("POST", M + "set-tag", {"name": "resnet", "key": "k", "value": "v" * 5001}), 400,
          "INVALID_PARAMETER_VALUE")
    error(api.call("PATCH", M + "update", {"name": "resnet", "description": "d" * 100_001}), 400,
          "INVALID_PARAMETER_VALUE")
    for alias in ("latest", "v3", "V12", "has space", "a" * 257, "dots.no"):
        error(api.call("POST", M + "alias", {"name": "resnet", "alias": alias, "version": "1"}), 400,
              "INVALID_PARAMETER_VALUE")
    error(api.call("POST", V + "create", {"name": "resnet", "source": "s" * 5001}), 400, "INVALID_PARAMETER_VALUE")
    error(api.call("POST", V + "transition-stage", {"name": "resnet", "version": "1", "stage": "Live"}), 400,
          "INVALID_PARAMETER_VALUE")
    error(api.call("POST", V + "transition-stage", {"name": "resnet", "version": "1", "stage": "Staging",
                                                    "archive_existing_versions": "maybe"}), 400,
          "INVALID_PARAMETER_VALUE")
    error(api.call("POST", M + "get-latest-versions", {"name": "resnet", "stages": ["Live"]}), 400,
          "INVALID_PARAMETER_VALUE")
    assert ModelVersion.objects.get(version=1).stage == "None"


def test_unknown_names_versions_aliases_and_runs(api, resnet):
    before = state()
    for method, path, valid, _required in endpoints(resnet):
        if "name" in valid and not path.endswith(("search", M + "create")):
            error(api.call(method, path, {**valid, "name": "nope"}), 404, "RESOURCE_DOES_NOT_EXIST")
        if "version" in valid:
            error(api.call(method, path, {**valid, "version": "99"}), 404, "RESOURCE_DOES_NOT_EXIST")
            error(api.call(method, path, {**valid, "version": str(2**31 - 1)}), 404, "RESOURCE_DOES_NOT_EXIST")
    error(api.call("GET", M + "alias", {"name": "resnet", "alias": "nobody"}), 404, "RESOURCE_DOES_NOT_EXIST")
    error(api.call("DELETE", M + "delete-tag", {"name": "resnet", "key": "nope"}), 404, "RESOURCE_DOES_NOT_EXIST")
    error(api.call("DELETE", V + "delete-tag", {"name": "resnet", "version": "1", "key": "nope"}), 404,
          "RESOURCE_DOES_NOT_EXIST")
    error(api.call("POST", V + "create", {"name": "resnet", "source": "s3://b/m", "run_id": "0" * 32}), 404,
          "RESOURCE_DOES_NOT_EXIST")
    for run_id in ("bad id!", "../x", "a" * 300):
        error(api.call("POST", V + "create", {"name": "resnet", "source": "s3://b/m", "run_id": run_id}), 400,
              "INVALID_PARAMETER_VALUE")
    assert state() == before


@pytest.mark.parametrize("version", ["-1", "0", "1.5", "abc", "1e3", " 1", "²", "١", str(2**31), str(2**63),
                                     "9" * 400])
def test_negative_huge_and_odd_version_numbers(api, resnet, version):
    before = state()
    for method, path, valid, _required in endpoints(resnet):
        if "version" in valid:
            message = error(api.call(method, path, {**valid, "version": version}), 400, "INVALID_PARAMETER_VALUE")
            assert "version" in message
    assert state() == before


@pytest.mark.parametrize("token", ["%%%", "bm90IGpzb24=", base64.b64encode(b'{"offset": -1}').decode(),
                                   base64.b64encode(b'{"offset": "x"}').decode(), base64.b64encode(b"[1]").decode(),
                                   base64.b64encode(b'{"offset": 1e400}').decode(), "\u00e9\u00e9"])
def test_bad_page_tokens(api, resnet, token):
    for method in ("GET", "POST"):
        for path in (M + "search", V + "search"):
            message = error(api.call(method, path, {"page_token": token}), 400, "INVALID_PARAMETER_VALUE")
            assert "page token" in message


def test_paging_limits_and_far_pages(api, resnet):
    far = base64.b64encode(json.dumps({"offset": 2**63 - 1}).encode()).decode()
    for path, limit in ((M + "search", 1000), (V + "search", 200_000)):
        for method in ("GET", "POST"):
            error(api.call(method, path, {"max_results": limit + 1}), 400, "INVALID_PARAMETER_VALUE")
            for bad in (-1, "x", 10**30, 1.5):
                error(api.call(method, path, {"max_results": bad}), 400, "INVALID_PARAMETER_VALUE")
            answer = api.call(method, path, {"page_token": far})
            assert answer.status_code == 200 and list(answer.json().values()) in ([], [[]]), answer.content
    api.call("POST", M + "create", {"name": "bert"})
    first = api.call("GET", M + "search", {"max_results": 1}).json()
    second = api.call("GET", M + "search", {"max_results": 1, "page_token": first["next_page_token"]}).json()
    assert [m["name"] for m in first["registered_models"] + second["registered_models"]] == ["bert", "resnet"]


@pytest.mark.parametrize("text", ["name", "name =", "= 'x'", "name ~ 'x'", "name = 'x' OR name = 'y'",
                                  "name = 'x' AND", "name = 'x' and", "(((", "'", "name IN 'x'", "name IN ('x'",
                                  "foo = 'x'", "params.lr = '1'", "tags.team > 'a'", "tags.team = ('a')",
                                  "tags.team IN ('a')", "name = 'x' name = 'y'", "\u00e9 = 'x'", "name = `x"])
def test_bad_model_filter_strings(api, resnet, text):
    for method in ("GET", "POST"):
        error(api.call(method, M + "search", {"filter": text}), 400, "INVALID_PARAMETER_VALUE")


@pytest.mark.parametrize("text", ["version_number > 'x'", "version_number = 1.5", "version_number LIKE '1'",
                                  "version_number IN (1, 2)", "run_id > 'a'", "name = 'resnet' AND",
                                  "source_path ~ 'x'", "foo = 'x'", "version_number = ²"])
def test_bad_version_filter_strings(api, resnet, text):
    error(api.call("POST", V + "search", {"filter": text}), 400, "INVALID_PARAMETER_VALUE")


@pytest.mark.parametrize("key", ["isnull", "contains", "exact", "has_key", "in", "a__b", "a b", "x'y", "gt"])
def test_tag_keys_are_keys_not_lookups(api, resnet, key):
    """A tag key that reads like a Django lookup is still just a key: found when set, nothing else."""
    assert api.call("POST", M + "set-tag", {"name": "resnet", "key": key, "value": "yes"}).status_code == 200
    quoted = f"tags.`{key}`"
    for text, expected in ((f"{quoted} = 'yes'", ["resnet"]), (f"{quoted} = 'no'", []),
                           (f"{quoted} != 'no'", ["resnet"]), (f"{quoted} LIKE 'y%'", ["resnet"]),
                           (f"{quoted} ILIKE 'Y_S'", ["resnet"]), ("tags.`unset` != 'x'", ["resnet"])):
        answer = api.call("POST", M + "search", {"filter": text})
        assert answer.status_code == 200, (text, answer.content)
        assert [m["name"] for m in answer.json().get("registered_models", [])] == expected, text


def test_version_filters_with_huge_numbers_match_nothing(api, resnet):
    for text, expected in (("version_number = 99999999999999999999", []), ("version_number < 99999999999999999999",
                                                                            ["1"]),
                           ("version_number > -5", ["1"]), ("tags.team = 'vision'", ["1"])):
        answer = api.call("POST", V + "search", {"filter": text})
        assert answer.status_code == 200, (text, answer.content)
        assert [v["version"] for v in answer.json()["model_versions"]] == expected, text


@pytest.mark.parametrize("order", ["nonsense", "name sideways", "name ASC DESC", "", 5, {"a": 1}])
def test_bad_order_by(api, resnet, order):
    for path in (M + "search", V + "search"):
        error(api.call("POST", path, {"order_by": [order]}), 400, "INVALID_PARAMETER_VALUE")


def test_wrong_methods(api, resnet):
    allowed: dict[str, set] = {}
    for method, path, _valid, _required in endpoints(resnet):
        allowed.setdefault(path, set()).add(method)
    for path, methods in allowed.items():
        for method in {"GET", "POST", "PATCH", "DELETE", "PUT"} - methods:
            message = error(api.call(method, path, {}), 405, "ENDPOINT_NOT_FOUND")
            assert method in message
    error(api.call("POST", M + "nothing", {}), 404, "ENDPOINT_NOT_FOUND")


def test_who_may_call(world, resnet, running_job):
    before = state()
    for method, path, valid, _required in endpoints(resnet):
        write = method != "GET" and not path.endswith(("search", "get-latest-versions"))
        error(Mlflow(None).call(method, path, valid), 401, "UNAUTHENTICATED")
        reader = Mlflow(world.token(world.viewer, ["read"]))
        if write:
            assert "registry:write" in error(reader.call(method, path, valid), 403, "PERMISSION_DENIED")
            error(Mlflow(world.token(world.member, ["read", "runs:write"])).call(method, path, valid), 403,
                  "PERMISSION_DENIED")
        else:
            assert reader.call(method, path, valid).status_code == 200, (path, method)
            error(Mlflow(world.token(world.member, ["runs:write"])).call(method, path, valid), 403,
                  "PERMISSION_DENIED")
        outsider = Mlflow(world.token(world.outsider, ["read", "registry:write"], project=world.other_project))
        if "name" in valid and not path.endswith(("search", M + "create")):
            error(outsider.call(method, path, valid), 404, "RESOURCE_DOES_NOT_EXIST")
    # Unknown tokens from one address are throttled after a few tries, so one is enough to show the 401.
    error(Mlflow("mmt_not-a-token").call("POST", M + "create", {"name": "x"}), 401, "UNAUTHENTICATED")
    assert state() == before

    _job, item, _worker = running_job
    job = Mlflow(item["job_token"])
    for method, path, valid, _required in endpoints(resnet):
        if method != "GET" and not path.endswith(("search", "get-latest-versions", M + "create")):
            message = error(job.call(method, path, valid), 403, "PERMISSION_DENIED")
            assert "job token" in message.lower() or "its own Job's Run" in message, (path, message)
        elif method == "GET":
            assert job.call(method, path, valid).status_code == 200, path
    assert state() == before
    assert job.call("POST", M + "create", {"name": "from-job"}).status_code == 200
    own = job.call("POST", V + "create", {"name": "from-job", "source": f"runs:/{item['run_id']}/m",
                                          "run_id": item["run_id"]})
    assert own.status_code == 200, own.content
    assert job.call("POST", V + "set-tag", {"name": "from-job", "version": "1", "key": "k", "value": "v"}
                    ).status_code == 200
    error(job.call("POST", V + "create", {"name": "from-job", "source": "s3://b/m"}), 403, "PERMISSION_DENIED")
