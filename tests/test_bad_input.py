"""Malformed input gets a 4xx with the error body, never a 500 (found by probing every endpoint)."""
from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from computers.models import ComputeTarget
from mado import services
from mado.choices import Role
from tests.computer_fixtures import ScriptedWorker
from tests.conftest import assert_error
from tests.job_fixtures import JobWorker, gpu_computer, job_request
from tests.sites.conftest import host_keys, launcher, site_fields  # noqa: F401  (fixtures)


def session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


@pytest.mark.parametrize("extra", [
    {"computer": "²"}, {"computer": 10**30}, {"computer": [1]}, {"walltime_seconds": "²"},
    {"walltime_seconds": 10**30}, {"name": "job\u0000x"}, {"parameters": {"a": "\u0000"}},
    {"gpu_ids": [{}]}, {"env": {"A": 1}}, {"input_datasets": ["²"]}, {"input_datasets": ["٣"]},
])
def test_bad_job_requests_get_4xx(world, gpu_box, extra):
    response = session(world.member).post("/api/projects/lab/jobs", job_request(gpu_box, **extra), format="json")
    assert 400 <= response.status_code < 500, response.content
    assert_error(response, response.status_code)


@pytest.mark.parametrize("body", [
    {"runtimes": [{}]}, {"runtimes": "python"}, {"gpu_ids": [True]}, {"enabled": "false"}, {"port": "²"},
    {"concurrency": 10**30}, {"host": "a\u0000b"}, {"dataset_cache_limit_gib": 10**12},
])
def test_bad_computer_changes_get_4xx_and_change_nothing(world, gpu_box, body):
    before = ComputeTarget.objects.filter(pk=gpu_box.pk).values().get()
    response = session(world.global_admin).patch(f"/api/computers/{gpu_box.pk}", body, format="json")
    assert_error(response, response.status_code)
    assert 400 <= response.status_code < 500
    assert ComputeTarget.objects.filter(pk=gpu_box.pk).values().get() == before


@pytest.mark.parametrize("call,body", [
    ("logs", {"chunks": [{"stream": "stdout", "offset": "²", "data": "x"}]}),
    ("logs", {"chunks": [{"stream": "stdout", "offset": 10**30, "data": "x"}]}),
    ("metrics", {"metrics": [{"name": "m", "value": 10**400, "step": 1}]}),
    ("metrics", {"metrics": [{"name": "m", "value": 1.0, "step": "²"}]}),
    ("metrics", {"metrics": [{"name": "m", "value": 1.0, "timestamp": "2024-02-30T00:00:00"}]}),
    ("metrics", {"metrics": "loss"}),
    ("complete", {"status": "failed", "exit_code": "²"}),
    ("complete", {"status": "failed", "exit_code": 10**20}),
])
def test_bad_worker_calls_get_4xx(world, gpu_box, job_worker, call, body):
    session(world.member).post("/api/projects/lab/jobs", job_request(gpu_box), format="json")
    item = job_worker.claim()
    response = job_worker.leased(item, call, **body)
    assert_error(response, response.status_code)
    assert 400 <= response.status_code < 500


@pytest.mark.parametrize("result", [
    {"items": 5}, {"machine": "x"}, {"machine": {"arch": [1]}}, {"pythons": 7}, {"gpus": [1, 2]},
])
def test_malformed_check_results_get_422_and_nothing_is_stored(world, gpu_box, result):
    worker = ScriptedWorker(world.worker_token)
    worker.hello()
    session(world.global_admin).post(f"/api/computers/{gpu_box.pk}/checks", {"worker_id": worker.worker_id},
                                     format="json")
    item = worker.claim_check()
    assert_error(worker.complete_check(item, result=result), 422)


def test_hello_refuses_huge_target_ids_and_non_string_fields(world):
    worker = ScriptedWorker(world.worker_token, target_ids=[10**30])
    assert_error(worker.hello(), 422)
    body = assert_error(worker.post("/api/worker/hello", {"version": [], "hostname": {}}), 422, "missing_fields")
    assert set(body["fields"]) == {"version", "hostname"}


def test_a_claim_before_hello_is_refused_with_422_and_leaves_no_worker(world, gpu_box):
    from workers.models import Worker

    response = JobWorker(world.worker_token, "no-hello").post("/api/worker/claim", {"active_job_ids": []})
    assert_error(response, 422, "hello_required")
    assert not Worker.objects.filter(worker_id="no-hello").exists()


def test_unknown_api_paths_answer_json_even_for_posts(world):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(world.member)
    body = assert_error(client.post("/api/jobs/abc/stop"), 404, "not_found")
    assert "/api/docs/" in body["error"]


def test_nul_characters_in_json_are_refused_up_front(world):
    body = assert_error(session(world.project_admin).post(
        "/api/projects/lab/service-accounts", data=json.dumps({"name": "a\u0000b", "role": "admin"}),
        content_type="application/json"), 400)
    assert "NUL" in body["error"]


def test_a_local_computer_can_be_disabled_outside_development_mode(world, settings):
    settings.DEV_MODE = True
    local = ComputeTarget.objects.create(owner=world.global_admin, name="here", kind="local", enabled=True,
                                         working_dir="/w", python_path="/usr/bin/python3")
    settings.DEV_MODE = False
    response = session(world.global_admin).patch(f"/api/computers/{local.pk}", {"enabled": False}, format="json")
    assert response.status_code == 200 and response.json()["enabled"] is False


def test_a_worker_of_another_owner_never_takes_unnamed_checks_of_computers_it_does_not_serve(world):
    """A worker set up by an outsider lists root's Private computer in its target ids: it still gets
    nothing (a Private computer runs the jobs of its owner and of the service accounts the owner created)."""
    roots = gpu_computer(world.global_admin, "root-box", visibility="private")
    account = services.create_service_account(services.Actor(world.outsider), world.other_project, name="evil",
                                              role=Role.ADMIN)
    token = world.token(account.user, ["read", "worker:execute"], project=world.other_project, kind="service")
    evil = ScriptedWorker(token, "evil", target_ids=[roots.pk])
    evil.hello()
    session(world.global_admin).post(f"/api/computers/{roots.pk}/checks", {}, format="json")
    assert evil.claim_check() is None
    session(world.member).post("/api/projects/lab/jobs", job_request(roots), format="json")
    assert JobWorker(token, "evil").claim() is None


def test_a_large_but_legal_outputs_body_is_read(world, gpu_box, job_worker, settings, tmp_path):
    """A manifest of thousands of lines travels in the outputs body; 3 MB must not be refused as too big."""
    settings.MEDIA_ROOT = tmp_path
    session(world.member).post("/api/projects/lab/jobs", job_request(gpu_box), format="json")
    item = job_worker.claim()
    response = job_worker.leased(item, "outputs", result="{}", files=[], manifest="x" * 3_000_000)
    assert response.status_code == 422 and response.json()["code"] != "bad_request"


@pytest.mark.parametrize("raw", ['{"port": 1e999}', '{"max_active_submissions": 1e999}',
                                 '{"queue_timeout_seconds": -1e999}', '{"launcher": "²"}', '{"port": "٣"}'])
def test_bad_site_changes_get_4xx_and_change_nothing(world, site_fields, raw):
    from sites import services as site_services
    from sites.models import SiteSettings

    target = site_services.create_site(services.Actor(world.global_admin), site_fields())
    before = SiteSettings.objects.filter(target=target).values().get()
    response = session(world.global_admin).patch(f"/api/sites/{target.pk}", data=raw, content_type="application/json")
    assert_error(response, 400 if "e999" in raw else 422)  # numbers beyond a double are refused by the parser
    assert SiteSettings.objects.filter(target=target).values().get() == before
    created = session(world.global_admin).post("/api/sites", data=json.dumps(site_fields(name="other"))[:-1] + ", "
                                               + raw[1:], content_type="application/json")
    assert 400 <= created.status_code < 500, created.content


@pytest.mark.parametrize("key", ["²", "٣", "9" * 30])
def test_dataset_keys_that_are_not_ascii_numbers_get_404(world, key):
    response = session(world.member).get(f"/api/projects/lab/datasets/{key}")
    assert_error(response, 404)


# Issue 14: inputs that answered 500 ---------------------------------------------------------------

def nested(depth: int) -> str:
    """A JSON value `depth` arrays deep, as raw text (json.dumps itself would recurse)."""
    return "[" * depth + "]" * depth


def raw_post(client: APIClient, path: str, text: str, method: str = "post"):
    return getattr(client, method)(path, data=text, content_type="application/json")


def test_json_nested_a_thousand_deep_is_refused_with_400_on_every_kind_of_endpoint(world, gpu_box, job_worker):
    deep = '{"a": ' + nested(1000) + "}"
    calls = [
        (session(world.member), "/api/projects/lab/jobs", "post"),
        (session(world.global_admin), f"/api/computers/{gpu_box.pk}", "patch"),
        (session(world.global_admin), "/api/computers", "post"),
        (session(world.member), "/api/projects/lab/datasets", "post"),
        (session(world.project_admin), "/api/projects/lab/tokens", "post"),
        (job_worker.client, "/api/worker/hello", "post"),
        (job_worker.client, "/api/worker/claim", "post"),
    ]
    for client, path, method in calls:
        body = assert_error(raw_post(client, path, deep, method), 400, "nesting_too_deep")
        assert "64" in body["error"], body


def test_job_parameters_may_nest_64_levels_but_not_65(world, gpu_box):
    def request_with(depth: int) -> str:  # the body object and its parameters object are two levels
        return json.dumps(job_request(gpu_box))[:-1] + ', "parameters": {"p": ' + nested(depth - 2) + "}}"

    client = session(world.member)
    assert raw_post(client, "/api/projects/lab/jobs", request_with(64)).status_code == 201
    assert_error(raw_post(client, "/api/projects/lab/jobs", request_with(65)), 400, "nesting_too_deep")


@pytest.mark.parametrize("number", ["1e999", "-1e999", "1E400"])
def test_numbers_beyond_a_double_are_refused_with_400_before_they_reach_a_json_column(world, gpu_box, number):
    from jobs.models import Job

    text = json.dumps(job_request(gpu_box))[:-1] + f', "parameters": {{"lr": {number}}}}}'
    body = assert_error(raw_post(session(world.member), "/api/projects/lab/jobs", text), 400, "number_out_of_range")
    assert number in body["error"]
    assert not Job.objects.exists()


SURROGATE = "x\ud800y"


@pytest.mark.parametrize("extra", [{"name": SURROGATE}, {"command": ["python", SURROGATE]},
                                   {"env": {"A": SURROGATE}}, {"env": {SURROGATE: "1"}},
                                   {"parameters": {"lr": [SURROGATE]}}])
def test_lone_surrogates_in_a_job_request_are_refused_with_400(world, gpu_box, extra):
    from jobs.models import Job

    text = json.dumps(job_request(gpu_box, **extra))  # json.dumps writes a lone surrogate as the escape \ud800
    assert "\\ud800" in text
    body = assert_error(raw_post(session(world.member), "/api/projects/lab/jobs", text), 400, "invalid_characters")
    assert "surrogate" in body["error"]
    assert not Job.objects.exists()


def test_a_lone_low_surrogate_is_refused_but_a_surrogate_pair_is_a_character(world, gpu_box):
    client = session(world.member)
    assert_error(raw_post(client, "/api/projects/lab/jobs", json.dumps(job_request(gpu_box, name="a\udc00"))), 400,
                 "invalid_characters")
    pair = raw_post(client, "/api/projects/lab/jobs", json.dumps(job_request(gpu_box, name="smile \U0001F600")))
    assert pair.status_code == 201 and pair.json()["name"] == "smile \U0001F600"


def test_lone_surrogates_are_refused_in_datasets_hello_and_computers(world, gpu_box):
    admin = session(world.global_admin)
    calls = [
        (session(world.member), "/api/projects/lab/datasets", {"name": "speech", "description": SURROGATE}, "post"),
        (ScriptedWorker(world.worker_token).client, "/api/worker/hello",
         {"worker_id": "w1", "version": "1", "hostname": SURROGATE}, "post"),
        (admin, "/api/computers", {"name": "new-box", "host": "h.example", "ssh_user": "u",
                                   "working_dir": "/w" + SURROGATE}, "post"),
        (admin, f"/api/computers/{gpu_box.pk}", {"working_dir": "/w" + SURROGATE}, "patch"),
    ]
    before = ComputeTarget.objects.filter(pk=gpu_box.pk).values().get()
    for client, path, body, method in calls:
        assert_error(raw_post(client, path, json.dumps(body), method), 400, "invalid_characters")
    assert ComputeTarget.objects.filter(pk=gpu_box.pk).values().get() == before
    assert ComputeTarget.objects.count() == 1


@pytest.fixture
def claimed(world, gpu_box, job_worker):
    session(world.member).post("/api/projects/lab/jobs", job_request(gpu_box), format="json")
    item = job_worker.claim()
    job_worker.heartbeat(item, "running")
    return item


@pytest.mark.parametrize("call,body", [
    ("logs", {"chunks": [{"stream": "app", "offset": 0, "data": SURROGATE}]}),
    ("metrics", {"metrics": [{"name": SURROGATE, "value": 1.0, "step": 1}]}),
])
def test_lone_surrogates_in_job_token_logs_and_metrics_are_refused(claimed, call, body):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {claimed['job_token']}")
    assert_error(raw_post(client, f"/api/jobs/{claimed['id']}/{call}", json.dumps(body)), 400, "invalid_characters")


@pytest.mark.parametrize("body", [
    {"result": '{"version": 2, "note": "\ud800"}', "files": []},
    {"result": "{}", "files": [{"path": SURROGATE, "size": 1}]},
    {"result": "{}", "files": [], "manifest": SURROGATE},
])
def test_lone_surrogates_in_worker_outputs_are_refused(claimed, job_worker, body):
    text = json.dumps({"worker_id": job_worker.worker_id, "lease_id": claimed["lease_id"], **body})
    assert_error(raw_post(job_worker.client, f"/api/worker/jobs/{claimed['id']}/outputs", text), 400,
                 "invalid_characters")


@pytest.mark.parametrize("stamp", ["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59",
                                   "9999-12-31T23:59:59.999999-00:01"])
def test_metric_timestamps_beyond_the_representable_range_get_422(claimed, job_worker, stamp):
    point = {"name": "loss", "value": 1.0, "step": 1, "timestamp": stamp}
    assert_error(job_worker.leased(claimed, "metrics", metrics=[point]), 422, "invalid_metric")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {claimed['job_token']}")
    assert_error(client.post(f"/api/jobs/{claimed['id']}/metrics", {"metrics": [point]}, format="json"), 422,
                 "invalid_metric")


def test_site_checks_of_a_computer_that_is_not_a_site_are_404(world, gpu_box):
    from computers.models import ConnectionCheck

    client = session(world.global_admin)
    assert client.post(f"/settings/computers/{gpu_box.pk}/site-checks", {"mine": "0"}).status_code == 404
    check = ConnectionCheck.objects.create(target=gpu_box, requested_by=world.global_admin)
    assert client.get(f"/settings/computers/{gpu_box.pk}/site-checks/{check.pk}").status_code == 404
    assert client.get(f"/settings/computers/{gpu_box.pk}/site-checks/{check.pk + 1}").status_code == 404


def test_answers_that_carry_a_new_token_are_never_cached(world):
    personal = session(world.member).post("/api/projects/lab/tokens", {"scopes": ["read"]}, format="json")
    assert personal.status_code == 201 and personal["Cache-Control"] == "no-store"
    account = world.service_account
    issued = session(world.project_admin).post(f"/api/projects/lab/service-accounts/{account.pk}/tokens",
                                               {"scopes": ["read"]}, format="json")
    assert issued.status_code == 201 and issued["Cache-Control"] == "no-store"


def test_dataset_cache_counts_beyond_32_bits_get_422(claimed, job_worker):
    """Found by the fuzzer (tests/test_fuzz_schema.py): the report's count columns are 32-bit."""
    usage = {"used_bytes": 2**40, "limit_bytes": 2**41, "complete_count": 2**31, "pinned_count": 0}
    assert_error(job_worker.leased(claimed, "dataset-cache", usage=usage), 422, "invalid_usage")
    assert job_worker.leased(claimed, "dataset-cache", usage={**usage, "complete_count": 2**31 - 1}).status_code == 200
