"""Launcher keys and site connection checks: only ssh-ed25519 public keys, fingerprinted as `ssh-keygen
-l` prints them, one per launcher and (site, person), audited; checks asked by the owner (shared
account) or by each person of an own-account site, handed to the launcher in its config, answered,
and expired when nobody answers."""
from __future__ import annotations

import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from mado.errors import ServiceError
from mado.models import AuditEvent
from mado.services import Actor, issue_personal_token
from sites import checks, keys, launchers, services
from sites.models import LauncherKey, SiteCheck
from tests.conftest import assert_error, bearer
from tests.sites.site_jobs import launcher, lclient, no_expiry_throttle, registered, site_of  # noqa: F401

pytestmark = pytest.mark.django_db


def _keypair(directory: Path, name: str, kind: str = "ed25519") -> tuple[str, str, str]:
    """(public key line, ssh-keygen -l fingerprint, private key text)."""
    path = directory / name
    bits = ["-b", "2048"] if kind == "rsa" else []
    subprocess.run(["ssh-keygen", "-q", "-t", kind, *bits, "-N", "", "-C", "launcher@host", "-f", str(path)],
                   check=True)
    listing = subprocess.run(["ssh-keygen", "-l", "-f", f"{path}.pub"], capture_output=True, text=True,
                             check=True).stdout.split()
    return Path(f"{path}.pub").read_text().strip(), listing[1], path.read_text()


@pytest.fixture
def site(world, host_keys, launcher):
    return site_of(world.project_admin, host_keys, launcher)


@pytest.fixture
def personal(world, host_keys, launcher):
    target = site_of(world.project_admin, host_keys, launcher, name="hpc-personal", account="personal", ssh_user="")
    services.save_my_settings(Actor(world.member), target, {"account_name": "bob01"})
    return target


def _publish(client, **body):
    return client.post("/api/launcher/keys", body, format="json")


# Keys ---------------------------------------------------------------------------------------------

def test_a_published_key_is_fingerprinted_like_ssh_keygen_and_replaced_by_the_next(world, site, lclient, tmp_path):
    line, fingerprint, _ = _keypair(tmp_path, "one")
    response = _publish(lclient, computer=site.pk, user=None, public_key=line)
    assert response.status_code == 200, response.content
    assert response.json()["fingerprint"] == fingerprint
    assert lclient.get("/api/launcher/config").json()["sites"][0]["keys"] == [{"user": None,
                                                                               "fingerprint": fingerprint, "recreate": False}]
    assert _publish(lclient, computer=site.pk, user=None, public_key=line).status_code == 200, "the same again"
    line2, fingerprint2, _ = _keypair(tmp_path, "two")
    assert _publish(lclient, computer=site.pk, user=None, public_key=line2).json()["fingerprint"] == fingerprint2
    stored = LauncherKey.objects.get(target=site)
    assert stored.fingerprint == fingerprint2 and stored.public_key == line2
    events = AuditEvent.objects.filter(action="site.key.publish").order_by("id")
    assert [e.after["fingerprint"] for e in events] == [fingerprint, fingerprint2]
    assert events[1].before == {"fingerprint": fingerprint}
    # The owner sees the shared key in the details; a user of the site does not.
    assert [k["fingerprint"] for k in keys.keys_for_details(world.project_admin, site)] == [fingerprint2]
    assert keys.keys_for_details(world.member, site) == []


def test_only_ed25519_public_keys_are_accepted(world, site, lclient, tmp_path):
    rsa, _, _ = _keypair(tmp_path, "rsa", "rsa")
    line, _, private = _keypair(tmp_path, "ed")
    blob = line.split()[1]
    for bad in (rsa, private, "ssh-ed25519", f"ssh-ed25519 {blob[:-4]}", f"ssh-ed25519 {blob}AAAA", f"ssh-rsa {blob}",
                f"ssh-ed25519 {blob}!", 42, ""):
        assert_error(_publish(lclient, computer=site.pk, user=None, public_key=bad), 422, "invalid_public_key")
    assert not LauncherKey.objects.exists()


def test_keys_go_to_the_accounts_of_the_sites_this_launcher_serves(world, site, personal, lclient, tmp_path):
    line, fingerprint, _ = _keypair(tmp_path, "bob")
    assert_error(_publish(lclient, computer=site.pk, user=world.member.pk, public_key=line), 422, "invalid")
    assert_error(_publish(lclient, computer=personal.pk, user=None, public_key=line), 422, "invalid")
    assert_error(_publish(lclient, computer=personal.pk, user=world.project_admin.pk, public_key=line), 422,
                 "invalid")
    assert _publish(lclient, computer=personal.pk, user=world.member.pk, public_key=line).status_code == 200
    assert [k["fingerprint"] for k in keys.keys_for_details(world.member, personal)] == [fingerprint]
    _, other_token = launchers.register_launcher(Actor(world.global_admin), "hpc-b", world.project)
    assert_error(_publish(bearer(other_token), computer=site.pk, user=None, public_key=line), 404, "not_found")


# Checks -------------------------------------------------------------------------------------------

def test_the_shared_account_check_goes_to_the_launcher_and_its_answer_comes_back(world, site, lclient):
    with pytest.raises(ServiceError) as refused:
        checks.request_site_check(Actor(world.member), site, mine=False)
    assert refused.value.code == "not_owner"
    check = checks.request_site_check(Actor(world.project_admin), site, mine=False)
    with pytest.raises(ServiceError) as twice:
        checks.request_site_check(Actor(world.global_admin), site, mine=False)
    assert twice.value.code == "target_check_in_progress"
    config = lclient.get("/api/launcher/config?wait=5").json()
    assert config["checks"] == [{"id": check.pk, "computer": site.pk, "user": None, "account_name": "mmtshared"}]
    assert SiteCheck.objects.get(pk=check.pk).status == "claimed"
    url = f"/api/launcher/checks/{check.pk}/complete"
    answer = {"ok": False, "error": "Permission denied (publickey).", "duration_ms": 840}
    assert lclient.post(url, answer, format="json").json() == {"id": check.pk, "status": "failed"}
    assert lclient.post(url, answer, format="json").status_code == 200, "resent"
    assert_error(lclient.post(url, {"ok": True}, format="json"), 409, "check_already_completed")
    stored = SiteCheck.objects.get(pk=check.pk)
    # The owner reads what to fix; the launcher's own words go to the audit and global administrators.
    assert stored.result["items"][0]["detail"].startswith("Could not log in to login.hpc.example.org:22 as mmtshared")
    assert stored.failure_reason
    owners = checks.latest_checks(world.project_admin, site)["shared"]
    assert owners["status"] == "failed" and "Permission denied" not in str(owners)
    roots = checks.latest_checks(world.global_admin, site)["shared"]
    assert roots["result"]["items"][0]["detail"] == "Permission denied (publickey)."
    assert lclient.get("/api/launcher/config").json()["checks"] == []


def test_own_account_checks_need_my_settings_and_are_one_per_person(world, personal, lclient):
    with pytest.raises(ServiceError) as unsaved:
        checks.request_site_check(Actor(world.project_admin), personal, mine=True)
    assert unsaved.value.code == "site_account_required"
    with pytest.raises(ServiceError) as shared:
        checks.request_site_check(Actor(world.project_admin), personal, mine=False)
    assert shared.value.code == "site_check_not_applicable"
    check = checks.request_site_check(Actor(world.member), personal, mine=True)
    services.save_my_settings(Actor(world.project_admin), personal, {"account_name": "alice01"})
    checks.request_site_check(Actor(world.project_admin), personal, mine=True)  # alongside bob's
    items = lclient.get("/api/launcher/config").json()["checks"]
    assert {(c["user"], c["account_name"]) for c in items} == {(world.member.pk, "bob01"),
                                                               (world.project_admin.pk, "alice01")}
    done = lclient.post(f"/api/launcher/checks/{check.pk}/complete", {"ok": True, "duration_ms": 120},
                        format="json")
    assert done.json()["status"] == "succeeded"
    assert checks.latest_checks(world.member, personal)["mine"]["status"] == "succeeded"


def test_an_unanswered_check_expires(world, site, lclient):
    check = checks.request_site_check(Actor(world.project_admin), site, mine=False)
    SiteCheck.objects.filter(pk=check.pk).update(created_at=timezone.now() - timedelta(seconds=79))
    checks.expire_checks(force=True)
    assert SiteCheck.objects.get(pk=check.pk).status == "queued"
    SiteCheck.objects.filter(pk=check.pk).update(created_at=timezone.now() - timedelta(seconds=81))
    checks.expire_checks(force=True)
    stored = SiteCheck.objects.get(pk=check.pk)
    assert (stored.status, stored.failure_reason) == ("expired", "not_claimed")
    assert_error(lclient.post(f"/api/launcher/checks/{check.pk}/complete", {"ok": True}, format="json"), 409,
                 "check_expired")
    # A new one may be asked once the old one ended.
    assert checks.request_site_check(Actor(world.project_admin), site, mine=False).status == "queued"


def test_manual_sites_have_no_launcher_check(world, host_keys, launcher):
    pc = site_of(world.project_admin, host_keys, launcher, name="pc", submission="manual")
    with pytest.raises(ServiceError) as refused:
        checks.request_site_check(Actor(world.project_admin), pc, mine=False)
    assert refused.value.code == "site_check_not_applicable"


def test_people_ask_for_checks_through_the_api_and_read_keys_and_checks_in_the_site_details(world, personal, lclient,
                                                                                           tmp_path):
    _, plaintext = issue_personal_token(Actor(world.member), world.project, scopes=["read", "jobs:write"])
    member = bearer(plaintext)
    assert_error(member.post(f"/api/sites/{personal.pk}/checks", {"mine": "yes"}, format="json"), 422, "invalid")
    assert_error(member.post(f"/api/sites/{personal.pk}/checks", {"mine": False}, format="json"), 403, "not_owner")
    created = member.post(f"/api/sites/{personal.pk}/checks", {"mine": True}, format="json")
    assert created.status_code == 201, created.content
    check = created.json()
    assert (check["status"], check["account_name"], check["user"]) == ("queued", "bob01", world.member.pk)

    line, fingerprint, _ = _keypair(tmp_path, "bob")
    assert _publish(lclient, computer=personal.pk, user=world.member.pk, public_key=line).status_code == 200
    lclient.post(f"/api/launcher/checks/{check['id']}/complete", {"ok": True}, format="json")

    details = member.get(f"/api/sites/{personal.pk}").json()
    assert [(k["username"], k["fingerprint"]) for k in details["keys"]] == [("bob", fingerprint)]
    assert details["checks"]["mine"]["status"] == "succeeded" and details["checks"]["shared"] is None
    assert member.get(f"/api/sites/{personal.pk}/checks/{check['id']}").json()["status"] == "succeeded"


def test_people_recreate_their_own_key_and_owners_the_shared_one_through_api_and_page(world, site, personal, lclient,
                                                                                     tmp_path, client):
    line, _, _ = _keypair(tmp_path, "shared")
    _publish(lclient, computer=site.pk, user=None, public_key=line)
    bob_line, _, _ = _keypair(tmp_path, "bob")
    _publish(lclient, computer=personal.pk, user=world.member.pk, public_key=bob_line)
    _, plaintext = issue_personal_token(Actor(world.member), world.project, scopes=["read", "jobs:write"])
    bob = bearer(plaintext)

    assert_error(bob.post(f"/api/sites/{personal.pk}/keys/recreate", {"mine": False}, format="json"), 422,
                 "site_key_not_applicable")
    answer = bob.post(f"/api/sites/{personal.pk}/keys/recreate", {"mine": True}, format="json")
    assert answer.status_code == 202, answer.content
    assert [k["recreate_requested"] for k in answer.json()["keys"]] == [True]
    config = lclient.get("/api/launcher/config").json()
    flagged = {(s["computer"], k["user"]) for s in config["sites"] for k in s["keys"] if k["recreate"]}
    assert flagged == {(personal.pk, world.member.pk)}

    # The page: the owner asks for a new shared key; the details say it is on its way.
    client.force_login(site.owner)
    response = client.post(f"/settings/computers/{site.pk}/keys/recreate", {"mine": "0"})
    assert response.status_code == 302
    assert LauncherKey.objects.get(target=site, user=None).recreate_requested_at is not None
    page = client.get(f"/settings/computers/{site.pk}/").content.decode()
    assert "A new key was asked for" in page

    # The launcher publishes a new key: the request is done.
    new_line, new_print, _ = _keypair(tmp_path, "shared2")
    _publish(lclient, computer=site.pk, user=None, public_key=new_line)
    key = LauncherKey.objects.get(target=site, user=None)
    assert key.recreate_requested_at is None and key.fingerprint == new_print
