"""Global administration → Users through Django's test client: a global administrator creates a person's
account with an initial password or a one-time set-password link; nobody else can; the link works once;
every change is audited without secrets. Also Global settings → Your projects."""
from __future__ import annotations

import json
import re

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from mado import services
from mado.errors import Forbidden
from mado.models import AuditEvent

HTMX = {"HTTP_HX_REQUEST": "true"}
LINK_RE = re.compile(r"https?://[^\s<\"]+/set-password/[^\s<\"]+/")

pytestmark = pytest.mark.django_db


def html(response) -> str:
    return response.content.decode()


def create(client, **fields):
    data = {"username": "dave", "email": "dave@example.org", "sign_in": "link", "password": "", **fields}
    return client.post(reverse("user-create"), data, **HTMX)


def path_of(link: str) -> str:
    return "/" + link.split("/", 3)[3]


# Who may ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("who", ["project_admin", "member", "outsider"])
def test_only_global_administrators_can_create_users(client, world, who):
    client.force_login(getattr(world, who))
    assert client.get(reverse("users")).status_code == 403
    assert client.get(reverse("user-create")).status_code == 403
    assert create(client, sign_in="password", password="a-long-pass-phrase").status_code == 403
    assert client.post(reverse("user-set-password-link", args=[world.member.pk]), **HTMX).status_code == 403
    assert not User.objects.filter(username="dave").exists()
    with pytest.raises(Forbidden):
        services.create_user(services.Actor(getattr(world, who)), username="eve", email="eve@example.org")
    assert not User.objects.filter(username="eve").exists()
    assert not AuditEvent.objects.filter(action__startswith="user.").exists()


def test_global_settings_leads_global_administrators_to_users(client, world):
    client.force_login(world.global_admin)
    page = html(client.get(reverse("global-settings")))
    assert f'href="{reverse("users")}"' in page
    client.logout()
    client.force_login(world.project_admin)
    assert f'href="{reverse("users")}"' not in html(client.get(reverse("global-settings")))


def test_the_users_list_shows_people_with_their_projects_and_no_service_accounts(client, world):
    client.force_login(world.global_admin)
    page = html(client.get(reverse("users")))
    bob = page.split('data-user="bob"')[1].split("</tr>")[0]
    assert "Lab" in bob and "Member" in bob
    assert "sa-" not in page and "gpu-host-1-worker" not in page
    assert "Create user" in page


# Creating users ---------------------------------------------------------------------------------

def test_a_user_created_with_an_initial_password_signs_in_with_it(client, world):
    client.force_login(world.global_admin)
    response = create(client, sign_in="password", password="correct-horse-battery")
    assert response.status_code == 200
    assert json.loads(response["HX-Trigger"]) == {"usersChanged": True}
    assert "dave" in html(response) and "set-password" not in html(response)
    dave = User.objects.get(username="dave")
    assert dave.email == "dave@example.org" and not dave.is_superuser and not dave.is_staff
    event = AuditEvent.objects.get(action="user.create")
    assert event.actor == world.global_admin
    assert event.after == {"username": "dave", "email": "dave@example.org", "password": "initial"}
    assert "correct-horse-battery" not in json.dumps([event.before, event.after])
    client.logout()
    response = client.post(reverse("login"), {"username": "dave", "password": "correct-horse-battery"})
    assert response.status_code == 302 and client.session.get("_auth_user_id") == str(dave.pk)


def test_a_user_created_with_a_link_sets_a_password_once_and_then_signs_in(client, world):
    client.force_login(world.global_admin)
    response = create(client)
    assert response["Cache-Control"] == "no-store"
    links = LINK_RE.findall(html(response))
    assert len(set(links)) == 1, html(response)
    dave = User.objects.get(username="dave")
    assert not dave.has_usable_password()
    assert "works once" in html(response)
    client.logout()

    page = client.get(path_of(links[0]), follow=True)
    assert "Set your password" in html(page) and "Choose a password for dave" in html(page)
    form_url = page.redirect_chain[-1][0]
    weak = client.post(form_url, {"new_password1": "dave", "new_password2": "dave"})
    assert "too short" in html(weak) or "too similar" in html(weak)
    done = client.post(form_url, {"new_password1": "correct-horse-battery", "new_password2": "correct-horse-battery"})
    assert done.status_code == 302 and done.url == reverse("login")
    assert "Your password is set" in html(client.get(reverse("login")))
    assert client.login(username="dave", password="correct-horse-battery")
    client.logout()

    # The link worked once.
    again = client.get(path_of(links[0]), follow=True)
    assert "no longer works" in html(again) and 'name="new_password1"' not in html(again)
    actions = list(AuditEvent.objects.order_by("id").values_list("action", flat=True))
    assert actions[-3:] == ["user.create", "user.set_password_link", "user.set_password"]
    token = path_of(links[0]).rstrip("/").rsplit("/", 1)[1]
    assert token not in json.dumps(list(AuditEvent.objects.values("before", "after")))


def test_a_global_administrator_makes_a_new_link_for_someone_who_lost_their_password(client, world):
    client.force_login(world.global_admin)
    confirm = html(client.get(reverse("user-set-password-link", args=[world.member.pk]), **HTMX))
    assert "Create a one-time link where bob sets a new password?" in confirm
    response = client.post(reverse("user-set-password-link", args=[world.member.pk]), **HTMX)
    link = LINK_RE.findall(html(response))[0]
    client.logout()
    form_url = client.get(path_of(link), follow=True).redirect_chain[-1][0]
    client.post(form_url, {"new_password1": "a-new-pass-phrase", "new_password2": "a-new-pass-phrase"})
    assert client.login(username="bob", password="a-new-pass-phrase")


def test_a_service_account_gets_no_set_password_link(client, world):
    client.force_login(world.global_admin)
    assert client.get(reverse("user-set-password-link", args=[world.service_account.user.pk])).status_code == 404
    with pytest.raises(services.ServiceError, match="Service accounts have no password"):
        services.set_password_link(services.Actor(world.global_admin), world.service_account.user)


def test_the_create_form_says_what_to_fix_for_every_field_at_once(client, world):
    client.force_login(world.global_admin)
    page = html(create(client, username="BOB", email="not-an-address", sign_in="password", password="123"))
    assert "A user named BOB already exists" in page
    assert "Enter an e-mail address such as name@example.org" in page
    page = html(create(client, username="dave", sign_in="password", password=""))
    assert "Enter the initial password, or choose the one-time link" in page
    page = html(create(client, username="dave", sign_in="password", password="dave@example"))
    assert "too similar" in page or "too common" in page
    assert not User.objects.filter(username="dave").exists()


def test_the_users_page_speaks_japanese(client, world):
    client.force_login(world.global_admin)
    client.cookies["django_language"] = "ja"
    page = html(client.get(reverse("users")))
    assert "ユーザーを作成" in page


# Your projects ----------------------------------------------------------------------------------

def test_your_projects_lists_every_project_a_global_administrator_is_admin_of(client, world):
    """The demo admin is a global administrator with no membership rows: the list was empty while the
    project page said "Your role: Admin"."""
    client.force_login(world.global_admin)
    page = html(client.get(reverse("global-settings")))
    for slug in ("lab", "other"):
        row = page.split(f'data-project="{slug}"')[1].split("</tr>")[0]
        assert "Admin" in row and "(as a global administrator)" in row
    assert "As a global administrator you can open every project." not in page


def test_your_projects_lists_a_members_projects_with_their_roles(client, world):
    client.force_login(world.viewer)
    page = html(client.get(reverse("global-settings")))
    row = page.split('data-project="lab"')[1].split("</tr>")[0]
    assert "Viewer" in row and "global administrator" not in row
    assert 'data-project="other"' not in page
