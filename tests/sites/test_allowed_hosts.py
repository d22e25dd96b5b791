"""Issue 14, finding 2: the shared launcher is no port scanner. Global administrators set, per launcher,
the hosts it may log in to (fnmatch-style patterns, case-insensitive; empty: nowhere); a site naming a
login node or jump host outside them is refused at save with the list and who changes it; the launcher
is handed no such site; and a failed connection check tells people who are not global administrators
only what they can fix (the launcher's own message goes to the audit and to global administrators)."""
from __future__ import annotations

import html as htmllib

import pytest
from django.urls import reverse

from jobs.models import Job
from mado.errors import ServiceError
from mado.models import AuditEvent
from mado.services import Actor
from sites import allowed_hosts, checks, launchers, services
from sites.models import Launcher, SiteCheck, SiteSettings
from tests.conftest import ALL_MEMBER_SCOPES, assert_error, bearer
from tests.sites.conftest import JUMP_HOST, LOGIN_HOST
from tests.sites.site_jobs import claim, no_expiry_throttle, queue  # noqa: F401

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
HPC = ["*.hpc.example.org"]


def html(response) -> str:
    return htmllib.unescape(response.content.decode()).replace("\xa0", " ")


@pytest.fixture
def hpc(world):
    """(launcher, its API client) allowed to log in to *.hpc.example.org only."""
    launcher, token = launchers.register_launcher(Actor(world.global_admin), "hpc-a", world.project, HPC)
    return launcher, bearer(token)


def fields(site_fields, launcher, **overrides):
    return site_fields(launcher=launcher.pk, visibility="public", **overrides)


def refusal(call, *args, **kwargs) -> ServiceError:
    with pytest.raises(ServiceError) as refused:
        call(*args, **kwargs)
    return refused.value


# Patterns ------------------------------------------------------------------------------------------

def test_patterns_are_globs_matched_without_regard_to_case():
    patterns = allowed_hosts.parse("*.HPC.example.ac.jp\nlogin[1-4].example.org, 10.0.0.*  login[1-4].example.org")
    assert patterns == ["*.hpc.example.ac.jp", "login[1-4].example.org", "10.0.0.*"]
    assert allowed_hosts.matches(patterns, "Login1.HPC.Example.AC.JP")
    assert allowed_hosts.matches(patterns, "login3.example.org") and allowed_hosts.matches(patterns, "10.0.0.5")
    assert not allowed_hosts.matches(patterns, "login5.example.org")
    assert not allowed_hosts.matches(patterns, "hpc.example.ac.jp.evil.example.com")
    assert not allowed_hosts.matches(patterns, "hpc.example.ac.jp")  # *. needs a label before it
    assert not allowed_hosts.matches([], "login1.example.org"), "an empty list allows nowhere"


@pytest.mark.parametrize("bad", ["me@login.example.org", "login.example.org:22", "login/24", "a;b"])
def test_a_pattern_is_a_host_name_pattern_only(bad):
    with pytest.raises(ServiceError) as refused:
        allowed_hosts.parse([bad])
    assert refused.value.code == "invalid_allowed_hosts" and "allowed_hosts" in refused.value.fields


# Saving a site --------------------------------------------------------------------------------------

def test_a_new_launcher_logs_in_nowhere_until_an_administrator_says_where(world, site_fields):
    launcher, _ = launchers.register_launcher(Actor(world.global_admin), "fresh", world.project)
    assert launcher.allowed_hosts == []
    error = refusal(services.create_site, Actor(world.member), fields(site_fields, launcher))
    assert error.status == 422 and set(error.fields) == {"host"}
    assert "may not log in to any host yet" in error.fields["host"][0]
    assert "global administrator" in error.fields["host"][0] and "Launchers" in error.fields["host"][0]


def test_a_site_outside_its_launchers_hosts_is_refused_with_the_list_and_who_changes_it(world, site_fields, hpc):
    launcher, _ = hpc
    researcher = bearer(world.member_token(world.member))
    response = researcher.post("/api/sites", fields(site_fields, launcher, host="intranet.example.com"),
                               format="json")
    body = assert_error(response, 422, "invalid_site")
    message = body["fields"]["host"][0]
    assert "*.hpc.example.org" in message and "intranet.example.com" in message
    assert "global administrator" in message and "Global administration → Launchers" in message
    assert not SiteSettings.objects.exists()
    ok = researcher.post("/api/sites", fields(site_fields, launcher), format="json")
    assert ok.status_code == 201, ok.content


def test_jump_hosts_must_be_allowed_too(world, site_fields, hpc, host_keys):
    launcher, _ = hpc
    known = f"{host_keys.login_line}\n{host_keys.jump_line}\n"
    error = refusal(services.create_site, Actor(world.member),
                    fields(site_fields, launcher, jump_hosts=["me@gw.example.com:2222"], known_hosts=known))
    assert "gw.example.com" in error.fields["jump_hosts"][0] and "host" not in error.fields
    target = services.create_site(Actor(world.member), fields(site_fields, launcher, jump_hosts=[
        f"me@{JUMP_HOST.upper()}:2222"], known_hosts=known))
    assert SiteSettings.objects.get(target=target).jump_hosts == [f"me@{JUMP_HOST.upper()}:2222"]


def test_changing_the_destination_is_checked_but_other_changes_are_not(world, site_fields, hpc):
    launcher, _ = hpc
    target = services.create_site(Actor(world.member), fields(site_fields, launcher))
    error = refusal(services.update_site, Actor(world.member), target, {"host": "db.example.com"})
    assert "host" in error.fields and "*.hpc.example.org" in error.fields["host"][0]
    launchers.set_allowed_hosts(Actor(world.global_admin), launcher, ["login2.hpc.example.org"])
    # Disabling a site its launcher may no longer reach still works, and says nothing about hosts.
    services.update_site(Actor(world.member), target, {"enabled": False})
    assert not SiteSettings.objects.get(target=target).target.enabled


def test_global_administrators_are_held_to_the_list_too(world, site_fields, hpc):
    launcher, _ = hpc
    error = refusal(services.create_site, Actor(world.global_admin), fields(site_fields, launcher, host="10.9.9.9"))
    assert "host" in error.fields


# The launcher API --------------------------------------------------------------------------------

def test_global_administrators_set_the_list_through_the_api_and_it_is_audited(world, hpc):
    launcher, _ = hpc
    root = bearer(world.token(world.global_admin, ALL_MEMBER_SCOPES))
    body = root.get(f"/api/launchers/{launcher.pk}").json()
    assert body["allowed_hosts"] == HPC and body["sites_outside_allowed_hosts"] == []
    changed = root.patch(f"/api/launchers/{launcher.pk}", {"allowed_hosts": ["Login[1-4].example.org"]},
                         format="json")
    assert changed.status_code == 200, changed.content
    assert changed.json()["allowed_hosts"] == ["login[1-4].example.org"]
    row = AuditEvent.objects.get(action="launcher.allowed_hosts.update", object_id=str(launcher.pk))
    assert row.before == {"allowed_hosts": HPC} and row.after == {"allowed_hosts": ["login[1-4].example.org"]}
    assert_error(root.patch(f"/api/launchers/{launcher.pk}", {"allowed_hosts": ["a b@c"]}, format="json"),
                 422, "invalid_allowed_hosts")
    assert_error(root.patch(f"/api/launchers/{launcher.pk}", {"allowed_hosts": "*.x"}, format="json"),
                 422, "invalid_allowed_hosts")
    assert_error(root.patch(f"/api/launchers/{launcher.pk}", {"name": "renamed"}, format="json"),
                 422, "read_only_fields")
    created = root.post("/api/launchers", {"name": "hpc-b", "project": "lab", "allowed_hosts": ["*.b.example.org"]},
                        format="json")
    assert created.status_code == 201 and created.json()["allowed_hosts"] == ["*.b.example.org"]
    for who in (world.project_admin, world.member):
        client = bearer(world.token(who, ALL_MEMBER_SCOPES))
        assert_error(client.patch(f"/api/launchers/{launcher.pk}", {"allowed_hosts": ["*"]}, format="json"),
                     403, "global_admin_required")
    assert Launcher.objects.get(pk=launcher.pk).allowed_hosts == ["login[1-4].example.org"]


def test_a_site_left_outside_a_narrowed_list_is_not_handed_to_the_launcher(world, site_fields, hpc):
    launcher, client = hpc
    target = services.create_site(Actor(world.project_admin), fields(site_fields, launcher))
    queue(target, world.member, world.project)
    assert [s["computer"] for s in client.get("/api/launcher/config").json()["sites"]] == [target.pk]
    launchers.set_allowed_hosts(Actor(world.global_admin), launcher, ["login9.hpc.example.org"])
    config = client.get("/api/launcher/config").json()
    assert config["sites"] == []
    body = claim(client, target, status=409)
    assert body["code"] == "launcher_host_not_allowed" and "login9.hpc.example.org" in body["error"]
    assert Job.objects.get(target=target).status == "queued"
    error = refusal(checks.request_site_check, Actor(world.project_admin), target, mine=False)
    assert error.code == "launcher_host_not_allowed"
    root = bearer(world.token(world.global_admin, ALL_MEMBER_SCOPES))
    assert root.get(f"/api/launchers/{launcher.pk}").json()["sites_outside_allowed_hosts"] == [target.pk]
    assert bearer(world.member_token(world.project_admin)).get(
        f"/api/sites/{target.pk}").json()["launcher_may_log_in"] is False


def test_the_owner_sees_why_the_launcher_no_longer_logs_in(client, world, site_fields, hpc):
    launcher, _ = hpc
    target = services.create_site(Actor(world.project_admin), fields(site_fields, launcher))
    launchers.set_allowed_hosts(Actor(world.global_admin), launcher, [])
    client.force_login(world.project_admin)
    page = html(client.get(reverse("computer-detail", args=[target.pk]), **HTMX))
    assert "may not log in to any host yet" in page and "the launcher does not log in to this site" in page


# The Launchers page ------------------------------------------------------------------------------

def test_the_launchers_page_shows_and_edits_the_allowed_hosts(client, world, hpc):
    launcher, _ = hpc
    client.force_login(world.global_admin)
    page = html(client.get(reverse("launchers")))
    assert "Allowed hosts" in page and "<code>*.hpc.example.org</code>" in page
    url = reverse("launcher-allowed-hosts", args=[launcher.pk])
    dialog = html(client.get(url, **HTMX))
    assert 'name="allowed_hosts"' in dialog and "*.hpc.example.org" in dialog
    bad = html(client.post(url, {"allowed_hosts": "me@login.example.org"}, **HTMX))
    assert "is not a host name pattern" in bad
    done = client.post(url, {"allowed_hosts": "*.hpc.example.org\nLOGIN[1-4].example.org"}, **HTMX)
    assert done.status_code == 204 and "launchersChanged" in done["HX-Trigger"]
    assert Launcher.objects.get(pk=launcher.pk).allowed_hosts == ["*.hpc.example.org", "login[1-4].example.org"]
    client.post(url, {"allowed_hosts": ""}, **HTMX)
    assert "Nowhere yet" in html(client.get(reverse("launchers")))
    created = client.post(reverse("launcher-create"), {"name": "hpc-b", "project": "lab",
                                                       "allowed_hosts": "*.b.example.org"}, **HTMX)
    assert created.status_code == 200 and Launcher.objects.get(name="hpc-b").allowed_hosts == ["*.b.example.org"]
    client.force_login(world.project_admin)
    assert client.get(url, **HTMX).status_code == 403
    assert client.post(url, {"allowed_hosts": "*"}, **HTMX).status_code == 403


# What a failed check says -------------------------------------------------------------------------

NETWORK_DETAILS = [
    f"The connection to {LOGIN_HOST}:22 was refused: check the host and port.",
    f"The SSH handshake with the login node {LOGIN_HOST}:22 failed: check that it is an SSH server that accepts "
    "the launcher's connection.",
    f"The host key of {LOGIN_HOST} is SHA256:Zm9vYmFyYmF6cXV4 (ssh-ed25519), and the computer's known_hosts has "
    f"no key for {LOGIN_HOST}.",
    f"No answer from {LOGIN_HOST}:22 within 20 s: check the host, the port and any firewall.",
]


def _answered(world, target, launcher, error):
    check = checks.request_site_check(Actor(world.project_admin), target, mine=False)
    checks.complete(launcher, check.pk, {"ok": False, "error": error})
    return SiteCheck.objects.get(pk=check.pk)


@pytest.mark.parametrize("detail", NETWORK_DETAILS)
def test_a_check_failure_tells_the_owner_only_what_to_fix(client, world, site_fields, hpc, detail):
    launcher, _ = hpc
    target = services.create_site(Actor(world.project_admin), fields(site_fields, launcher))
    check = _answered(world, target, launcher, detail)
    generic = f"Could not log in to {LOGIN_HOST}:22 as mmtshared: check the host, port and account"
    assert check.result["items"][0]["detail"].startswith(generic)
    owner_api = bearer(world.member_token(world.project_admin)).get(f"/api/sites/{target.pk}").json()
    assert owner_api["checks"]["shared"]["result"]["items"][0]["detail"].startswith(generic)
    assert detail not in str(owner_api) and "SHA256:Zm9v" not in str(owner_api)
    # The computers API reads the same stored check (through the site kind's registration).
    computers_api = bearer(world.member_token(world.project_admin)).get(f"/api/computers/{target.pk}/checks/{check.pk}")
    assert computers_api.status_code == 200 and computers_api.json()["id"] == check.pk
    assert computers_api.json()["result"]["items"][0]["detail"].startswith(generic)
    assert detail not in computers_api.content.decode()
    client.force_login(world.project_admin)
    page = html(client.get(reverse("computer-detail", args=[target.pk]), **HTMX))
    assert generic in page and detail not in page
    # The audit keeps the launcher's own words; global administrators read them on the API and the page.
    row = AuditEvent.objects.get(action="site.check.finish", after__check=check.pk)
    assert row.after["detail"] == detail
    root_api = bearer(world.token(world.global_admin, ALL_MEMBER_SCOPES)).get(f"/api/sites/{target.pk}").json()
    assert root_api["checks"]["shared"]["result"]["items"][0]["detail"] == detail
    client.force_login(world.global_admin)
    assert detail in html(client.get(reverse("computer-detail", args=[target.pk]), **HTMX))


@pytest.mark.parametrize("detail", [
    "the login node mmtshared@login.hpc.example.org refused the launcher's key: add the public key shown in the "
    "computer's details to ~mmtshared/.ssh/authorized_keys there (or register it by the site's method).",
    "Logged in, but `true` exited with code 1: /home/mmtshared/.bashrc: line 3: oops",
    "The launcher has no key for this login yet: it makes one on its next poll; register the public key, then "
    "try again.",
])
def test_what_the_owner_can_fix_is_passed_on_as_the_launcher_said_it(world, site_fields, hpc, detail):
    launcher, _ = hpc
    target = services.create_site(Actor(world.project_admin), fields(site_fields, launcher))
    check = _answered(world, target, launcher, detail)
    assert check.result["items"][0]["detail"] == detail


def test_a_check_stored_before_the_rule_is_reduced_when_read(world, site_fields, hpc):
    launcher, _ = hpc
    target = services.create_site(Actor(world.project_admin), fields(site_fields, launcher))
    check = _answered(world, target, launcher, "x")
    old = NETWORK_DETAILS[2]
    check.result = {**check.result, "items": [{**check.result["items"][0], "detail": old}]}
    check.save(update_fields=["result"])
    shown = checks.latest_checks(world.project_admin, target)["shared"]["result"]["items"][0]["detail"]
    assert old not in shown and shown.startswith("Could not log in to")


# Existing installs ----------------------------------------------------------------------------------

def test_the_migration_allows_existing_launchers_exactly_the_hosts_their_sites_name(world, site_fields, hpc,
                                                                                    host_keys):
    import importlib

    from django.apps import apps

    launcher, _ = hpc
    known = f"{host_keys.login_line}\n{host_keys.jump_line}\n"
    services.create_site(Actor(world.project_admin), fields(site_fields, launcher, jump_hosts=[
        f"me@{JUMP_HOST}:2222"], known_hosts=known))
    idle, _ = launchers.register_launcher(Actor(world.global_admin), "idle", world.project)
    Launcher.objects.update(allowed_hosts=[])  # as before the migration
    migration = importlib.import_module("sites.migrations.0005_launcher_allowed_hosts")
    migration.hosts_of_existing_sites(apps, None)
    assert Launcher.objects.get(pk=launcher.pk).allowed_hosts == [LOGIN_HOST, JUMP_HOST]
    assert Launcher.objects.get(pk=idle.pk).allowed_hosts == []
