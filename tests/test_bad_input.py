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
    assert_error(response, 422)
    assert SiteSettings.objects.filter(target=target).values().get() == before
    created = session(world.global_admin).post("/api/sites", data=json.dumps(site_fields(name="other"))[:-1] + ", "
                                               + raw[1:], content_type="application/json")
    assert 400 <= created.status_code < 500, created.content


@pytest.mark.parametrize("key", ["²", "٣", "9" * 30])
def test_dataset_keys_that_are_not_ascii_numbers_get_404(world, key):
    response = session(world.member).get(f"/api/projects/lab/datasets/{key}")
    assert_error(response, 404)
