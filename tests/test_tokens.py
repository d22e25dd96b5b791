"""API tokens and job tokens: hashing at rest, expiry, revocation, disabled accounts, scopes."""
from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from mado import services
from mado.choices import Role, TokenKind
from mado.models import ApiToken, JobToken, Membership
from tests.conftest import assert_error, bearer


def _database_text() -> str:
    """Every text column of every identity table, concatenated, to search for leaked plaintext."""
    chunks = []
    with connection.cursor() as cursor:
        for table in ["mado_apitoken", "mado_jobtoken", "mado_auditevent", "auth_user", "mado_serviceaccount"]:
            cursor.execute(f"SELECT * FROM {table}")
            chunks.extend(str(row) for row in cursor.fetchall())
    return "\n".join(chunks)


def test_token_plaintext_is_never_stored_only_its_hash_and_prefix(world):
    response = bearer(world.member_token(world.project_admin)).post(
        "/api/projects/lab/tokens", {"scopes": ["read"]}, format="json")
    assert response.status_code == 201
    plaintext = response.json()["token"]
    assert plaintext.startswith("mmt_") and len(plaintext) > 40
    _, job_plaintext = services.issue_job_token(job_id=7, lease_id=uuid.uuid4(), project=world.project, user=world.member)
    text = _database_text()
    assert plaintext not in text
    assert plaintext[12:] not in text
    assert job_plaintext not in text
    token = ApiToken.objects.get(pk=response.json()["id"])
    assert token.prefix == plaintext[:12]
    assert len(token.token_hash) == 64 and token.token_hash != plaintext


def test_auth_token_describes_the_token_sent(world):
    body = bearer(world.worker_token).get("/api/auth/token").json()
    assert body["kind"] == "service"
    assert body["project"] == "lab"
    assert body["scopes"] == sorted(["read", "worker:execute", "artifacts:write"])
    assert body["expires_at"]


def test_default_expiry_is_365_days_and_more_is_refused(world):
    client = bearer(world.member_token(world.member))
    issued = client.post("/api/projects/lab/tokens", {"scopes": ["read"]}, format="json").json()
    token = ApiToken.objects.get(pk=issued["id"])
    assert timedelta(days=364, hours=23) < token.expires_at - timezone.now() <= timedelta(days=365)
    too_long = client.post("/api/projects/lab/tokens", {"scopes": ["read"], "expires_in_days": 366}, format="json")
    body = assert_error(too_long, 400, "invalid")
    assert "expires_in_days" in body["fields"]


def test_an_expired_token_gets_401_saying_it_expired(world):
    plaintext = world.token(world.member, ["read"])
    ApiToken.objects.filter(prefix=plaintext[:12]).update(expires_at=timezone.now() - timedelta(seconds=1))
    body = assert_error(bearer(plaintext).get("/api/projects"), 401)
    assert "expired" in body["error"] and "issue a new one" in body["error"]


def test_a_revoked_token_gets_401_saying_it_was_revoked(world):
    plaintext = world.token(world.member, ["read", "admin"])
    token_id = ApiToken.objects.get(prefix=plaintext[:12]).pk
    assert bearer(plaintext).post(f"/api/tokens/{token_id}/revoke").status_code == 200
    body = assert_error(bearer(plaintext).get("/api/projects"), 401)
    assert "revoked" in body["error"]


def test_an_unknown_or_malformed_token_gets_401(world):
    assert "not known" in assert_error(bearer("mmt_" + "x" * 43).get("/api/projects"), 401)["error"]
    assert "mmt_" in assert_error(bearer("ghp_abcdef").get("/api/projects"), 401)["error"]
    assert_error(bearer("mado_mtj_" + "y" * 43).get("/api/projects"), 401)
    assert_error(bearer("mmtj_" + "y" * 43).get("/api/projects"), 401)


def test_disabling_a_service_account_stops_its_tokens_on_the_very_next_request(world):
    worker = bearer(world.worker_token)
    assert worker.get("/api/auth/token").status_code == 200
    admin = bearer(world.member_token(world.project_admin))
    response = admin.post(f"/api/projects/lab/service-accounts/{world.service_account.pk}/disable")
    assert response.status_code == 200 and response.json()["disabled"] is True
    body = assert_error(worker.get("/api/auth/token"), 401)
    assert "gpu-host-1-worker is disabled" in body["error"]


def test_last_used_at_is_recorded_and_written_at_most_once_a_minute(world):
    plaintext = world.token(world.member, ["read"])
    token = ApiToken.objects.get(prefix=plaintext[:12])
    assert token.last_used_at is None
    bearer(plaintext).get("/api/projects")
    first = ApiToken.objects.get(pk=token.pk).last_used_at
    assert first is not None
    bearer(plaintext).get("/api/projects")
    assert ApiToken.objects.get(pk=token.pk).last_used_at == first
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now() - timedelta(minutes=5))
    bearer(plaintext).get("/api/projects")
    assert ApiToken.objects.get(pk=token.pk).last_used_at > first


def test_worker_execute_is_refused_for_a_non_admin_service_account(world):
    account = services.create_service_account(services.Actor(world.project_admin), world.project,
                                              name="reader-bot", role=Role.MEMBER)
    admin = bearer(world.member_token(world.project_admin))
    response = admin.post(f"/api/projects/lab/service-accounts/{account.pk}/tokens",
                          {"scopes": ["read", "worker:execute"]}, format="json")
    body = assert_error(response, 422, "worker_execute_requires_admin_service_account")
    assert "only to service accounts whose role is Admin" in body["error"]
    assert not ApiToken.objects.filter(user=account.user).exists()


def test_worker_execute_is_refused_for_personal_tokens_even_of_admins(world):
    response = bearer(world.member_token(world.project_admin)).post(
        "/api/projects/lab/tokens", {"scopes": ["worker:execute"]}, format="json")
    assert_error(response, 422, "worker_execute_requires_admin_service_account")


def test_an_admin_service_account_gets_a_worker_token(world):
    admin = bearer(world.member_token(world.project_admin))
    response = admin.post(f"/api/projects/lab/service-accounts/{world.service_account.pk}/tokens",
                          {"scopes": ["read", "worker:execute", "artifacts:write"], "expires_in_days": 30}, format="json")
    assert response.status_code == 201
    issued = response.json()
    assert issued["token"].startswith(issued["prefix"])
    assert bearer(issued["token"]).get("/api/auth/token").json()["kind"] == "service"


def test_a_token_cannot_mint_a_token_with_scopes_it_lacks(world):
    narrow = world.token(world.member, ["read", "admin"])
    response = bearer(narrow).post("/api/projects/lab/tokens", {"scopes": ["read", "jobs:write"]}, format="json")
    assert_error(response, 403, "scope_escalation")


def test_a_viewer_cannot_issue_tokens_and_a_member_cannot_get_scopes_above_its_role(world):
    viewer_token = world.token(world.viewer, ["read"])
    assert_error(bearer(viewer_token).post("/api/projects/lab/tokens", {"scopes": ["read"]}, format="json"), 403)
    assert services.allowed_scopes(world.viewer, world.project, TokenKind.PERSONAL) == ["read"]
    with pytest.raises(services.ServiceError) as refused:
        world.token(world.viewer, ["jobs:write"])
    assert refused.value.code == "scope_not_allowed"


def test_a_token_only_works_for_its_own_project(world):
    Membership.objects.create(project=world.other_project, user=world.member, role=Role.MEMBER)
    plaintext = world.token(world.member, ["read"])
    assert_error(bearer(plaintext).get("/api/projects/other/tokens"), 403, "token_project_mismatch")
    listed = bearer(plaintext).get("/api/projects").json()["items"]
    assert [p["slug"] for p in listed] == ["lab"]


class TestJobTokens:
    def test_a_job_token_authenticates_as_the_job_creator_and_reads_its_project(self, world):
        _, plaintext = services.issue_job_token(job_id=11, lease_id=uuid.uuid4(), project=world.project,
                                                user=world.member)
        assert plaintext.startswith("mado_mtj_") and len(plaintext) == len("mado_mtj_") + 43  # seed 001
        client = bearer(plaintext)
        body = client.get("/api/auth/token").json()
        assert body["kind"] == "job" and body["project"] == "lab"
        assert client.get("/api/projects/lab/tokens").status_code == 200

    def test_a_job_token_may_not_change_anything_else(self, world):
        _, plaintext = services.issue_job_token(job_id=12, lease_id=uuid.uuid4(), project=world.project,
                                                user=world.project_admin)
        response = bearer(plaintext).post("/api/projects/lab/tokens", {"scopes": ["read"]}, format="json")
        assert_error(response, 403, "job_token_forbidden")

    def test_a_job_token_stops_working_when_its_job_ends(self, world):
        _, plaintext = services.issue_job_token(job_id=13, lease_id=uuid.uuid4(), project=world.project,
                                                user=world.member)
        services.revoke_job_tokens(13)
        assert "job has ended" in assert_error(bearer(plaintext).get("/api/auth/token"), 401)["error"]

    def test_a_job_token_issued_before_the_mado_mtj_prefix_works_until_its_job_ends(self, world):
        # A row written by the previous release, whose running job still holds an `mmtj_` token.
        plaintext = "mmtj_" + secrets.token_urlsafe(32)
        JobToken.objects.create(job_id=15, lease_id=uuid.uuid4(), project=world.project, user=world.member,
                                prefix=plaintext[:12], token_hash=hashlib.sha256(plaintext.encode()).hexdigest())
        body = bearer(plaintext).get("/api/auth/token").json()
        assert body["kind"] == "job" and body["project"] == "lab"
        services.revoke_job_tokens(15)
        assert "job has ended" in assert_error(bearer(plaintext).get("/api/auth/token"), 401)["error"]

    def test_a_job_token_carries_the_creators_current_role(self, world):
        _, plaintext = services.issue_job_token(job_id=14, lease_id=uuid.uuid4(), project=world.project,
                                                user=world.member)
        Membership.objects.filter(user=world.member, project=world.project).delete()
        assert "no longer a member" in assert_error(bearer(plaintext).get("/api/auth/token"), 401)["error"]
        assert JobToken.objects.filter(job_id=14).exists()


def test_an_admin_service_account_cannot_manage_identity_even_with_the_admin_scope(world):
    token = world.token(world.service_account.user, ["read", "admin", "worker:execute"], kind=TokenKind.SERVICE)
    client = bearer(token)
    assert_error(client.post("/api/projects/lab/service-accounts", {"name": "sneaky", "role": "admin"}, format="json"),
                 403, "service_account_cannot_manage")
    assert_error(client.post(f"/api/projects/lab/service-accounts/{world.service_account.pk}/tokens",
                             {"scopes": ["worker:execute"]}, format="json"), 403, "service_account_cannot_manage")
    assert_error(client.post("/api/projects/lab/members", {"username": "mallory", "role": "admin"}, format="json"),
                 403, "service_account_cannot_manage")
    assert_error(client.post("/api/projects/lab/tokens", {"scopes": ["read"]}, format="json"), 403,
                 "service_account_self_issue")


RANDOM_PART = "k9QwE2rT-yU7iO_pA5sD3fG1hJ4kL6zX8cV0bN2mQ4w"


@pytest.mark.parametrize("token", ["mado_mtj_" + RANDOM_PART, "mmtj_" + RANDOM_PART, "mmt_" + RANDOM_PART])
def test_every_place_that_masks_tokens_masks_new_and_old_job_tokens(token):
    from computers.services import SECRET_PATTERNS
    from sites.shells import stderr_tail as mask_shell_output
    from worker_agent.site.launcher import mask_tail
    from worker_agent.site.runner import mask as mask_runner_text
    from worker_agent.text import mask_tokens, sanitize_detail

    line = f"export MLFLOW_TRACKING_TOKEN={token}; curl -H 'Authorization: Bearer {token}'"
    for masked in (mask_tokens(line), sanitize_detail(line, limit=1000), mask_tail(line),
                   mask_shell_output(line), mask_runner_text(line)):
        assert token not in masked and RANDOM_PART[-20:] not in masked
    assert any(pattern.search(line) for pattern in SECRET_PATTERNS)  # a target check refuses to store it
