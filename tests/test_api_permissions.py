"""Every identity endpoint's permission matrix per role, and the scope each one needs."""
from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from mado.models import ApiToken, ServiceAccount
from tests.conftest import assert_error, bearer

ROLES = ["global_admin", "project_admin", "member", "viewer", "outsider"]


def session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def call(client, world, endpoint: str):
    sa = world.service_account.pk
    own_token = ApiToken.objects.filter(user=world.service_account.user).first().pk
    requests = {
        "list projects": lambda: client.get("/api/projects"),
        "create project": lambda: client.post("/api/projects", {"name": "new-lab"}, format="json"),
        "add member": lambda: client.post("/api/projects/lab/members", {"username": "mallory", "role": "viewer"},
                                          format="json"),
        "list service accounts": lambda: client.get("/api/projects/lab/service-accounts"),
        "create service account": lambda: client.post("/api/projects/lab/service-accounts",
                                                      {"name": "bot-2", "role": "member"}, format="json"),
        "issue service account token": lambda: client.post(f"/api/projects/lab/service-accounts/{sa}/tokens",
                                                           {"scopes": ["read"]}, format="json"),
        "disable service account": lambda: client.post(f"/api/projects/lab/service-accounts/{sa}/disable"),
        "list tokens": lambda: client.get("/api/projects/lab/tokens"),
        "issue personal token": lambda: client.post("/api/projects/lab/tokens", {"scopes": ["read"]}, format="json"),
        "revoke service account token": lambda: client.post(f"/api/tokens/{own_token}/revoke"),
    }
    return requests[endpoint]()


# endpoint -> the status each role gets, in ROLES order
MATRIX = {
    "list projects": [200, 200, 200, 200, 200],
    "create project": [201, 403, 403, 403, 403],
    "add member": [201, 201, 403, 403, 404],
    "list service accounts": [200, 200, 403, 403, 404],
    "create service account": [201, 201, 403, 403, 404],
    "issue service account token": [201, 201, 403, 403, 404],
    "disable service account": [200, 200, 403, 403, 404],
    "list tokens": [200, 200, 200, 200, 404],
    "issue personal token": [201, 201, 201, 403, 404],
    "revoke service account token": [200, 200, 404, 404, 404],
}


@pytest.mark.parametrize("endpoint", MATRIX)
@pytest.mark.parametrize("role_index", range(len(ROLES)), ids=ROLES)
def test_each_role_gets_what_the_permission_table_says(world, endpoint, role_index):
    user = getattr(world, ROLES[role_index])
    response = call(session(user), world, endpoint)
    expected = MATRIX[endpoint][role_index]
    if expected >= 400:
        assert_error(response, expected)
    else:
        assert response.status_code == expected, response.content


@pytest.mark.parametrize("endpoint", MATRIX)
@pytest.mark.parametrize("role_index", range(len(ROLES)), ids=ROLES)
def test_tokens_with_every_allowed_scope_get_the_same_answers_as_sessions(world, endpoint, role_index):
    user = getattr(world, ROLES[role_index])
    project = world.other_project if ROLES[role_index] == "outsider" else world.project
    client = bearer(world.member_token(user, project))
    expected = MATRIX[endpoint][role_index]
    if ROLES[role_index] == "viewer" and SCOPE_OF[endpoint] == "admin":
        expected = 403  # a viewer's token carries only `read`: the scope check answers before the lookup
    response = call(client, world, endpoint)
    if expected >= 400:
        assert_error(response, expected)
    else:
        assert response.status_code == expected, response.content


SCOPE_OF = {
    "list projects": "read",
    "create project": "admin",
    "add member": "admin",
    "list service accounts": "read",
    "create service account": "admin",
    "issue service account token": "admin",
    "disable service account": "admin",
    "list tokens": "read",
    "issue personal token": "admin",
    "revoke service account token": "admin",
}


@pytest.mark.parametrize("endpoint", SCOPE_OF)
def test_each_endpoint_refuses_a_token_without_its_scope(world, endpoint):
    needed = SCOPE_OF[endpoint]
    scopes = [s for s in ["read", "jobs:write", "runs:write", "artifacts:write", "registry:write", "admin"] if s != needed]
    client = bearer(world.token(world.global_admin, scopes))
    body = assert_error(call(client, world, endpoint), 403, "missing_scope")
    assert needed in body["error"]


def test_a_worker_token_cannot_manage_the_project(world):
    client = bearer(world.worker_token)
    assert_error(client.post("/api/projects/lab/service-accounts", {"name": "x", "role": "admin"}, format="json"),
                 403, "missing_scope")
    assert not ServiceAccount.objects.filter(name="x").exists()


def test_the_holder_of_a_personal_token_may_revoke_it_but_not_others_tokens(world):
    own = world.token(world.member, ["read", "admin"])
    other = world.token(world.viewer, ["read"])
    own_id = ApiToken.objects.get(prefix=own[:12]).pk
    other_id = ApiToken.objects.get(prefix=other[:12]).pk
    client = bearer(own)
    assert_error(client.post(f"/api/tokens/{other_id}/revoke"), 404)
    assert ApiToken.objects.get(pk=other_id).revoked_at is None
    assert client.post(f"/api/tokens/{own_id}/revoke").json()["state"] == "revoked"


def test_an_outsider_does_not_learn_that_a_project_exists(world):
    assert_error(session(world.outsider).get("/api/projects/lab/tokens"), 404)
    assert_error(session(world.outsider).get("/api/projects/nope/tokens"), 404)
    listed = session(world.outsider).get("/api/projects").json()["items"]
    assert [p["slug"] for p in listed] == ["other"]
