"""The identity pages through Django's test client: sign-in, the shell, Project settings → Service
Accounts (create, issue a token, disable) and Project tokens (list, issue, revoke), with and without
HTMX, in English and Japanese."""
from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse

from mado import services
from mado.choices import Role, TokenKind
from mado.models import ApiToken, ServiceAccount
from tests.conftest import bearer

HTMX = {"HTTP_HX_REQUEST": "true"}
TOKEN_RE = re.compile(r"mmt_[A-Za-z0-9_-]{40,}")

pytestmark = pytest.mark.django_db


def signed_in(client, user):
    client.force_login(user)
    return client


def sa_url(name: str, project: str = "lab", *args) -> str:
    return reverse(name, args=[project, *args])


def html(response) -> str:
    return response.content.decode()


def triggers(response) -> dict:
    return json.loads(response.headers.get("HX-Trigger", "{}"))


def token_works(plaintext: str) -> int:
    return bearer(plaintext).get("/api/auth/token").status_code


def issue_from_dialog(client, account: ServiceAccount, scopes: list[str], **extra) -> tuple[object, str]:
    response = client.post(sa_url("service-account-token-create", "lab", account.pk),
                           {"scopes": scopes, "expires_in_days": 30}, **extra)
    assert response.status_code == 200, html(response)
    found = TOKEN_RE.findall(html(response))
    assert len(set(found)) == 1, html(response)
    return response, found[0]


# Sign-in and the shell --------------------------------------------------------------------------

def test_the_login_page_renders_a_form_with_username_and_password(client):
    response = client.get(reverse("login"))
    assert response.status_code == 200
    page = html(response)
    assert "Sign in" in page
    assert 'name="username"' in page and 'name="password"' in page


def test_a_person_signs_in_through_the_login_form_and_lands_on_their_project(client, world):
    response = client.post(reverse("login"), {"username": "alice", "password": "alice-pass-123"}, follow=True)
    assert response.status_code == 200
    assert response.wsgi_request.user == world.project_admin
    assert response.redirect_chain[-1][0] == reverse("project-home", args=["lab"])


def test_a_service_account_user_cannot_sign_in_because_its_password_is_unusable(client, world):
    user = world.service_account.user
    assert not user.has_usable_password()
    for password in ["", "!", user.password]:
        response = client.post(reverse("login"), {"username": user.username, "password": password})
        assert response.status_code == 200  # the form again, not a redirect
        assert "_auth_user_id" not in client.session
    assert client.login(username=user.username, password="anything") is False


def test_a_signed_in_page_shows_the_user_menu_with_global_settings_and_sign_out(client, world):
    page = html(signed_in(client, world.member).get(reverse("project-home", args=["lab"])))
    assert "bob" in page
    assert "Global settings" in page and reverse("global-settings") in page
    assert "Sign out" in page and reverse("logout") in page
    assert "Global administration" not in page


def test_the_user_menu_offers_global_administration_only_to_global_administrators(client, world):
    page = html(signed_in(client, world.global_admin).get(reverse("global-settings")))
    assert "Global administration" in page and reverse("admin:index") in page
    client.logout()
    page = html(signed_in(client, world.project_admin).get(reverse("global-settings")))
    assert "Global administration" not in page


def test_signing_out_ends_the_session(client, world):
    signed_in(client, world.member)
    response = client.post(reverse("logout"))
    assert response.status_code == 302
    assert "_auth_user_id" not in client.session
    assert client.get(reverse("global-settings")).status_code == 302


def test_the_project_switcher_lists_only_the_users_projects(client, world):
    switcher = re.compile(r'<select id="project-switch".*?</select>', re.S)
    page = switcher.search(html(signed_in(client, world.member).get(reverse("global-settings")))).group(0)
    assert ">Lab<" in page and ">Other<" not in page
    client.logout()
    page = switcher.search(html(signed_in(client, world.outsider).get(reverse("global-settings")))).group(0)
    assert ">Other<" in page and ">Lab<" not in page
    client.logout()
    page = switcher.search(html(signed_in(client, world.global_admin).get(reverse("global-settings")))).group(0)
    assert ">Other<" in page and ">Lab<" in page


def test_choosing_a_project_in_the_switcher_opens_it_even_without_javascript(client, world):
    signed_in(client, world.global_admin)
    response = client.get(reverse("home"), {"project": "other"})
    assert response.status_code == 302 and response.url == reverse("project-home", args=["other"])
    client.logout()
    assert signed_in(client, world.member).get(reverse("home"), {"project": "other"}).status_code == 404


def test_the_language_switch_in_the_user_menu_turns_the_pages_japanese(client, world):
    signed_in(client, world.project_admin)
    page = html(client.get(sa_url("service-accounts")))
    assert 'action="/i18n/setlang/"' in page and '<option value="ja"' in page
    response = client.post("/i18n/setlang/", {"language": "ja", "next": sa_url("service-accounts")})
    assert response.status_code == 302 and response.url == sa_url("service-accounts")
    assert '<html lang="ja">' in html(client.get(sa_url("service-accounts")))


def test_pages_need_a_signed_in_user(client, world):
    response = client.get(sa_url("service-accounts"))
    assert response.status_code == 302
    assert response.url.startswith(reverse("login"))


# Service Accounts page --------------------------------------------------------------------------

@pytest.mark.parametrize("who", ["project_admin", "global_admin"])
def test_project_admins_and_global_admins_see_the_service_accounts_page(client, world, who):
    response = signed_in(client, getattr(world, who)).get(sa_url("service-accounts"))
    assert response.status_code == 200
    page = html(response)
    assert "Service Accounts" in page
    assert "gpu-host-1-worker" in page
    assert "Create Service Account" in page


@pytest.mark.parametrize("who", ["member", "viewer"])
def test_members_and_viewers_get_403_on_the_service_accounts_page(client, world, who):
    signed_in(client, getattr(world, who))
    assert client.get(sa_url("service-accounts")).status_code == 403
    assert client.get(sa_url("service-account-create")).status_code == 403
    assert client.post(sa_url("service-account-create"), {"name": "x", "role": "member"}).status_code == 403
    assert client.get(sa_url("service-account-disable", "lab", world.service_account.pk)).status_code == 403
    assert not ServiceAccount.objects.filter(name="x").exists()
    assert "needs the admin role" in html(client.get(sa_url("service-accounts")))


def test_an_outsider_gets_404_on_the_service_accounts_page_so_the_project_does_not_leak(client, world):
    signed_in(client, world.outsider)
    response = client.get(sa_url("service-accounts"))
    assert response.status_code == 404
    assert "Lab" not in html(response).split("<main>")[1]
    assert client.get(sa_url("service-account-token-create", "lab", world.service_account.pk)).status_code == 404


def test_the_project_page_links_service_accounts_only_for_project_admins(client, world):
    page = html(signed_in(client, world.project_admin).get(reverse("project-home", args=["lab"])))
    assert sa_url("service-accounts") in page
    client.logout()
    page = html(signed_in(client, world.member).get(reverse("project-home", args=["lab"])))
    assert sa_url("service-accounts") not in page
    assert sa_url("project-tokens") in page


# Create Service Account dialog ------------------------------------------------------------------

def test_the_create_dialog_is_a_fragment_for_htmx_and_a_whole_page_without_it(client, world):
    signed_in(client, world.project_admin)
    fragment = html(client.get(sa_url("service-account-create"), **HTMX))
    assert "<html" not in fragment
    assert 'id="dialog-title"' in fragment and "Create Service Account" in fragment
    assert 'name="name"' in fragment and 'name="role"' in fragment
    page = html(client.get(sa_url("service-account-create")))
    assert "<html" in page and 'name="name"' in page


def test_creating_a_service_account_through_the_htmx_dialog_answers_204_and_closes_the_dialog(client, world):
    signed_in(client, world.project_admin)
    response = client.post(sa_url("service-account-create"), {"name": "trainer-01", "role": "admin"}, **HTMX)
    assert response.status_code == 204
    assert triggers(response) == {"serviceAccountsChanged": True, "closeDialog": True}
    account = ServiceAccount.objects.get(project=world.project, name="trainer-01")
    assert account.role == Role.ADMIN and account.created_by == world.project_admin
    listing = html(client.get(sa_url("service-accounts") + "?fragment=list", **HTMX))
    assert "<html" not in listing and 'data-service-account="trainer-01"' in listing


def test_an_invalid_service_account_name_re_renders_the_dialog_with_the_error(client, world):
    signed_in(client, world.project_admin)
    response = client.post(sa_url("service-account-create"), {"name": "no spaces!", "role": "member"}, **HTMX)
    assert response.status_code == 200
    page = html(response)
    assert "HX-Trigger" not in response.headers
    assert "letters, digits" in page and 'class="field invalid"' in page
    assert 'value="no spaces!"' in page
    assert not ServiceAccount.objects.filter(name="no spaces!").exists()


def test_a_duplicate_service_account_name_in_another_case_re_renders_the_dialog_with_the_error(client, world):
    signed_in(client, world.project_admin)
    response = client.post(sa_url("service-account-create"), {"name": "GPU-Host-1-Worker", "role": "member"}, **HTMX)
    assert response.status_code == 200
    assert "already exists" in html(response)
    assert ServiceAccount.objects.filter(project=world.project, name__iexact="gpu-host-1-worker").count() == 1


def test_creating_a_service_account_without_htmx_redirects_to_the_list(client, world):
    signed_in(client, world.project_admin)
    response = client.post(sa_url("service-account-create"), {"name": "plain-form", "role": "viewer"})
    assert response.status_code == 302 and response.url == sa_url("service-accounts")
    assert 'data-service-account="plain-form"' in html(client.get(response.url))
    # and an error comes back as the whole page with the form
    response = client.post(sa_url("service-account-create"), {"name": "plain-form", "role": "viewer"})
    assert response.status_code == 200
    assert "<html" in html(response) and "already exists" in html(response)


@pytest.mark.parametrize("route", ["service-account-create", "service-account-token-create",
                                   "service-account-disable", "personal-token-create"])
def test_every_dialog_also_opens_as_a_whole_page_without_htmx(client, world, route):
    signed_in(client, world.project_admin)
    args = [world.service_account.pk] if "service-account-" in route and route != "service-account-create" else []
    response = client.get(sa_url(route, "lab", *args))
    assert response.status_code == 200
    page = html(response)
    assert "<html" in page and 'id="dialog-title"' in page and "<form" in page
    assert 'method="post"' in page and f'action="{sa_url(route, "lab", *args)}"' in page


# Issue API token dialog -------------------------------------------------------------------------

def scope_boxes(page: str) -> set[str]:
    return set(re.findall(r'<input type="checkbox" name="scopes" value="([^"]+)"', page))


def test_the_token_dialog_offers_worker_execute_only_to_admin_role_service_accounts(client, world):
    signed_in(client, world.project_admin)
    admin_page = html(client.get(sa_url("service-account-token-create", "lab", world.service_account.pk), **HTMX))
    assert "worker:execute" in scope_boxes(admin_page)
    assert "launcher:execute" not in scope_boxes(admin_page)
    member_account = services.create_service_account(services.Actor(world.project_admin), world.project,
                                                     name="uploader", role=Role.MEMBER)
    member_page = html(client.get(sa_url("service-account-token-create", "lab", member_account.pk), **HTMX))
    assert scope_boxes(member_page) == {"read", "jobs:write", "runs:write", "artifacts:write", "registry:write", "admin"}
    viewer_account = services.create_service_account(services.Actor(world.project_admin), world.project,
                                                     name="reader", role=Role.VIEWER)
    assert scope_boxes(html(client.get(sa_url("service-account-token-create", "lab", viewer_account.pk),
                                       **HTMX))) == {"read"}
    # Posting a scope the dialog did not offer is refused by the form, and nothing is issued.
    before = ApiToken.objects.count()
    response = client.post(sa_url("service-account-token-create", "lab", member_account.pk),
                           {"scopes": ["worker:execute"], "expires_in_days": 30}, **HTMX)
    assert response.status_code == 200 and "worker:execute is not one of the available choices" in html(response)
    assert ApiToken.objects.count() == before


def test_the_issued_token_is_shown_once_works_and_never_appears_again(client, world):
    signed_in(client, world.project_admin)
    response, plaintext = issue_from_dialog(client, world.service_account, ["read", "worker:execute"], **HTMX)
    assert "no-store" in response.headers["Cache-Control"]
    assert triggers(response) == {"tokensChanged": True}
    assert "Copy" in html(response)
    info = bearer(plaintext).get("/api/auth/token")
    assert info.status_code == 200
    assert info.json()["kind"] == "service" and info.json()["scopes"] == ["read", "worker:execute"]
    token = ApiToken.objects.get(pk=info.json()["id"])
    assert token.prefix == plaintext[:12]
    for url in [sa_url("project-tokens"), sa_url("project-tokens") + "?fragment=list", sa_url("service-accounts"),
                sa_url("service-accounts") + "?fragment=list"]:
        page = html(client.get(url, **HTMX)) + html(client.get(url))
        assert plaintext not in page and plaintext[12:] not in page
    assert token.prefix in html(client.get(sa_url("project-tokens")))


def test_issuing_a_service_account_token_without_htmx_shows_the_token_on_a_whole_page(client, world):
    signed_in(client, world.project_admin)
    response, plaintext = issue_from_dialog(client, world.service_account, ["read"])
    assert "<html" in html(response)
    assert "no-store" in response.headers["Cache-Control"]
    assert token_works(plaintext) == 200
    assert sa_url("project-tokens") in html(response)


def test_a_token_form_without_scopes_re_renders_with_an_error(client, world):
    signed_in(client, world.project_admin)
    response = client.post(sa_url("service-account-token-create", "lab", world.service_account.pk),
                           {"expires_in_days": 30}, **HTMX)
    assert response.status_code == 200
    assert "required" in html(response) and "mmt_" not in html(response)
    response = client.post(sa_url("service-account-token-create", "lab", world.service_account.pk),
                           {"scopes": ["read"], "expires_in_days": 366}, **HTMX)
    assert response.status_code == 200 and "mmt_" not in html(response)


# Disable dialog ---------------------------------------------------------------------------------

def test_the_disable_dialog_disables_the_account_and_its_tokens_get_401(client, world):
    assert token_works(world.worker_token) == 200
    signed_in(client, world.project_admin)
    url = sa_url("service-account-disable", "lab", world.service_account.pk)
    dialog = html(client.get(url, **HTMX))
    assert "gpu-host-1-worker" in dialog and "Disable" in dialog
    response = client.post(url, **HTMX)
    assert response.status_code == 204
    assert triggers(response) == {"serviceAccountsChanged": True, "closeDialog": True}
    world.service_account.refresh_from_db()
    assert world.service_account.is_disabled
    assert token_works(world.worker_token) == 401
    row = re.search(r'<tr data-service-account="gpu-host-1-worker">.*?</tr>',
                    html(client.get(sa_url("service-accounts"))), re.S).group(0)
    assert "Disabled" in row and "Issue API token" not in row


def test_disabling_without_htmx_redirects_to_the_list(client, world):
    signed_in(client, world.project_admin)
    response = client.post(sa_url("service-account-disable", "lab", world.service_account.pk))
    assert response.status_code == 302 and response.url == sa_url("service-accounts")
    assert token_works(world.worker_token) == 401


def test_a_disabled_service_account_gets_no_new_token_from_the_dialog(client, world):
    services.disable_service_account(services.Actor(world.project_admin), world.service_account)
    signed_in(client, world.project_admin)
    response = client.post(sa_url("service-account-token-create", "lab", world.service_account.pk),
                           {"scopes": ["read"], "expires_in_days": 30}, **HTMX)
    assert response.status_code == 200
    assert "disabled" in html(response) and "mmt_" not in html(response)


# Project tokens ---------------------------------------------------------------------------------

def test_a_project_admin_sees_every_token_of_the_project_and_a_member_only_their_own(client, world):
    member_plain = world.member_token(world.member)
    viewer_plain = world.token(world.viewer, ["read"])
    prefixes = {name: plain[:12] for name, plain in
                [("worker", world.worker_token), ("member", member_plain), ("viewer", viewer_plain)]}
    page = html(signed_in(client, world.project_admin).get(sa_url("project-tokens")))
    assert all(prefix in page for prefix in prefixes.values())
    assert "Every token of this Project." in page
    client.logout()
    page = html(signed_in(client, world.member).get(sa_url("project-tokens")))
    assert prefixes["member"] in page
    assert prefixes["worker"] not in page and prefixes["viewer"] not in page
    assert "Your tokens in this Project." in page


def test_the_outsider_gets_404_on_project_tokens(client, world):
    assert signed_in(client, world.outsider).get(sa_url("project-tokens")).status_code == 404


def test_revoking_through_htmx_returns_the_row_marked_revoked_and_the_token_gets_401(client, world):
    signed_in(client, world.project_admin)
    token = ApiToken.objects.get(prefix=world.worker_token[:12])
    response = client.post(sa_url("token-revoke", "lab", token.pk), **HTMX)
    assert response.status_code == 200
    row = html(response)
    assert row.startswith(f'<tr id="token-{token.pk}"') and "Revoked" in row and "<form" not in row
    assert token_works(world.worker_token) == 401


def test_revoking_without_htmx_redirects_to_the_token_list(client, world):
    plain = world.member_token(world.member)
    token = ApiToken.objects.get(prefix=plain[:12])
    signed_in(client, world.member)
    response = client.post(sa_url("token-revoke", "lab", token.pk))
    assert response.status_code == 302 and response.url == sa_url("project-tokens")
    assert token_works(plain) == 401


def test_a_member_cannot_revoke_someone_elses_token(client, world):
    token = ApiToken.objects.get(prefix=world.worker_token[:12])
    signed_in(client, world.member)
    assert client.post(sa_url("token-revoke", "lab", token.pk), **HTMX).status_code == 404
    assert client.get(sa_url("token-revoke", "lab", token.pk)).status_code == 405
    assert token_works(world.worker_token) == 200


def test_a_member_issues_a_personal_token_through_the_page(client, world):
    signed_in(client, world.member)
    page = html(client.get(sa_url("project-tokens")))
    assert "Issue personal token" in page
    form = html(client.get(sa_url("personal-token-create"), **HTMX))
    assert "worker:execute" not in scope_boxes(form) and "read" in scope_boxes(form)
    response = client.post(sa_url("personal-token-create"), {"scopes": ["read", "jobs:write"], "expires_in_days": 7},
                           **HTMX)
    assert response.status_code == 200 and "no-store" in response.headers["Cache-Control"]
    plaintext = TOKEN_RE.search(html(response)).group(0)
    info = bearer(plaintext).get("/api/auth/token").json()
    assert info["kind"] == TokenKind.PERSONAL and info["scopes"] == ["jobs:write", "read"]
    assert plaintext not in html(client.get(sa_url("project-tokens")))


def test_a_viewer_cannot_issue_a_personal_token(client, world):
    signed_in(client, world.viewer)
    assert "Issue personal token" not in html(client.get(sa_url("project-tokens")))
    assert client.get(sa_url("personal-token-create")).status_code == 403
    response = client.post(sa_url("personal-token-create"), {"scopes": ["read"], "expires_in_days": 7}, **HTMX)
    assert response.status_code == 403
    assert not ApiToken.objects.filter(user=world.viewer).exists()


# Japanese ---------------------------------------------------------------------------------------

def test_the_service_accounts_page_speaks_japanese_when_the_browser_asks_for_it(client, world):
    signed_in(client, world.project_admin)
    page = html(client.get(sa_url("service-accounts"), HTTP_ACCEPT_LANGUAGE="ja"))
    assert '<html lang="ja">' in page
    assert "Service Accountを作成" in page, "locale/ja catalog missing or without this message"
    client.cookies["django_language"] = "ja"
    assert "API tokenを発行" in html(client.get(sa_url("service-accounts")))


def test_global_settings_leads_to_the_computers_list(world, client):
    client.force_login(world.member)
    page = client.get("/settings/").content.decode()
    assert 'href="/settings/computers/"' in page


def test_the_personal_token_dialog_preselects_the_scopes_a_shortcut_asks_for_and_only_allowed_ones(client, world):
    """The manual-submission instructions link here with read and jobs:write preselected."""
    signed_in(client, world.member)  # bob: a member may not hold worker:execute
    url = reverse("personal-token-create", args=["lab"]) + "?scopes=read&scopes=jobs:write&scopes=worker:execute"
    page = html(client.get(url))
    checked = set(re.findall(r'name="scopes" value="([^"]+)"[^>]*checked', page))
    assert checked == {"read", "jobs:write"}
    assert 'value="worker:execute"' not in page


def test_tokens_of_a_disabled_service_account_show_as_unusable_without_revoke(client, world):
    """The API refuses them (401) from the moment the account is disabled; the list said Active with Revoke."""
    prefix = world.worker_token[:12]
    services.disable_service_account(services.Actor(world.project_admin), world.service_account)
    assert token_works(world.worker_token) == 401
    signed_in(client, world.project_admin)
    page = html(client.get(sa_url("project-tokens")))
    row = page.split(f'data-token-prefix="{prefix}"')[1].split("</tr>")[0]
    assert "Disabled (service account)" in row and ">Active<" not in row
    assert "Revoke" not in row
    # A person's token next to it is still Active with Revoke.
    own = ApiToken.objects.filter(user=world.project_admin).first() or services.issue_personal_token(
        services.Actor(world.project_admin), world.project, scopes=["read"])[0]
    mine = html(client.get(sa_url("project-tokens"))).split(f'data-token-prefix="{own.prefix}"')[1].split("</tr>")[0]
    assert ">Active<" in mine and "Revoke" in mine
    client.cookies["django_language"] = "ja"
    page = html(client.get(sa_url("project-tokens")))
    assert "無効（Service Account）" in page.split(f'data-token-prefix="{prefix}"')[1].split("</tr>")[0]


def test_a_page_address_that_does_not_exist_says_not_found_without_listing_the_servers_urls(client, world):
    signed_in(client, world.member)
    response = client.get("/settings/computers/add")
    assert response.status_code == 404
    page = html(response)
    assert "There is nothing here that you can see." in page
    assert "tried" not in page and "URLResolver" not in page and "admin/" not in page.split("<main>")[1]
