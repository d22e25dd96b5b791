"""One error body everywhere under /api/: {"error", "code", "fields"?} with the right status."""
from __future__ import annotations

from rest_framework.test import APIClient

from mado.models import ServiceAccount
from tests.conftest import assert_error, bearer


def test_400_names_every_field_to_fix(world):
    client = bearer(world.member_token(world.project_admin))
    body = assert_error(client.post("/api/projects/lab/service-accounts", {"role": "boss"}, format="json"), 400, "invalid")
    assert set(body["fields"]) == {"name", "role"}
    assert "name" in body["error"] and "role" in body["error"]


def test_malformed_json_gets_400_with_the_same_shape(world):
    client = bearer(world.member_token(world.project_admin))
    response = client.post("/api/projects/lab/service-accounts", data="{not json", content_type="application/json")
    assert_error(response, 400)


def test_401_without_a_token_says_how_to_send_one(db):
    body = assert_error(APIClient().get("/api/projects"), 401, "not_authenticated")
    assert "Bearer" in body["error"]


def test_403_says_which_role_is_needed(world):
    client = APIClient()
    client.force_login(world.member)
    body = assert_error(client.get("/api/projects/lab/service-accounts"), 403)
    assert "admin role" in body["error"]


def test_404_for_an_unknown_object_and_an_unknown_api_path(world):
    client = bearer(world.member_token(world.project_admin))
    assert_error(client.post("/api/projects/lab/service-accounts/999999/disable"), 404, "not_found")
    body = assert_error(client.get("/api/does-not-exist"), 404, "not_found")
    assert "/api/docs/" in body["error"]


def test_405_lists_nothing_but_says_where_to_look(world):
    body = assert_error(APIClient().delete("/api/health"), 405, "method_not_allowed")
    assert "DELETE" in body["error"]


def test_429_when_tokens_are_issued_too_fast(world, monkeypatch):
    from rest_framework.throttling import ScopedRateThrottle

    monkeypatch.setattr(ScopedRateThrottle, "THROTTLE_RATES", {"token_issue": "2/min"})
    client = bearer(world.member_token(world.member))
    for _ in range(2):
        assert client.post("/api/projects/lab/tokens", {"scopes": ["read"]}, format="json").status_code == 201
    response = client.post("/api/projects/lab/tokens", {"scopes": ["read"]}, format="json")
    body = assert_error(response, 429, "throttled")
    assert "retry in" in body["error"]
    assert response["Retry-After"]


def test_409_for_a_service_account_name_taken_in_any_letter_case(world):
    client = bearer(world.member_token(world.project_admin))
    response = client.post("/api/projects/lab/service-accounts", {"name": "GPU-Host-1-Worker", "role": "admin"},
                           format="json")
    body = assert_error(response, 409, "service_account_name_taken")
    assert body["fields"]["name"]
    assert ServiceAccount.objects.filter(project=world.project, name__iexact="gpu-host-1-worker").count() == 1


def test_the_same_service_account_name_is_fine_in_another_project(world):
    client = bearer(world.member_token(world.global_admin, world.other_project))
    response = client.post("/api/projects/other/service-accounts", {"name": "gpu-host-1-worker", "role": "admin"},
                           format="json")
    assert response.status_code == 201


def test_422_for_an_invalid_service_account_name(world):
    client = bearer(world.member_token(world.project_admin))
    body = assert_error(client.post("/api/projects/lab/service-accounts", {"name": "-bad name", "role": "admin"},
                                    format="json"), 422, "invalid_name")
    assert "letters, digits" in body["error"]


def test_500_under_api_is_json(world, client, settings):
    from django.test import RequestFactory

    from mado.views import server_error

    response = server_error(RequestFactory().get("/api/projects"))
    assert response.status_code == 500
    import json

    body = json.loads(response.content)
    assert body["code"] == "server_error" and "Try again" in body["error"]
