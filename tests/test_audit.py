"""Every state change of the identity app leaves an audit row, without secrets."""
from __future__ import annotations

import json

from mado.models import ApiToken, AuditEvent
from tests.conftest import bearer


def _actions():
    return list(AuditEvent.objects.order_by("id").values_list("action", flat=True))


def test_every_identity_change_writes_an_audit_event_with_actor_project_and_ip(world):
    AuditEvent.objects.all().delete()
    admin_token = world.member_token(world.project_admin)
    client = bearer(admin_token)
    client.post("/api/projects/lab/members", {"username": "mallory", "role": "viewer"}, format="json",
                REMOTE_ADDR="10.1.2.3")
    client.post("/api/projects/lab/members", {"username": "mallory", "role": "member"}, format="json")
    account = client.post("/api/projects/lab/service-accounts", {"name": "ci-bot", "role": "admin"}, format="json").json()
    issued = client.post(f"/api/projects/lab/service-accounts/{account['id']}/tokens", {"scopes": ["read"]},
                         format="json").json()
    client.post(f"/api/tokens/{issued['id']}/revoke")
    client.post(f"/api/projects/lab/service-accounts/{account['id']}/disable")
    bearer(world.member_token(world.global_admin)).post("/api/projects", {"name": "vision"}, format="json")

    assert _actions() == [
        "token.create", "membership.create", "membership.update", "service_account.create", "token.create", "token.revoke",
        "service_account.disable", "token.create", "project.create",
    ]
    first = AuditEvent.objects.get(action="membership.create")
    assert first.actor == world.project_admin and first.actor_label == "alice"
    assert first.project == world.project
    assert first.ip == "10.1.2.3"
    assert first.after == {"username": "mallory", "role": "viewer"}
    update = AuditEvent.objects.get(action="membership.update")
    assert update.before == {"role": "viewer"} and update.after["role"] == "member"


def test_audit_rows_never_hold_a_token(world):
    client = bearer(world.member_token(world.project_admin))
    issued = client.post("/api/projects/lab/tokens", {"scopes": ["read"]}, format="json").json()
    everything = json.dumps(list(AuditEvent.objects.values("before", "after")), default=str)
    assert issued["token"] not in everything
    token_hash = ApiToken.objects.get(pk=issued["id"]).token_hash
    assert token_hash not in everything
    assert issued["prefix"] in everything


def test_disabling_twice_writes_one_audit_event(world):
    client = bearer(world.member_token(world.project_admin))
    url = f"/api/projects/lab/service-accounts/{world.service_account.pk}/disable"
    client.post(url)
    client.post(url)
    assert AuditEvent.objects.filter(action="service_account.disable").count() == 1


def test_django_admin_lists_audit_events_read_only_with_filters(world, client):
    client.force_login(world.global_admin)
    page = client.get("/admin/mado/auditevent/?action=service_account.create")
    assert page.status_code == 200
    assert b"service_account.create" in page.content
    assert b"By action" in page.content and b"By project" in page.content
    event = AuditEvent.objects.first()
    assert client.get("/admin/mado/auditevent/add/").status_code == 403
    detail = client.post(f"/admin/mado/auditevent/{event.pk}/change/", {"action": "forged"})
    assert detail.status_code == 403
    assert AuditEvent.objects.get(pk=event.pk).action != "forged"


def test_django_admin_never_shows_a_token_hash(world, client):
    client.force_login(world.global_admin)
    token = ApiToken.objects.first()
    page = client.get(f"/admin/mado/apitoken/{token.pk}/change/")
    assert page.status_code == 200
    assert token.token_hash.encode() not in page.content
    assert token.prefix.encode() in page.content


def test_django_admin_revokes_tokens_through_the_audited_service_and_edits_nothing_directly(world, client):
    client.force_login(world.global_admin)
    token = ApiToken.objects.get(prefix=world.worker_token[:12])
    response = client.post("/admin/mado/apitoken/", {"action": "revoke", "_selected_action": [token.pk]})
    assert response.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert AuditEvent.objects.filter(action="token.revoke", object_id=str(token.pk), actor=world.global_admin).exists()
    assert client.get(f"/admin/mado/membership/{world.project.memberships.first().pk}/change/").status_code == 200
    forged = client.post(f"/admin/mado/membership/{world.project.memberships.first().pk}/change/", {"role": "admin"})
    assert forged.status_code == 403
