"""Worker presence: hello, online window, and who sees which workers."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from tests.computer_fixtures import ScriptedWorker
from tests.conftest import assert_error, bearer
from workers.models import Worker


def session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def test_hello_stores_the_workers_presence(world):
    worker = ScriptedWorker(world.worker_token, "lab-worker-1", target_ids=[3, 5])
    assert worker.hello().status_code == 200
    row = Worker.objects.get(worker_id="lab-worker-1")
    assert row.project == world.project and row.hostname == "worker-host" and row.target_ids == [3, 5]
    assert row.ssh_key_candidates == ["/home/worker/.ssh/mmt_worker_ed25519"]
    assert row.is_online


def test_hello_names_every_missing_field(world):
    response = bearer(world.worker_token).post("/api/worker/hello", {"parallel_jobs": 2}, format="json")
    body = assert_error(response, 422, "missing_fields")
    assert set(body["fields"]) == {"worker_id", "version", "hostname"}


@pytest.mark.parametrize("extra,code", [
    ({"ssh_key_candidates": [f"/k/{i}" for i in range(51)]}, "too_many_candidates"),
    ({"known_hosts_candidates": ["relative/known_hosts"]}, "invalid_candidate"),
    ({"worker_id": "bad id!"}, "invalid_worker_id"),
])
def test_hello_refuses_bad_candidates_and_ids(world, extra, code):
    worker = ScriptedWorker(world.worker_token)
    assert_error(worker.hello(**extra), 422, code)


def test_worker_endpoints_need_the_worker_execute_scope(world):
    token = world.token(world.project_admin, ["read", "admin"])
    assert_error(ScriptedWorker(token).hello(), 403, "missing_scope")
    session_client = session(world.global_admin)
    assert_error(session_client.post("/api/worker/hello", {"worker_id": "x"}, format="json"), 403,
                 "worker_token_required")


def test_a_worker_unseen_for_120_seconds_is_offline(world):
    worker = ScriptedWorker(world.worker_token)
    worker.hello()
    Worker.objects.update(last_seen_at=timezone.now() - timedelta(seconds=121))
    body = session(world.viewer).get("/api/projects/lab/workers").json()
    assert body["items"][0]["status"] == "offline"
    worker.claim_check()
    assert session(world.viewer).get("/api/projects/lab/workers").json()["items"][0]["status"] == "online"


def test_project_members_see_their_workers_without_candidates_and_admins_see_all(world):
    ScriptedWorker(world.worker_token).hello()
    viewer_items = session(world.viewer).get("/api/projects/lab/workers").json()["items"]
    assert viewer_items[0]["hostname"] == "worker-host" and "ssh_key_candidates" not in viewer_items[0]
    assert_error(session(world.outsider).get("/api/projects/lab/workers"), 404)
    assert_error(session(world.member).get("/api/workers"), 403)
    admin_items = session(world.global_admin).get("/api/workers").json()["items"]
    assert admin_items[0]["ssh_key_candidates"]
