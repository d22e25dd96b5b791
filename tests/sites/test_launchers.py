"""Launchers (issue 7 item 3, server side): registration by global administrators, the token shown
once and stored only as a hash, recreate and revoke, the launcher token reaching only launcher
endpoints, the audit rows, and the Global administration → Launchers page with its dialogs."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from mado import tokens
from mado.choices import TokenKind
from mado.models import ApiToken, AuditEvent
from mado.services import Actor
from sites import launchers
from sites.models import Launcher
from tests.conftest import ALL_MEMBER_SCOPES, assert_error, bearer
from tests.sites.conftest import TEST_ALLOWED_HOSTS

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def root(world):
    return bearer(world.token(world.global_admin, ALL_MEMBER_SCOPES))


@pytest.fixture
def registered(world):
    """A launcher registered through the service, with its plaintext token."""
    return launchers.register_launcher(Actor(world.global_admin), "hpc-a", world.project, TEST_ALLOWED_HOSTS)


def _others(world) -> dict[str, object]:
    return {
        "project admin": bearer(world.token(world.project_admin, ALL_MEMBER_SCOPES)),
        "member": bearer(world.member_token(world.member)),
        "viewer": bearer(world.member_token(world.viewer)),
        "outsider": bearer(world.member_token(world.outsider, world.other_project)),
        "service account": bearer(world.worker_token),
    }


# Registration and the token shown once ----------------------------------------------------------

def test_global_admin_registers_and_sees_the_token_once(world, root):
    response = root.post("/api/launchers", {"name": "hpc-a", "project": "lab"}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert response["Cache-Control"] == "no-store"
    assert body["name"] == "hpc-a" and body["project"] == "lab" and body["state"] == "active"
    plaintext = body["token"]
    assert plaintext.startswith(tokens.API_TOKEN_PREFIX)

    launcher = Launcher.objects.get(name="hpc-a")
    token = launcher.token
    assert token.kind == TokenKind.LAUNCHER and token.scopes == ["launcher:execute"]
    assert token.token_hash == tokens.hash_token(plaintext)
    # Only the hash is stored: the plaintext is in no column of the token row.
    assert plaintext not in str(ApiToken.objects.filter(pk=token.pk).values().first())
    # The holder is a service-like user: no usable password, no membership.
    assert not token.user.has_usable_password() and not token.user.memberships.exists()

    listing = root.get("/api/launchers").json()["items"]
    assert [item["name"] for item in listing] == ["hpc-a"]
    assert "token" not in listing[0] and plaintext not in str(listing)


def test_register_refuses_bad_names_and_projects(world, root, registered):
    assert_error(root.post("/api/launchers", {"name": "hpc-a", "project": "lab"}, format="json"), 409,
                 "launcher_name_taken")
    assert_error(root.post("/api/launchers", {"name": "bad name!", "project": "lab"}, format="json"), 422,
                 "invalid_name")
    assert_error(root.post("/api/launchers", {"name": "hpc-b", "project": "nope"}, format="json"), 422,
                 "invalid_project")


def test_permission_matrix(world, registered):
    launcher, _ = registered
    for label, client in _others(world).items():
        for method, path in [("get", "/api/launchers"), ("post", "/api/launchers"),
                             ("post", f"/api/launchers/{launcher.pk}/token"),
                             ("post", f"/api/launchers/{launcher.pk}/revoke")]:
            response = getattr(client, method)(path, {"name": "x", "project": "lab"}, format="json")
            assert response.status_code == 403, (label, path, response.content)
            assert_error(response, 403)
    assert Launcher.objects.count() == 1 and not Launcher.objects.get().is_revoked


def test_unknown_launcher_is_404_for_the_global_admin(root):
    assert_error(root.post("/api/launchers/999/token"), 404, "not_found")
    assert_error(root.post("/api/launchers/999/revoke"), 404, "not_found")


def test_global_admin_session_manages_launchers(world, client):
    client.force_login(world.global_admin)
    response = client.post("/api/launchers", {"name": "hpc-s", "project": "lab"}, content_type="application/json")
    assert response.status_code == 201, response.content


def test_only_global_admins_register_through_the_service(world):
    with pytest.raises(Exception) as error:
        launchers.register_launcher(Actor(world.project_admin), "hpc-x", world.project)
    assert getattr(error.value, "code", None) == "global_admin_required"


# The launcher token reaches only launcher endpoints ----------------------------------------------

def test_launcher_token_refused_everywhere_else(registered):
    _, plaintext = registered
    client = bearer(plaintext)
    assert_error(client.get("/api/projects"), 403, "launcher_token_forbidden")
    assert_error(client.get("/api/computers"), 403, "launcher_token_forbidden")
    assert_error(client.post("/api/worker/hello", {}, format="json"), 403, "launcher_token_forbidden")
    assert_error(client.get("/api/launchers"), 403, "launcher_token_forbidden")
    assert_error(client.post("/api/launchers", {"name": "y", "project": "lab"}, format="json"), 403,
                 "launcher_token_forbidden")


def test_launcher_config_answers_its_sites(world, registered, make_site):
    launcher, plaintext = registered
    target = make_site(world.global_admin, launcher=launcher.pk)
    response = bearer(plaintext).get("/api/launcher/config", HTTP_X_LAUNCHER_HOSTNAME="login-gw")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["launcher"] == {"id": launcher.pk, "name": "hpc-a"}
    assert body["poll_interval_seconds"] == 10
    [site] = body["sites"]
    assert site["computer"] == target.pk and site["host"] == "login.hpc.example.org"
    for field in ["port", "ssh_user", "jump_hosts", "known_hosts", "working_dir", "runner_python", "runner_api_url",
                  "variables", "max_active_submissions", "queue_timeout_seconds", "job_shell", "account"]:
        assert field in site
    launcher.refresh_from_db()
    assert launcher.last_seen_at is not None and launcher.hostname == "login-gw"

    _, other_plaintext = launchers.register_launcher(Actor(world.global_admin), "hpc-b", world.project)
    assert bearer(other_plaintext).get("/api/launcher/config").json()["sites"] == []


def test_launcher_config_refuses_other_tokens(world, client):
    assert_error(bearer(world.token(world.global_admin, ALL_MEMBER_SCOPES)).get("/api/launcher/config"), 403)
    assert_error(bearer(world.worker_token).get("/api/launcher/config"), 403)
    client.force_login(world.global_admin)
    assert_error(client.get("/api/launcher/config"), 403, "launcher_token_required")
    assert_error(bearer("mmt_notatoken").get("/api/launcher/config"), 401)


# Recreate and revoke ----------------------------------------------------------------------------

def test_recreate_revokes_the_old_token(world, root, registered):
    launcher, old = registered
    response = root.post(f"/api/launchers/{launcher.pk}/token")
    assert response.status_code == 200, response.content
    new = response.json()["token"]
    assert new != old and response["Cache-Control"] == "no-store"
    assert_error(bearer(old).get("/api/launcher/config"), 401)
    assert bearer(new).get("/api/launcher/config").status_code == 200
    launcher.refresh_from_db()
    assert launcher.token.token_hash == tokens.hash_token(new)
    assert ApiToken.objects.filter(kind=TokenKind.LAUNCHER).count() == 2
    assert ApiToken.objects.filter(kind=TokenKind.LAUNCHER, revoked_at__isnull=True).count() == 1


def test_revoke_stops_the_token(world, root, registered):
    launcher, plaintext = registered
    response = root.post(f"/api/launchers/{launcher.pk}/revoke")
    assert response.status_code == 200 and response.json()["state"] == "revoked"
    assert_error(bearer(plaintext).get("/api/launcher/config"), 401)
    assert_error(root.post(f"/api/launchers/{launcher.pk}/token"), 409, "launcher_revoked")
    assert root.post(f"/api/launchers/{launcher.pk}/revoke").status_code == 200  # idempotent


def test_audit_rows(world, root):
    launcher_id = root.post("/api/launchers", {"name": "hpc-a", "project": "lab"}, format="json").json()["id"]
    root.post(f"/api/launchers/{launcher_id}/token")
    root.post(f"/api/launchers/{launcher_id}/revoke")
    rows = AuditEvent.objects.filter(object_type="launcher", object_id=str(launcher_id)).order_by("id")
    assert [row.action for row in rows] == ["launcher.create", "launcher.token.recreate", "launcher.revoke"]
    assert all(row.actor == world.global_admin for row in rows)
    assert rows[0].after["project"] == "lab" and "token" not in rows[0].after
    assert AuditEvent.objects.filter(action="token.revoke", object_type="apitoken").count() == 2


# The page ---------------------------------------------------------------------------------------

def test_page_renders_for_superusers_only(world, client, registered):
    client.force_login(world.global_admin)
    page = client.get("/admin-tools/launchers/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "hpc-a" in html and "lab" in html and "Register launcher" in html
    for user in [world.project_admin, world.member, world.outsider]:
        client.force_login(user)
        assert client.get("/admin-tools/launchers/").status_code == 403
        assert client.get("/admin-tools/launchers/new", **HTMX).status_code == 403
        assert client.post("/admin-tools/launchers/new", {"name": "z", "project": "lab"}).status_code == 403
    client.logout()
    assert client.get("/admin-tools/launchers/").status_code == 302  # to the login page


def test_menu_links_to_launchers_for_superusers(world, client):
    client.force_login(world.global_admin)
    assert 'href="/admin-tools/launchers/"' in client.get("/settings/").content.decode()
    client.force_login(world.member)
    assert 'href="/admin-tools/launchers/"' not in client.get("/settings/").content.decode()


def test_dialog_flow_with_htmx(world, client):
    client.force_login(world.global_admin)
    form = client.get("/admin-tools/launchers/new", **HTMX)
    assert form.status_code == 200 and b"<html" not in form.content and b'name="name"' in form.content

    invalid = client.post("/admin-tools/launchers/new", {"name": "bad name!", "project": "lab"}, **HTMX)
    assert invalid.status_code == 200 and b"errors" in invalid.content
    assert not Launcher.objects.exists()

    shown = client.post("/admin-tools/launchers/new", {"name": "hpc-h", "project": "lab"}, **HTMX)
    assert shown.status_code == 200 and shown["Cache-Control"] == "no-store"
    assert "launchersChanged" in shown["HX-Trigger"]
    launcher = Launcher.objects.get(name="hpc-h")
    html = shown.content.decode()
    plaintext = html.split('<code id="issued-token">')[1].split("</code>")[0]
    assert launcher.token.token_hash == tokens.hash_token(plaintext) and "data-copy" in html
    assert bearer(plaintext).get("/api/launcher/config").status_code == 200
    # Shown once: the list does not carry it.
    assert plaintext not in client.get("/admin-tools/launchers/?fragment=list", **HTMX).content.decode()

    confirm = client.get(f"/admin-tools/launchers/{launcher.pk}/token", **HTMX)
    assert confirm.status_code == 200 and b"Recreate token" in confirm.content
    recreated = client.post(f"/admin-tools/launchers/{launcher.pk}/token", **HTMX)
    new = recreated.content.decode().split('<code id="issued-token">')[1].split("</code>")[0]
    assert new != plaintext
    assert bearer(plaintext).get("/api/launcher/config").status_code == 401

    assert client.get(f"/admin-tools/launchers/{launcher.pk}/revoke", **HTMX).status_code == 200
    done = client.post(f"/admin-tools/launchers/{launcher.pk}/revoke", **HTMX)
    assert done.status_code == 204 and "closeDialog" in done["HX-Trigger"]
    assert bearer(new).get("/api/launcher/config").status_code == 401
    assert b"Revoked" in client.get("/admin-tools/launchers/?fragment=list", **HTMX).content


def test_dialog_without_htmx_is_a_whole_page(world, client):
    client.force_login(world.global_admin)
    page = client.get("/admin-tools/launchers/new")
    assert page.status_code == 200 and b"<html" in page.content and b"hx-disable" in page.content
    shown = client.post("/admin-tools/launchers/new", {"name": "hpc-p", "project": "lab"})
    assert shown.status_code == 200 and b'id="issued-token"' in shown.content
    assert User.objects.filter(username__startswith="launcher-").count() == 1
