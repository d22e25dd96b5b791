"""The site pages (seed 003) through Django's test client on PostgreSQL: Add computer with Type Site
(researchers get only the site form), the site's details below the list (job shell versions, keys,
My settings, the trust warning), and the manual-submission instructions on the Jobs pages."""
from __future__ import annotations

import html as htmllib
import json
import re

import pytest
from django.core.exceptions import PermissionDenied
from django.urls import reverse

from computers.models import ComputeTarget
from jobs.models import Job
from mado.services import Actor
from sites import services
from sites.models import JobShell, LauncherKey, SiteUserSettings
from tests.sites import conftest as site_fixtures
from tests.sites.conftest import LOGIN_HOST

# The sites tests' fixtures (tests/sites/conftest.py): a launcher, host keys, a valid site's fields.
host_keys, launcher, site_fields, make_site = (site_fixtures.host_keys, site_fixtures.launcher,
                                               site_fixtures.site_fields, site_fixtures.make_site)

HTMX = {"HTTP_HX_REQUEST": "true"}

pytestmark = pytest.mark.django_db


def html(response) -> str:
    return htmllib.unescape(response.content.decode()).replace("\xa0", " ")


def signed_in(client, user):
    client.force_login(user)
    return client


def form_fields(**overrides) -> dict:
    """What the browser posts for a manual site from Add computer."""
    data = {"kind": "site", "action": "save", "name": "my-pc", "visibility": "private", "submission": "manual",
            "working_dir": "/home/bob/mmt", "runner_python": "/usr/bin/python3",
            "runner_api_url": "https://tracking.example.org", "variables": "", "template": "docker_host",
            "queue_timeout": "7d", "max_active_submissions": "10"}
    data.update(overrides)
    return data


def field_errors(page: str, name: str) -> str:
    """The errors shown under one field of the site form."""
    until = r'(?=<div class="field|<div class="row|<div class="radios|<footer)'
    match = re.search(rf'data-field="{name}".*?{until}', page, re.S) or re.search(rf'name="{name}".*?{until}',
                                                                                 page, re.S)
    assert match, f"no field {name}"
    errors = re.search(r'<div class="errors" role="alert">(.*?)</div>', match.group(0), re.S)
    return errors.group(1) if errors else ""


# Add computer ------------------------------------------------------------------------------------

def test_a_researcher_gets_only_the_site_form(client, world):
    page = html(signed_in(client, world.member).get(reverse("computer-add"), **HTMX))
    assert 'name="kind" value="site"' in page and 'type="hidden"' in page
    assert 'id="id_kind"' not in page  # no Type choice
    assert "ssh_key_path" not in page and "Worker for this connection" not in page
    assert 'name="submission"' in page and 'name="known_hosts"' in page
    # Private is the default visibility.
    assert re.search(r'<option value="private" selected>', page)


def test_a_global_admin_chooses_site_in_type(client, world):
    client = signed_in(client, world.global_admin)
    page = html(client.get(reverse("computer-add"), **HTMX))
    assert '<option value="site"' in page and "ssh_key_path" in page
    page = html(client.post(reverse("computer-add"), {"kind": "site", "action": "refresh", "name": "hpc"}, **HTMX))
    assert 'name="submission"' in page and "ssh_key_path" not in page
    assert 'value="hpc"' in page  # what was typed stays
    back = html(client.post(reverse("computer-add"), {"kind": "ssh", "action": "refresh", "name": "hpc"}, **HTMX))
    assert "ssh_key_path" in back and 'value="hpc"' in back


def test_service_accounts_cannot_add_computers(client, world, rf):
    """A service account's session is not accepted by the pages at all (sign-in page); the view itself
    refuses one too, whatever lets it through."""
    from computers.views import computer_add

    client = signed_in(client, world.alices_account.user)
    assert client.get(reverse("computer-add"), **HTMX).status_code in (302, 403)
    assert client.post(reverse("computer-add"), form_fields(), **HTMX).status_code in (302, 403)
    assert not ComputeTarget.objects.filter(name="my-pc").exists()
    request = rf.get(reverse("computer-add"))
    request.user, request.htmx = world.alices_account.user, False
    with pytest.raises(PermissionDenied):
        computer_add(request)


def test_manual_hides_the_launcher_fields_and_automatic_shows_them(client, world, launcher):
    client = signed_in(client, world.member)
    manual = html(client.post(reverse("computer-add"), {**form_fields(), "action": "refresh"}, **HTMX))
    for name in ("launcher", "host", "known_hosts", "jump_hosts", "account", "ssh_user"):
        assert f'name="{name}"' not in manual, name
    automatic = html(client.post(reverse("computer-add"), {**form_fields(submission="automatic"),
                                                           "action": "refresh"}, **HTMX))
    for name in ("launcher", "host", "port", "known_hosts", "jump_hosts", "account", "ssh_user"):
        assert f'name="{name}"' in automatic, name
    personal = html(client.post(reverse("computer-add"), {**form_fields(submission="automatic", account="personal"),
                                                          "action": "refresh"}, **HTMX))
    assert 'name="ssh_user"' not in personal and "My settings" in personal


def test_a_researcher_saves_a_manual_site_and_its_details_open_below_the_list(client, world):
    client = signed_in(client, world.member)
    response = client.post(reverse("computer-add"), form_fields(), **HTMX)
    target = ComputeTarget.objects.get(name="my-pc")
    assert (target.owner, target.kind, target.visibility) == (world.member, "site", "private")
    assert response.headers["HX-Retarget"] == "#computer-details"
    assert json.loads(response.headers["HX-Trigger"]) == {"computersChanged": True}
    assert json.loads(response.headers["HX-Trigger-After-Swap"]) == {"closeDialog": True}
    page = html(response)
    assert f'data-computer-id="{target.pk}"' in page
    assert f"mado-tracking submit --site {target.pk} --dry-run" in page
    assert "export MMT_API_URL=http://testserver " in page
    assert "Before using someone else's computer" not in page  # bob owns it
    assert target.job_shells.get().version == 1


def test_errors_are_shown_under_their_fields(client, world, launcher):
    client = signed_in(client, world.member)
    response = client.post(reverse("computer-add"), form_fields(
        submission="automatic", account="shared", launcher=str(launcher.pk), host="", port="22", known_hosts="",
        ssh_user="", runner_api_url="ftp://x"), **HTMX)
    assert response.status_code == 200 and "HX-Retarget" not in response.headers
    page = html(response)
    assert "Enter the login node the launcher connects to." in field_errors(page, "host")
    assert "Paste the login node's host keys" in field_errors(page, "known_hosts")
    assert "shared account" in field_errors(page, "ssh_user")
    assert "Enter this server's URL" in field_errors(page, "runner_api_url")
    page = html(client.post(reverse("computer-add"), form_fields(queue_timeout="soon"), **HTMX))
    assert "Write the queue timeout as 7d, 12h, 90m" in field_errors(page, "queue_timeout")
    assert not ComputeTarget.objects.filter(name="my-pc").exists()


def test_the_fingerprints_of_pasted_known_hosts_are_shown(client, world, host_keys):
    client = signed_in(client, world.member)
    page = html(client.post(reverse("site-known-hosts-fingerprints"),
                            {"known_hosts": host_keys.login_line + "\n" + host_keys.rsa_line}, **HTMX))
    assert host_keys.login_fingerprint in page and host_keys.rsa_fingerprint in page
    bad = html(client.post(reverse("site-known-hosts-fingerprints"), {"known_hosts": "host ssh-ed25519 !!"}, **HTMX))
    assert "Line 1: the key is not valid base64." in bad


def test_a_revoked_launcher_is_not_offered(client, world, launcher):
    from django.utils import timezone

    launcher.revoked_at = timezone.now()
    launcher.save()
    page = html(signed_in(client, world.member).post(
        reverse("computer-add"), {**form_fields(submission="automatic"), "action": "refresh"}, **HTMX))
    assert f'value="{launcher.pk}"' not in page and "No launcher is registered yet" in page


# Site details -------------------------------------------------------------------------------------

@pytest.fixture
def public_personal(world, make_site):
    """alice's Public site where Jobs run under each person's own account."""
    return make_site(world.project_admin, name="public-hpc", visibility="public", account="personal", ssh_user="")


def test_job_shell_versions_through_the_page(client, world, make_site):
    target = make_site(world.project_admin)
    client = signed_in(client, world.project_admin)
    url = reverse("site-job-shell", args=[target.pk])
    current = JobShell.objects.get(target=target).content
    changed = current.replace("#!/bin/bash", "#!/bin/bash\n# queue gpu-long", 1)
    page = html(client.post(url, {"content": changed}, **HTMX))
    assert "Saved as version 2." in page
    page = html(client.post(url, {"content": changed}, **HTMX))
    assert "The content is the same as version 2; no new version was made." in page
    assert list(target.job_shells.values_list("version", flat=True).order_by("version")) == [1, 2]
    rows = re.findall(r'<tr data-version="(\d+)"><td>\d+.*?</td>\s*<td>(\w+)</td>.*?<code class="sha256">(\w+)</code>',
                      page, re.S)
    shells = {s.version: s for s in target.job_shells.all()}
    assert rows == [("2", "alice", shells[2].sha256), ("1", "alice", shells[1].sha256)]
    old = html(client.get(reverse("site-job-shell-version", args=[target.pk, 1]), **HTMX))
    assert "# queue gpu-long" not in old and htmllib.unescape(current.split("\n")[1]) in old
    bad = html(client.post(url, {"content": "echo hi\n"}, **HTMX))
    assert "mmt_submit" in bad and target.job_shells.count() == 2


def test_non_owners_cannot_save_the_job_shell(client, world, make_site):
    target = make_site(world.project_admin, visibility="public")
    client = signed_in(client, world.viewer)
    details = html(client.get(reverse("computer-detail", args=[target.pk]), **HTMX))
    assert 'name="content"' not in details and 'class="job-shell-content"' in details
    assert "Edit site" not in details and LOGIN_HOST not in details  # no connection details either
    response = client.post(reverse("site-job-shell", args=[target.pk]), {"content": "#!/bin/bash\n"}, **HTMX)
    assert response.status_code == 403 and target.job_shells.count() == 1
    assert client.get(reverse("site-edit", args=[target.pk]), **HTMX).status_code == 403


def test_a_private_site_of_someone_else_is_not_found(client, world, make_site):
    target = make_site(world.project_admin)
    client = signed_in(client, world.member)
    assert client.get(reverse("computer-detail", args=[target.pk]), **HTMX).status_code == 404
    assert client.post(reverse("site-my-settings", args=[target.pk]), {"account_name": "bob"}).status_code == 404


def test_a_viewer_of_a_public_site_saves_my_settings_after_the_trust_warning(client, world, public_personal):
    client = signed_in(client, world.viewer)
    url = reverse("computer-detail", args=[public_personal.pk])
    page = html(client.get(url, **HTMX))
    assert "Before using someone else's computer" in page
    assert "Until you save, you cannot create Jobs on this computer." in page
    bad = html(client.post(reverse("site-my-settings", args=[public_personal.pk]),
                           {"account_name": "-carol", "variables": "GROUP=x y"}, **HTMX))
    assert "Enter your account name" in bad and "GROUP" not in str(SiteUserSettings.objects.all())
    page = html(client.post(reverse("site-my-settings", args=[public_personal.pk]),
                            {"account_name": "carol01", "working_dir": "", "variables": "GROUP=gr01"}, **HTMX))
    settings = SiteUserSettings.objects.get(target=public_personal, user=world.viewer)
    assert (settings.account_name, settings.variables) == ("carol01", {"GROUP": "gr01"})
    assert "Saved your settings." in page and 'value="carol01"' in page
    assert "The launcher has not created your key yet." in page


def test_the_trust_warning_is_hidden_from_the_owner(client, world, public_personal):
    page = html(signed_in(client, world.project_admin).get(reverse("computer-detail", args=[public_personal.pk]),
                                                           **HTMX))
    assert "My settings" in page and "Before using someone else's computer" not in page


def test_service_accounts_cannot_save_my_settings(client, world, public_personal):
    client = signed_in(client, world.service_account.user)
    response = client.post(reverse("site-my-settings", args=[public_personal.pk]), {"account_name": "bot"})
    assert response.status_code in (302, 403)  # the pages do not take a service account's session at all
    assert not SiteUserSettings.objects.filter(target=public_personal).exists()


def test_keys_the_launcher_published_are_shown_to_whom_they_concern(client, world, make_site, launcher,
                                                                      public_personal):
    shared = make_site(world.project_admin, name="shared-hpc", visibility="public")
    LauncherKey.objects.create(launcher=launcher, target=shared, public_key="ssh-ed25519 AAAASHARED launcher",
                               fingerprint="SHA256:shared")
    owner_page = html(signed_in(client, world.project_admin).get(reverse("computer-detail", args=[shared.pk]),
                                                                 **HTMX))
    assert "ssh-ed25519 AAAASHARED launcher" in owner_page
    assert "~/.ssh/authorized_keys of the shared account mmtshared" in owner_page
    services.save_my_settings(Actor(world.viewer), public_personal, {"account_name": "carol01"})
    LauncherKey.objects.create(launcher=launcher, target=public_personal, user=world.viewer,
                               public_key="ssh-ed25519 AAAACAROL launcher", fingerprint="SHA256:carol")
    client = signed_in(client, world.viewer)
    shared_page = html(client.get(reverse("computer-detail", args=[shared.pk]), **HTMX))
    assert "AAAASHARED" not in shared_page and "users have nothing to do" in shared_page
    mine = html(client.get(reverse("computer-detail", args=[public_personal.pk]), **HTMX))
    assert "ssh-ed25519 AAAACAROL launcher" in mine and "by the site's method" in mine


def test_the_owner_edits_the_site_settings(client, world, make_site):
    target = make_site(world.project_admin)
    client = signed_in(client, world.project_admin)
    form = html(client.get(reverse("site-edit", args=[target.pk]), **HTMX))
    assert 'value="mmtshared"' in form and 'name="template"' not in form
    data = {"action": "save", "name": "hpc-cluster", "visibility": "public", "submission": "automatic",
            "launcher": str(target.site_settings.launcher_id), "host": LOGIN_HOST, "port": "22",
            "jump_hosts": "", "known_hosts": target.site_settings.known_hosts, "account": "shared",
            "ssh_user": "mmtshared", "working_dir": "/work/mmt2", "runner_python": "/usr/bin/python3",
            "runner_api_url": "https://tracking.example.org", "variables": "PARTITION=gpu",
            "queue_timeout": "2d", "max_active_submissions": "4"}
    response = client.post(reverse("site-edit", args=[target.pk]), data, **HTMX)
    assert response.headers["HX-Retarget"] == "#computer-details"
    target.refresh_from_db()
    site = target.site_settings
    assert (target.visibility, site.working_dir, site.queue_timeout_seconds, site.max_active_submissions,
            site.variables) == ("public", "/work/mmt2", 2 * 86400, 4, {"PARTITION": "gpu"})


def test_disable_and_enable_a_site_from_the_list(client, world, make_site):
    target = make_site(world.project_admin)
    client = signed_in(client, world.project_admin)
    client.post(reverse("computer-enabled", args=[target.pk]), {"enabled": "0"}, **HTMX)
    target.refresh_from_db()
    assert target.enabled is False
    client.post(reverse("computer-enabled", args=[target.pk]), {"enabled": "1"}, **HTMX)
    target.refresh_from_db()
    assert target.enabled is True


# Manual submission on the Jobs pages ---------------------------------------------------------------

@pytest.fixture
def manual_site(world, make_site):
    return make_site(world.project_admin, name="alices-pc", submission="manual", visibility="public",
                     template="docker_host", launcher=None, host="", known_hosts="", ssh_user="")


def test_a_job_waiting_on_a_manual_site_shows_how_to_submit_it(client, world, manual_site):
    job = Job.objects.create(project=world.project, created_by=world.member, target=manual_site,
                             command=["python", "train.py"], status="waiting_manual")
    client = signed_in(client, world.member)
    page = html(client.get(reverse("job-detail", args=["lab", job.pk])))
    assert "Waiting for manual submission" in page
    assert f"mado-tracking submit --site {manual_site.pk} --watch --all" in page
    assert "export MMT_API_URL=http://testserver MMT_API_TOKEN=<your API token>" in page
    assert "When submitting for the first time" in page and re.search(
        r"pip install http://testserver/downloads/mado_tracking-[\d.]+-py3-none-any\.whl", page)
    assert "/projects/lab/settings/tokens/new?scopes=read&scopes=jobs%3Awrite" in page
    assert "Before using someone else's computer" in page  # alice owns the computer, bob runs the command
    listing = html(client.get(reverse("jobs", args=["lab"])))
    assert listing.count(f"mado-tracking submit --site {manual_site.pk} --dry-run") == 1
    assert f'href="#manual-submission-{manual_site.pk}"' in listing


def test_the_owner_sees_the_instructions_without_the_trust_warning(client, world, manual_site):
    job = Job.objects.create(project=world.project, created_by=world.project_admin, target=manual_site,
                             command=["python", "train.py"], status="waiting_manual")
    page = html(signed_in(client, world.project_admin).get(reverse("job-detail", args=["lab", job.pk])))
    assert f"mado-tracking submit --site {manual_site.pk}" in page
    assert "Before using someone else's computer" not in page


def test_someone_who_cannot_submit_the_job_reads_who_can_instead_of_the_commands(client, world, make_site):
    """Issue 15 item 6: another person's Job on a Private site: no commands, but who can submit it."""
    private = make_site(world.project_admin, name="alices-pc", submission="manual", template="docker_host",
                        launcher=None, host="", known_hosts="", ssh_user="")
    job = Job.objects.create(project=world.project, created_by=world.project_admin, target=private,
                             command=["python", "train.py"], status="waiting_manual")
    client = signed_in(client, world.member)
    page = html(client.get(reverse("job-detail", args=["lab", job.pk])))
    assert "Waiting for manual submission" in page
    assert "mado-tracking submit --site" not in page and "Issue a token for mado-tracking submit" not in page
    assert "Only alice, who requested it and owns alices-pc, can submit this Job" in page
    listing = html(client.get(reverse("jobs", args=["lab"])))
    assert "mado-tracking submit --site" not in listing
    assert "alices-pc is Private: only Jobs of its owner alice" in listing
    # alice herself gets the commands.
    owner = html(signed_in(client, world.project_admin).get(reverse("job-detail", args=["lab", job.pk])))
    assert f"mado-tracking submit --site {private.pk} --dry-run" in owner


def test_on_a_public_site_only_the_requester_and_the_owner_get_the_commands_for_a_job(client, world, manual_site):
    job = Job.objects.create(project=world.project, created_by=world.member, target=manual_site,
                             command=["python", "train.py"], status="waiting_manual")
    other = html(signed_in(client, world.viewer).get(reverse("job-detail", args=["lab", job.pk])))
    assert "mado-tracking submit --site" not in other
    assert "Only bob, who requested it, can submit this Job with their own API token, or alice" in other
    for person in (world.member, world.project_admin):  # the requester; the owner (with --all)
        page = html(signed_in(client, person).get(reverse("job-detail", args=["lab", job.pk])))
        assert f"mado-tracking submit --site {manual_site.pk} --watch --all" in page, person
    # Made Private, nobody can submit bob's Job: the page says so and what the owner can do.
    manual_site.visibility = "private"
    manual_site.save(update_fields=["visibility"])
    page = html(signed_in(client, world.member).get(reverse("job-detail", args=["lab", job.pk])))
    assert "mado-tracking submit --site" not in page
    assert "Nobody can submit this Job now: alices-pc no longer lets bob use it" in page


def test_a_submitted_job_shows_no_instructions(client, world, manual_site):
    job = Job.objects.create(project=world.project, created_by=world.member, target=manual_site,
                             command=["python", "train.py"], status="waiting_resources")
    page = html(signed_in(client, world.member).get(reverse("job-detail", args=["lab", job.pk])))
    assert "Waiting for resources" in page and "mado-tracking submit --site" not in page


def test_the_new_job_form_shows_the_instructions_for_a_manual_site(client, world, manual_site):
    client = signed_in(client, world.member)
    page = html(client.get(reverse("job-create", args=["lab"]), {"computer": manual_site.pk, "fragment": "computer"},
                           **HTMX))
    assert f"mado-tracking submit --site {manual_site.pk} --dry-run" in page


# Check connection ----------------------------------------------------------------------------------

def test_the_owner_checks_the_shared_account_and_sees_the_launchers_answer(client, world, make_site, launcher):
    from sites import checks

    target = make_site(world.project_admin, visibility="public")
    client = signed_in(client, world.project_admin)
    details = html(client.get(reverse("computer-detail", args=[target.pk]), **HTMX))
    assert 'id="site-check"' in details and "Not checked yet." in details
    page = html(client.post(reverse("site-check-request", args=[target.pk]), {"mine": "0"}, **HTMX))
    check = target.site_checks.get()
    assert (check.launcher, check.site_user, check.account_name) == (launcher, None, "mmtshared")
    assert "Waiting for the launcher to pick up the check" in page and 'hx-trigger="every 1s"' in page
    status_url = reverse("site-check-status", args=[target.pk, check.pk])
    assert client.get(status_url, **HTMX).status_code == 200  # still open: keeps polling
    checks.complete(launcher, check.pk, {"ok": False, "error": "Permission denied (publickey)."})
    done = client.get(status_url, **HTMX)
    assert done.status_code == 286  # ends htmx polling
    # The owner reads what to check; the launcher's own words are for global administrators.
    assert "Could not verify connection" in html(done) and "Permission denied (publickey)." not in html(done)
    assert f"Could not log in to {LOGIN_HOST}:22 as mmtshared" in html(done)
    # Someone who only uses the site has no button and cannot check the shared account.
    viewer = signed_in(client, world.viewer)
    assert 'id="site-check"' not in html(viewer.get(reverse("computer-detail", args=[target.pk]), **HTMX))
    refused = html(viewer.post(reverse("site-check-request", args=[target.pk]), {"mine": "0"}, **HTMX))
    assert "Only the computer's owner and global administrators check the shared account" in refused
    assert target.site_checks.count() == 1


def test_a_user_checks_their_own_account_after_my_settings(client, world, public_personal, launcher):
    from sites import checks

    client = signed_in(client, world.viewer)
    url = reverse("computer-detail", args=[public_personal.pk])
    assert 'id="site-check"' not in html(client.get(url, **HTMX))  # nothing to check before My settings
    client.post(reverse("site-my-settings", args=[public_personal.pk]), {"account_name": "carol01"}, **HTMX)
    assert 'name="mine" value="1"' in html(client.get(url, **HTMX))
    client.post(reverse("site-check-request", args=[public_personal.pk]), {"mine": "1"}, **HTMX)
    check = public_personal.site_checks.get()
    assert (check.site_user, check.account_name) == (world.viewer, "carol01")
    checks.complete(launcher, check.pk, {"ok": True})
    done = client.get(reverse("site-check-status", args=[public_personal.pk, check.pk]), **HTMX)
    assert done.status_code == 286 and "Connection verified" in html(done)
    # The owner does not see carol's check as theirs.
    owner = signed_in(client, world.project_admin)
    assert owner.get(reverse("site-check-status", args=[public_personal.pk, check.pk]), **HTMX).status_code == 404
