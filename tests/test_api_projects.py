"""Projects and members through the API; the schema and the docs page."""
from __future__ import annotations

from rest_framework.test import APIClient

from mado.models import Membership, Project
from tests.conftest import assert_error, bearer


def test_a_global_admin_creates_a_project_and_a_taken_name_is_409(world):
    client = bearer(world.member_token(world.global_admin))
    created = client.post("/api/projects", {"name": "vision", "title": "Vision team"}, format="json")
    assert created.status_code == 201
    assert created.json()["slug"] == "vision" and created.json()["name"] == "Vision team"
    assert_error(client.post("/api/projects", {"name": "vision"}, format="json"), 409, "project_exists")
    assert_error(client.post("/api/projects", {"name": "Bad Name!"}, format="json"), 422, "invalid_project_slug")
    assert Project.objects.filter(slug="vision").count() == 1


def test_a_project_admin_adds_and_changes_a_member(world):
    client = bearer(world.member_token(world.project_admin))
    assert client.post("/api/projects/lab/members", {"username": "mallory", "role": "viewer"},
                       format="json").status_code == 201
    assert Membership.objects.get(project=world.project, user=world.outsider).role == "viewer"
    client.post("/api/projects/lab/members", {"username": "mallory", "role": "member"}, format="json")
    assert Membership.objects.get(project=world.project, user=world.outsider).role == "member"
    body = assert_error(client.post("/api/projects/lab/members", {"username": "nobody", "role": "member"},
                                    format="json"), 422, "unknown_user")
    assert "nobody" in body["error"]


def test_a_service_account_cannot_be_added_as_a_member(world):
    client = bearer(world.member_token(world.global_admin, world.other_project))
    response = client.post("/api/projects/other/members",
                           {"username": world.service_account.user.username, "role": "admin"}, format="json")
    assert_error(response, 422, "service_account_not_member")


def test_projects_list_shows_the_callers_role(world):
    client = APIClient()
    client.force_login(world.viewer)
    items = client.get("/api/projects").json()["items"]
    assert items == [{**items[0], "slug": "lab", "role": "viewer"}]


def test_the_openapi_schema_lists_the_fixed_paths(db):
    response = APIClient().get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in ["/api/health", "/api/auth/token", "/api/projects", "/api/projects/{project}/members",
                 "/api/projects/{project}/service-accounts",
                 "/api/projects/{project}/service-accounts/{account_id}/tokens",
                 "/api/projects/{project}/service-accounts/{account_id}/disable",
                 "/api/projects/{project}/tokens", "/api/tokens/{token_id}/revoke"]:
        assert path in paths, path


def test_the_api_docs_page_is_served_without_a_cdn(db):
    page = APIClient().get("/api/docs/")
    assert page.status_code == 200
    assert b"/static/drf_spectacular_sidecar/" in page.content
    assert b"cdn." not in page.content
