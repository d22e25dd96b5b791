"""Project settings → Members through Django's test client: who may see and change the list, adding an
existing user with a role, changing a role, removing someone, never the last admin; every change audited
by the same services the API uses (`POST/GET /api/projects/{p}/members`, `DELETE …/members/{username}`)."""
from __future__ import annotations

import json

import pytest
from django.urls import reverse

from mado.choices import Role
from mado.models import AuditEvent, Membership
from tests.conftest import assert_error, bearer

HTMX = {"HTTP_HX_REQUEST": "true"}

pytestmark = pytest.mark.django_db


def url(name: str, *args, project: str = "lab") -> str:
    return reverse(name, args=[project, *args])


def html(response) -> str:
    return response.content.decode()


def membership(world, user) -> Membership:
    return Membership.objects.get(project=world.project, user=user)


def roles(world) -> dict[str, str]:
    return dict(Membership.objects.filter(project=world.project).values_list("user__username", "role"))


# Who sees the page ------------------------------------------------------------------------------

@pytest.mark.parametrize("who", ["project_admin", "global_admin"])
def test_project_admins_and_global_admins_see_every_member_with_their_role(client, world, who):
    client.force_login(getattr(world, who))
    page = html(client.get(url("project-members")))
    for username, role in [("alice", "Admin"), ("bob", "Member"), ("carol", "Viewer")]:
        row = page.split(f'data-member="{username}"')[1].split("</tr>")[0]
        assert f"<td>{role}" in row, row
    assert "mallory" not in page and "gpu-host-1-worker" not in page  # not members; service accounts apart
    assert "Add member" in page


def test_the_project_settings_tabs_lead_admins_to_members_and_not_the_others(client, world):
    client.force_login(world.project_admin)
    assert url("project-members") in html(client.get(url("project-home")))
    client.logout()
    client.force_login(world.member)
    assert url("project-members") not in html(client.get(url("project-home")))


@pytest.mark.parametrize("who", ["member", "viewer"])
def test_members_and_viewers_can_neither_see_nor_add_change_or_remove_members(client, world, who):
    client.force_login(getattr(world, who))
    before = roles(world)
    target = membership(world, world.viewer if who == "member" else world.member)
    assert client.get(url("project-members")).status_code == 403
    assert client.get(url("member-add")).status_code == 403
    assert client.post(url("member-add"), {"username": "mallory", "role": "admin"}, **HTMX).status_code == 403
    assert client.post(url("member-role", target.pk), {"role": "admin"}, **HTMX).status_code == 403
    assert client.post(url("member-remove", target.pk), **HTMX).status_code == 403
    # Nor themselves: a member cannot make themselves admin.
    own = membership(world, getattr(world, who))
    assert client.post(url("member-role", own.pk), {"role": "admin"}).status_code == 403
    assert roles(world) == before
    assert not AuditEvent.objects.filter(action__startswith="membership.").exists()


def test_an_outsider_gets_404_so_the_project_does_not_leak(client, world):
    client.force_login(world.outsider)
    assert client.get(url("project-members")).status_code == 404
    assert client.post(url("member-add"), {"username": "mallory", "role": "admin"}).status_code == 404
    assert "mallory" not in roles(world)


# Add, change, remove ----------------------------------------------------------------------------

def test_an_admin_adds_an_existing_user_with_a_role_through_the_dialog_and_it_is_audited(client, world):
    client.force_login(world.project_admin)
    dialog = html(client.get(url("member-add"), **HTMX))
    assert 'id="dialog-title">Add member<' in dialog and 'name="username"' in dialog
    response = client.post(url("member-add"), {"username": "mallory", "role": "viewer"}, **HTMX,
                           REMOTE_ADDR="10.9.8.7")
    assert response.status_code == 204
    assert json.loads(response["HX-Trigger"]) == {"membersChanged": True, "closeDialog": True}
    assert roles(world)["mallory"] == "viewer"
    event = AuditEvent.objects.get(action="membership.create")
    assert (event.actor, event.project, event.ip, event.after) == (
        world.project_admin, world.project, "10.9.8.7", {"username": "mallory", "role": "viewer"})
    # The list fragment the page reloads on membersChanged shows her.
    assert 'data-member="mallory"' in html(client.get(url("project-members") + "?fragment=list", **HTMX))


def test_adding_an_unknown_user_or_someone_already_in_says_what_to_do(client, world):
    client.force_login(world.project_admin)
    page = html(client.post(url("member-add"), {"username": "nobody", "role": "member"}, **HTMX))
    assert "No user named nobody" in page and "global administrator" in page
    page = html(client.post(url("member-add"), {"username": "carol", "role": "admin"}, **HTMX))
    assert "carol is already a member" in page and "Change role" in page
    assert roles(world)["carol"] == "viewer"  # the Add dialog never silently changes a role
    page = html(client.post(url("member-add"), {"username": world.service_account.user.username, "role": "member"},
                            **HTMX))
    assert "Service accounts belong to one project" in page
    assert not AuditEvent.objects.filter(action__startswith="membership.").exists()


def test_an_admin_changes_a_role_and_it_is_audited(client, world):
    client.force_login(world.project_admin)
    carol = membership(world, world.viewer)
    assert 'value="viewer" selected' in html(client.get(url("member-role", carol.pk), **HTMX)).replace(
        ' selected=""', " selected")
    assert client.post(url("member-role", carol.pk), {"role": "member"}, **HTMX).status_code == 204
    assert roles(world)["carol"] == "member"
    event = AuditEvent.objects.get(action="membership.update")
    assert event.before == {"role": "viewer"} and event.after == {"username": "carol", "role": "member"}


def test_an_admin_removes_a_member_and_their_token_stops_working(client, world):
    token = world.member_token(world.member)
    assert bearer(token).get("/api/projects/lab/jobs").status_code == 200
    client.force_login(world.project_admin)
    bob = membership(world, world.member)
    assert "Remove bob from Lab?" in html(client.get(url("member-remove", bob.pk), **HTMX))
    assert client.post(url("member-remove", bob.pk), **HTMX).status_code == 204
    assert "bob" not in roles(world)
    event = AuditEvent.objects.get(action="membership.delete")
    assert event.actor == world.project_admin and event.before == {"username": "bob", "role": "member"}
    assert bearer(token).get("/api/projects/lab/jobs").status_code in (401, 404)


def test_the_last_admin_can_be_neither_removed_nor_demoted_and_the_dialog_says_why(client, world):
    client.force_login(world.project_admin)
    alice = membership(world, world.project_admin)
    assert "(the last admin)" in html(client.get(url("project-members"))).split('data-member="alice"')[1]

    dialog = html(client.get(url("member-remove", alice.pk), **HTMX))
    assert "alice is the last admin of Lab and cannot be removed" in dialog
    assert "give another member the Admin role first" in dialog
    assert 'type="submit"' not in dialog  # nothing to press but Close
    response = client.post(url("member-remove", alice.pk), **HTMX)
    assert "cannot be removed" in html(response)

    response = client.post(url("member-role", alice.pk), {"role": "member"}, **HTMX)
    assert response.status_code == 200 and "must keep the Admin role" in html(response)
    assert roles(world)["alice"] == "admin"
    assert not AuditEvent.objects.filter(action__startswith="membership.").exists()

    # With a second admin, either may go.
    assert client.post(url("member-role", membership(world, world.member).pk), {"role": "admin"},
                       **HTMX).status_code == 204
    assert client.post(url("member-remove", alice.pk), **HTMX).status_code == 204
    assert roles(world) == {"bob": "admin", "carol": "viewer"}


def test_a_global_administrator_manages_members_without_being_one(client, world):
    client.force_login(world.global_admin)
    assert client.post(url("member-add", project="other"), {"username": "bob", "role": "member"},
                       **HTMX).status_code == 204
    assert Membership.objects.get(project=world.other_project, user=world.member).role == "member"
    # mallory is other's only admin: a global administrator cannot remove her either.
    mallory = Membership.objects.get(project=world.other_project, user=world.outsider)
    assert "last admin" in html(client.post(url("member-remove", mallory.pk, project="other"), **HTMX))
    assert Membership.objects.filter(pk=mallory.pk).exists()


def test_the_dialogs_work_as_whole_pages_without_htmx(client, world):
    client.force_login(world.project_admin)
    page = html(client.get(url("member-add")))
    assert "<html" in page and 'id="dialog-title">Add member<' in page
    response = client.post(url("member-add"), {"username": "mallory", "role": "member"})
    assert response.status_code == 302 and response.url == url("project-members")
    response = client.post(url("member-remove", membership(world, world.outsider).pk))
    assert response.status_code == 302 and "mallory" not in roles(world)


# The API calls the same services ----------------------------------------------------------------

def test_the_api_lists_and_removes_members_with_the_same_rules(world):
    admin = bearer(world.member_token(world.project_admin))
    listed = admin.get("/api/projects/lab/members").json()["items"]
    assert [(m["username"], m["role"]) for m in listed] == [("alice", "admin"), ("bob", "member"),
                                                            ("carol", "viewer")]
    body = assert_error(admin.delete("/api/projects/lab/members/alice"), 409, "last_admin")
    assert "alice is the last admin" in body["error"]
    assert_error(admin.post("/api/projects/lab/members", {"username": "alice", "role": "viewer"}, format="json"),
                 409, "last_admin")
    assert_error(admin.delete("/api/projects/lab/members/mallory"), 404, "not_a_member")
    assert admin.delete("/api/projects/lab/members/carol").status_code == 204
    assert "carol" not in roles(world)
    assert AuditEvent.objects.filter(action="membership.delete", actor=world.project_admin).count() == 1

    member = bearer(world.member_token(world.member))
    assert member.get("/api/projects/lab/members").status_code == 403
    assert member.delete("/api/projects/lab/members/alice").status_code == 403
    assert member.post("/api/projects/lab/members", {"username": "bob", "role": "admin"},
                       format="json").status_code == 403
    assert roles(world) == {"alice": "admin", "bob": "member"}


def test_a_worker_token_of_an_admin_service_account_cannot_manage_members(world):
    worker = bearer(world.token(world.service_account.user, ["read", "admin"], kind="service"))
    assert_error(worker.delete("/api/projects/lab/members/bob"), 403, "service_account_cannot_manage")
    assert roles(world)["bob"] == Role.MEMBER


# Japanese ---------------------------------------------------------------------------------------

def test_the_members_page_and_its_refusals_speak_japanese(client, world):
    client.force_login(world.project_admin)
    client.cookies["django_language"] = "ja"
    page = html(client.get(url("project-members")))
    assert "メンバーを追加" in page and "Roleを変更" in page
    alice = membership(world, world.project_admin)
    dialog = html(client.get(url("member-remove", alice.pk), **HTMX))
    assert "aliceはLabの最後のAdminなので外せません" in dialog
