"""The Computers pages through Django's test client: the list under Global settings, details below it,
the two-step Add computer dialog driven by a scripted worker, Edit computer, connection checks from
the details, directory reads, and the project's Compute page — with the permission matrix of seed 002
("Permissions") and the rule that connection details never reach people who cannot manage a computer."""
from __future__ import annotations

import html as htmllib
import json
import re
from types import SimpleNamespace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from computers.models import ComputeTarget, ConnectionCheck, DirectoryRead
from mado.models import AuditEvent
from tests.computer_fixtures import ScriptedWorker, failed_result, good_result, make_computer
from tests.support import run_periodic
from workers.models import Worker

HTMX = {"HTTP_HX_REQUEST": "true"}
KEY = "/home/worker/.ssh/mmt_worker_ed25519"
KNOWN_HOSTS = "/home/worker/.ssh/mmt_known_hosts"

pytestmark = pytest.mark.django_db


def html(response) -> str:
    return htmllib.unescape(response.content.decode()).replace("\xa0", " ")


def triggers(response) -> dict:
    return json.loads(response.headers.get("HX-Trigger", "{}") or "{}")


def signed_in(client, user):
    client.force_login(user)
    return client


# Each computer has its own, recognisable connection details, so a leak of any of them shows.
def secret_fields(tag: str) -> dict:
    return {"host": f"{tag}-host.example.internal", "port": 2201, "ssh_user": f"{tag}user",
            "ssh_key_path": f"/home/worker/.ssh/{tag}_key", "known_hosts_path": f"/home/worker/.ssh/{tag}_known_hosts",
            "working_dir": f"/data/{tag}-jobs", "python_path": f"/opt/{tag}/bin/python3"}


def secrets_of(target: ComputeTarget) -> list[str]:
    return [target.host, target.ssh_user, target.ssh_key_path, target.known_hosts_path, target.working_dir,
            target.python_path]


@pytest.fixture
def machines(world):
    """alice (a researcher, project admin) owns a private computer made directly in the database; the
    global admin owns a public and a private one."""
    return SimpleNamespace(
        alices=make_computer(world.project_admin, "alice-box", **secret_fields("alice"), gpu_ids=["0", "1"],
                             concurrency=2),
        public=make_computer(world.global_admin, "shared-gpu", visibility="public", **secret_fields("shared")),
        roots=make_computer(world.global_admin, "root-only", **secret_fields("rootonly")),
    )


@pytest.fixture
def worker(world):
    scripted = ScriptedWorker(world.worker_token, "lab-worker-1")
    assert scripted.hello().status_code == 200
    return scripted


def step1_fields(worker_pk, **extra) -> dict:
    return {"name": "gpu-host-1", "kind": "ssh", "visibility": "public", "host": "gpu-host-1.example.internal",
            "port": "22", "ssh_user": "mmt", "ssh_key_path": KEY, "known_hosts_path": KNOWN_HOSTS,
            "worker": str(worker_pk), **extra}


def poll(client, target, check, flow="add", **form):
    """What the progress element sends every second: a GET, or in the editor a POST of the form."""
    url = f"{reverse('computer-check-status', args=[target.pk, check.pk])}?flow={flow}"
    return client.post(url, form, **HTMX) if flow == "edit" else client.get(url, **HTMX)


# The list --------------------------------------------------------------------------------------------

def test_every_signed_in_person_sees_every_computer_with_kind_owner_visibility_and_state(client, world, machines):
    for user in [world.global_admin, world.project_admin, world.member, world.viewer, world.outsider]:
        page = html(signed_in(client, user).get(reverse("computers")))
        for name in ["alice-box", "shared-gpu", "root-only"]:
            assert f'data-computer="{name}"' in page, (user, name)
        row = re.search(r'<tr data-computer="root-only">(.*?)</tr>', page, re.DOTALL).group(1)
        assert "SSH" in row and "root" in row and "Private" in row and "Disabled" in row
        assert "Computers" in page and "Global settings" in page  # the sidebar


def test_signed_out_visitors_are_sent_to_the_login_page(client, machines):
    for url in [reverse("computers"), reverse("computer-detail", args=[machines.public.pk]), reverse("computer-add")]:
        response = client.get(url)
        assert response.status_code == 302 and response.url.startswith(reverse("login"))


def test_a_service_account_cannot_sign_in_so_the_pages_stay_closed_to_it(client, world, machines):
    account_user = world.service_account.user
    assert client.login(username=account_user.username, password="anything") is False
    response = client.post(reverse("login"), {"username": account_user.username, "password": ""})
    assert response.status_code == 200 and "_auth_user_id" not in client.session
    assert client.get(reverse("computers")).status_code == 302


@pytest.mark.parametrize("who, manageable", [
    ("global_admin", {"alice-box", "shared-gpu", "root-only"}),
    ("project_admin", {"alice-box"}),
    ("member", set()),
    ("outsider", set()),
])
def test_edit_disable_and_open_connection_check_appear_only_on_rows_the_person_manages(client, world, machines, who,
                                                                                       manageable):
    page = html(signed_in(client, getattr(world, who)).get(reverse("computers")))
    for name in ["alice-box", "shared-gpu", "root-only"]:
        row = re.search(rf'<tr data-computer="{name}">(.*?)</tr>', page, re.DOTALL).group(1)
        for action in ["Edit computer", "Enable", "Open connection check"]:
            assert (action in row) == (name in manageable), (who, name, action)


def test_only_global_administrators_add_ssh_and_local_computers(client, world, machines):
    assert "Add computer" in html(signed_in(client, world.global_admin).get(reverse("computers")))
    assert signed_in(client, world.global_admin).get(reverse("computer-add"), **HTMX).status_code == 200
    for user in [world.project_admin, world.member, world.outsider]:
        assert "Add computer" in html(signed_in(client, user).get(reverse("computers")))  # sites: anyone (seed 003)
        dialog = html(signed_in(client, user).get(reverse("computer-add"), **HTMX))
        assert 'name="kind" value="site"' in dialog and "ssh_key_path" not in dialog
        refused = signed_in(client, user).post(reverse("computer-add"), step1_fields(1, action="continue"))
        assert refused.status_code == 403
    assert not ComputeTarget.objects.filter(name="gpu-host-1").exists()


def test_the_list_of_1000_computers_takes_the_same_number_of_queries_as_a_list_of_ten(client, world):
    owners = [world.global_admin, world.project_admin, world.member]
    ComputeTarget.objects.bulk_create(
        ComputeTarget(name=f"node-{i:04d}", kind="ssh", owner=owners[i % 3], visibility=["public", "private"][i % 2],
                      host=f"node-{i}.internal", ssh_user="mmt", ssh_key_path=KEY, known_hosts_path=KNOWN_HOSTS)
        for i in range(10))
    signed_in(client, world.project_admin)
    with CaptureQueriesContext(connection) as ten:
        assert client.get(reverse("computers")).status_code == 200
    ComputeTarget.objects.bulk_create(
        ComputeTarget(name=f"node-{i:04d}", kind="ssh", owner=owners[i % 3], visibility=["public", "private"][i % 2],
                      host=f"node-{i}.internal", ssh_user="mmt", ssh_key_path=KEY, known_hosts_path=KNOWN_HOSTS)
        for i in range(10, 1000))
    with CaptureQueriesContext(connection) as thousand:
        response = client.get(reverse("computers"))
    assert response.status_code == 200
    assert html(response).count("<tr data-computer=") == 50  # one page of the list
    assert len(thousand) == len(ten), [q["sql"] for q in thousand.captured_queries]


def test_the_list_of_1000_computers_stays_within_a_fixed_query_budget(client, world, django_assert_max_num_queries):
    ComputeTarget.objects.bulk_create(
        ComputeTarget(name=f"node-{i:04d}", kind="ssh", owner=world.global_admin, visibility="public",
                      host=f"node-{i}.internal", ssh_user="mmt", ssh_key_path=KEY, known_hosts_path=KNOWN_HOSTS)
        for i in range(1000))
    signed_in(client, world.member)
    with django_assert_max_num_queries(8):
        response = client.get(reverse("computers"))
    assert html(response).count("<tr data-computer=") == 50
    with django_assert_max_num_queries(8):
        assert client.get(reverse("computers") + "?fragment=list&page=20", **HTMX).status_code == 200


# Details and the 404-not-403 rule ---------------------------------------------------------------------

@pytest.mark.parametrize("who, expected", [
    ("global_admin", {"alice-box": 200, "shared-gpu": 200, "root-only": 200}),
    ("project_admin", {"alice-box": 200, "shared-gpu": 200, "root-only": 404}),
    ("member", {"alice-box": 404, "shared-gpu": 200, "root-only": 404}),
    ("outsider", {"alice-box": 404, "shared-gpu": 200, "root-only": 404}),
])
def test_details_open_for_computers_the_person_may_use_or_manage_and_are_404_otherwise(client, world, machines, who,
                                                                                      expected):
    signed_in(client, getattr(world, who))
    targets = {"alice-box": machines.alices, "shared-gpu": machines.public, "root-only": machines.roots}
    for name, status in expected.items():
        for extra in ({}, HTMX):
            response = client.get(reverse("computer-detail", args=[targets[name].pk]), **extra)
            assert response.status_code == status, (who, name, extra)
            if status == 404:
                assert name not in html(response)


@pytest.mark.parametrize("who, manages", [
    ("global_admin", {"alice-box", "shared-gpu", "root-only"}),
    ("project_admin", {"alice-box"}),
    ("member", set()),
    ("viewer", set()),
    ("outsider", set()),
])
def test_connection_details_appear_only_to_owners_and_global_administrators(client, world, machines, who, manages):
    signed_in(client, getattr(world, who))
    everything = html(client.get(reverse("computers")))
    for target in [machines.alices, machines.public, machines.roots]:
        for secret in secrets_of(target):
            assert secret not in everything, (who, "list", secret)
        response = client.get(reverse("computer-detail", args=[target.pk]))
        page = html(response)
        for other in [machines.alices, machines.public, machines.roots]:
            for secret in secrets_of(other):
                if other.name in manages and other == target:
                    assert secret in page, (who, target.name, secret)
                elif secret == other.ssh_user and other == target and other.visibility == "public":
                    # Who Jobs run as is shown to everyone who may use the computer (issue 14, finding 6).
                    assert secret in page, (who, target.name, secret)
                else:
                    assert secret not in page, (who, target.name, secret)
    compute = html(client.get(reverse("project-compute", args=["lab"]))) if who != "outsider" else ""
    for target in [machines.alices, machines.public, machines.roots]:
        for secret in secrets_of(target):
            assert secret not in compute


def test_managers_see_the_worker_settings_with_this_servers_url_and_the_computer_id(client, world, machines, settings):
    settings.PUBLIC_URL = "https://tracking.example.internal"
    pk = machines.public.pk
    page = html(signed_in(client, world.global_admin).get(reverse("computer-detail", args=[pk])))
    assert (f'mado-tracking-worker install --api-url https://tracking.example.internal --worker-id "$(hostname)" '
            f"--target-ids {pk} --token-file ~/worker-token") in page
    for line in ["export MMT_API_URL=https://tracking.example.internal",
                 'export MMT_API_TOKEN="$(cat ~/worker-token)"', 'export MMT_WORKER_ID="$(hostname)"',
                 f"export MMT_WORKER_TARGET_IDS={pk}", "mado-tracking-worker run"]:
        assert line in page
    assert f'<code id="computer-id">{pk}</code>' in page and 'data-copy="#computer-id"' in page


def test_people_who_only_use_a_computer_see_who_sets_up_its_worker_and_no_command(client, world, machines):
    page = html(signed_in(client, world.member).get(reverse("computer-detail", args=[machines.public.pk])))
    assert "The owner (root) or a global administrator sets up the worker for this computer." in page
    assert "mado-tracking-worker install" not in page and "MMT_API_URL" not in page
    assert f'<code id="computer-id">{machines.public.pk}</code>' in page
    assert "Connection check" not in page and "Suggested settings" not in page
    assert "Edit computer" not in page


def test_the_machine_row_shows_arch_cores_and_memory_of_the_last_succeeded_check(client, world, machines, worker):
    check = ConnectionCheck.objects.create(target=machines.public, requested_worker=Worker.objects.get(),
                                           status="succeeded", result=_clean(machines.public, good_result()))
    assert check.pk
    for user in [world.global_admin, world.member]:
        page = html(signed_in(client, user).get(reverse("computer-detail", args=[machines.public.pk])))
        assert "amd64 · 32 cores · 251.5 GiB memory" in page


def _clean(target, result):
    from computers.services import _clean_result

    return _clean_result(result, target)


# Add computer: step 1 → step 2 with a scripted worker --------------------------------------------------

def test_step_1_offers_the_only_online_worker_preselected_with_its_key_candidates(client, world, worker):
    page = html(signed_in(client, world.global_admin).get(reverse("computer-add"), **HTMX))
    pk = Worker.objects.get().pk
    assert f'<option value="{pk}" selected>lab-worker-1 (lab, worker-host)</option>' in page
    assert f'<option value="{KEY}"></option>' in page and f'<option value="{KNOWN_HOSTS}"></option>' in page
    assert 'list="ssh-key-options"' in page and 'list="known-hosts-options"' in page
    for label in ["Name", "Type", "Visibility", "Host", "Port", "SSH user", "SSH key path", "known_hosts path",
                  "Worker for this connection", "Refresh workers", "Check connection and continue",
                  "Continue without checking"]:
        assert label in page
    assert "Local (development only)" not in page
    assert re.search(r'<option value="private" selected>Private</option>', page)


def test_no_candidates_appear_before_a_worker_is_chosen(client, world, worker):
    second = ScriptedWorker(world.worker_token, "lab-worker-2")
    second.hello(ssh_key_candidates=["/srv/keys/other_key"], known_hosts_candidates=["/srv/keys/other_kh"])
    signed_in(client, world.global_admin)
    page = html(client.get(reverse("computer-add"), **HTMX))
    assert "lab-worker-1" in page and "lab-worker-2" in page
    assert '<option value="" selected>' in page  # two online: nothing chosen
    assert KEY not in page and "/srv/keys/other_key" not in page
    other = Worker.objects.get(worker_id="lab-worker-2")
    fragment = html(client.get(reverse("computer-worker-candidates") + f"?worker={other.pk}", **HTMX))
    assert "/srv/keys/other_key" in fragment and "/srv/keys/other_kh" in fragment and KEY not in fragment
    assert signed_in(client, world.project_admin).get(
        reverse("computer-worker-candidates") + f"?worker={other.pk}", **HTMX).status_code == 403


def test_local_appears_as_a_type_only_in_development_mode(client, world, settings):
    settings.DEV_MODE = True
    page = html(signed_in(client, world.global_admin).get(reverse("computer-add"), **HTMX))
    assert "Local (development only)" in page
    refreshed = html(client.post(reverse("computer-add"), {"kind": "local", "name": "here", "action": "refresh"},
                                 **HTMX))
    assert "A Local computer has no SSH fields" in refreshed and 'name="host"' not in refreshed


def test_without_an_online_worker_the_dialog_says_so_and_check_connection_is_disabled(client, world):
    page = html(signed_in(client, world.global_admin).get(reverse("computer-add"), **HTMX))
    assert "No online worker can check the connection." in page
    assert re.search(r'<button type="submit" name="action" value="check" class="primary" disabled>', page)
    response = client.post(reverse("computer-add"), step1_fields("", action="check"), **HTMX)
    assert "No online worker can check the connection." in html(response)
    assert not ComputeTarget.objects.filter(name="gpu-host-1").exists()


def test_refresh_workers_finds_a_worker_started_meanwhile_and_keeps_the_typed_values(client, world):
    signed_in(client, world.global_admin)
    assert "No online worker" in html(client.get(reverse("computer-add"), **HTMX))
    ScriptedWorker(world.worker_token, "late-worker").hello()
    page = html(client.post(reverse("computer-add"), step1_fields("", action="refresh"), **HTMX))
    assert "No online worker" not in page and "late-worker" in page
    assert 'value="gpu-host-1.example.internal"' in page and 'value="gpu-host-1"' in page
    assert 'class="errors"' not in page  # a refresh re-draws, it does not validate


def test_workers_that_do_not_report_key_candidates_are_not_offered(client, world):
    ScriptedWorker(world.worker_token, "old-worker", capabilities=["checks"]).hello()
    page = html(signed_in(client, world.global_admin).get(reverse("computer-add"), **HTMX))
    assert "old-worker" not in page and "No online worker can check the connection." in page


def test_step_1_errors_appear_under_their_fields_and_register_nothing(client, world, worker, machines):
    signed_in(client, world.global_admin)
    bad = step1_fields(Worker.objects.get().pk, name="shared-gpu", port="70000", ssh_key_path="relative/key",
                       action="check")
    page = html(client.post(reverse("computer-add"), bad, **HTMX))
    assert "A computer named shared-gpu already exists; choose another name." in page
    assert "Port must be between 1 and 65535." in page
    assert "Enter the absolute SSH key path on the worker machine." in page
    assert ComputeTarget.objects.count() == 3 and ConnectionCheck.objects.count() == 0


def test_check_connection_and_continue_registers_the_computer_disabled_and_walks_to_step_2(client, world, worker):
    signed_in(client, world.global_admin)
    worker_pk = Worker.objects.get().pk
    response = client.post(reverse("computer-add"), step1_fields(worker_pk, action="check"), **HTMX)
    assert response.status_code == 200
    assert triggers(response).get("computersChanged") is True
    target = ComputeTarget.objects.get(name="gpu-host-1")
    assert target.enabled is False and target.owner == world.global_admin and target.visibility == "public"
    check = target.checks.get()
    assert check.status == "queued" and check.requested_worker.worker_id == "lab-worker-1"
    page = html(response)
    assert "Waiting for the worker to start checking…" in page
    status_url = f"/settings/computers/{target.pk}/checks/{check.pk}?flow=add"
    assert f'hx-get="{status_url}" hx-trigger="every 1s" hx-target="this"' in page
    assert f'action="/settings/computers/{target.pk}/connection"' in page  # step 1 now edits the registered one
    assert AuditEvent.objects.filter(action="computer.create", object_id=str(target.pk)).exists()
    assert AuditEvent.objects.filter(action="computer.check.request", object_id=str(target.pk)).exists()

    waiting = poll(client, target, check)
    assert waiting.status_code == 200 and "Waiting for the worker to start checking…" in html(waiting)
    item = worker.claim_check()
    assert item["computer"]["host"] == "gpu-host-1.example.internal"
    checking = poll(client, target, check)
    assert checking.status_code == 200 and "The worker is checking the connection…" in html(checking)
    assert worker.complete_check(item, result=good_result()).status_code == 200

    done = poll(client, target, check)
    assert done.status_code == 286  # ends the polling
    assert done.headers["HX-Retarget"] == "#dialog-content" and done.headers["HX-Reswap"] == "innerHTML"
    step2 = html(done)
    assert "Settings after connecting" in step2 and "Connection verified" in step2
    assert "amd64 · 32 cores · 251.5 GiB memory" in step2 and "Check details" in step2
    assert 'name="python_path" id="id_python_path" value="/usr/bin/python3"' in step2
    assert '<option value="amd64" selected>amd64</option>' in step2
    assert re.search(r'value="python" id="id_runtimes_0" checked', step2)
    assert re.search(r'value="docker" id="id_runtimes_1" checked', step2)
    assert not re.search(r'value="apptainer" id="id_runtimes_2" checked', step2)
    assert re.search(r'name="gpu_detected" value="0" id="id_gpu_detected_0" checked', step2)
    assert re.search(r'name="gpu_detected" value="1" id="id_gpu_detected_1" checked', step2)
    assert re.search(r'<textarea name="gpu_ids"[^>]*>\s*0\n1</textarea>', step2)
    assert re.search(r'name="concurrency" value="2"[^>]*data-follow-gpus="1"', step2)
    assert 'name="working_dir" id="id_working_dir" value=""' in step2  # never filled in automatically
    assert '<option value="/data" label="writable · 4.5 TB free"></option>' in step2
    assert '<option value="/usr/bin/python3" label="Python 3.11.2"></option>' in step2
    assert re.search(r'<input type="checkbox" name="enabled"[^>]*checked', step2)

    # Type /data/: the worker lists it; hidden entries only once a "." is typed.
    reads_url = reverse("computer-path-assist", args=[target.pk]) + "?field=working_dir"
    form = {"check": str(check.pk), "worker": str(worker_pk), "working_dir": "/data/", "working_dir_reads": ""}
    asked = client.post(reads_url, form, **HTMX)
    assert asked.status_code == 200 and "The worker is listing directories…" in html(asked)
    read = DirectoryRead.objects.get()
    assert read.path == "/data/" and read.requested_worker.worker_id == "lab-worker-1"
    assert f'name="working_dir_reads" value="{read.pk}"' in html(asked)
    form["working_dir_reads"] = str(read.pk)
    still = client.post(reads_url + "&poll=1", form, **HTMX)
    assert still.status_code == 200 and "The worker is listing directories…" in html(still)
    read_item = worker.claim_read()
    assert read_item["path"] == "/data/" and read_item["connection"]["host"] == "gpu-host-1.example.internal"
    worker.complete_read(read_item, entries=[{"name": "mmt-jobs", "kind": "dir"}, {"name": ".cache", "kind": "dir"},
                                             {"name": "notes.txt", "kind": "file"}])
    listed = client.post(reads_url + "&poll=1", form, **HTMX)
    assert listed.status_code == 286
    options = html(listed)
    assert '<option value="/data/mmt-jobs/" label="directory">' in options
    assert "/data/.cache/" not in options and "notes.txt" not in options
    assert '<option value="/data" label="writable · 4.5 TB free">' in options  # the check's places stay
    hidden = html(client.post(reads_url, {**form, "working_dir": "/data/."}, **HTMX))
    assert "/data/.cache/" in hidden and DirectoryRead.objects.count() == 1  # no second read for /data/

    # Save: enabled, the trailing "/" of the picked directory dropped; the details open below the list.
    saved = client.post(reverse("computer-settings", args=[target.pk]), {
        "check": str(check.pk), "worker": str(worker_pk), "working_dir": "/data/mmt-jobs/",
        "python_path": "/usr/bin/python3", "cpu_arch": "amd64", "runtimes": ["python", "docker"],
        "gpu_detected": ["0", "1"], "gpu_ids": "0\n1", "concurrency": "2", "dataset_transfer": "relay",
        "dataset_cache_limit_gib": "100", "enabled": "on", "action": "save"}, **HTMX)
    assert saved.status_code == 200
    assert triggers(saved) == {"computersChanged": True}
    assert json.loads(saved.headers["HX-Trigger-After-Swap"]) == {"closeDialog": True}
    assert saved.headers["HX-Retarget"] == "#computer-details" and saved.headers["HX-Reswap"] == "outerHTML"
    assert saved.headers["HX-Push-Url"] == reverse("computer-detail", args=[target.pk])
    details = html(saved)
    assert details.startswith('<section id="computer-details"')
    assert f'<code id="computer-id">{target.pk}</code>' in details
    target.refresh_from_db()
    assert target.enabled and target.working_dir == "/data/mmt-jobs" and target.python_path == "/usr/bin/python3"
    assert target.gpu_ids == ["0", "1"] and target.concurrency == 2 and target.runtimes == ["python", "docker"]


def test_a_failed_check_keeps_step_1_open_with_the_reason_and_the_resolution(client, world, worker):
    signed_in(client, world.global_admin)
    worker_pk = Worker.objects.get().pk
    client.post(reverse("computer-add"), step1_fields(worker_pk, action="check"), **HTMX)
    target = ComputeTarget.objects.get(name="gpu-host-1")
    check = target.checks.get()
    item = worker.claim_check()
    worker.complete_check(item, status="failed", result=failed_result())
    done = poll(client, target, check)
    assert done.status_code == 286 and done.headers["HX-Retarget"] == "#dialog-content"
    page = html(done)
    assert "1. Connection" in page and 'aria-current="step">1. Connection' in page
    assert "Could not verify connection" in page
    assert "If SSH connection is Failed, follow the Resolution column" in page
    row = re.search(r'<tr data-item="connection" class="item-failed">(.*?)</tr>', page, re.DOTALL).group(1)
    assert "SSH connection" in row and "Failed" in row and "authentication failed" in row
    assert ("Check the host, port, and SSH user, that the public key is in the target's ~/.ssh/authorized_keys, "
            "and that known_hosts has the target's host key.") in row
    assert re.search(r'<tr data-item="python" class="item-not_checked">.*?Not checked', page, re.DOTALL)
    assert 'value="gpu-host-1.example.internal"' in page and f'<option value="{worker_pk}" selected>' in page

    # Fix the port and try again: the same computer, a second check.
    again = client.post(reverse("computer-connection", args=[target.pk]),
                        step1_fields(worker_pk, port="2222", action="check"), **HTMX)
    assert "Waiting for the worker to start checking…" in html(again)
    target.refresh_from_db()
    assert target.port == 2222 and target.checks.count() == 2 and ComputeTarget.objects.count() == 1
    worker.complete_check(worker.claim_check(), status="failed", result=failed_result())

    # Continue without checking: step 2 without candidates.
    step2 = client.post(reverse("computer-connection", args=[target.pk]), step1_fields(worker_pk, action="continue"),
                        **HTMX)
    page = html(step2)
    assert "2. Settings after connecting" in page and "Not checked: no candidates." in page
    assert 'name="check" value=""' in page and "<datalist id=\"working_dir-options\"></datalist>" in page
    assert "gpu_detected" not in page


def test_continue_without_checking_registers_the_computer_and_opens_step_2(client, world, worker):
    signed_in(client, world.global_admin)
    response = client.post(reverse("computer-add"), step1_fields(Worker.objects.get().pk, action="continue"), **HTMX)
    target = ComputeTarget.objects.get(name="gpu-host-1")
    assert not target.enabled and target.checks.count() == 0
    assert triggers(response).get("computersChanged") is True
    page = html(response)
    assert "Not checked: no candidates." in page and "Save" in page and "Back" in page
    # Saving with Enabled on but no working directory: the fields say what is missing.
    refused = client.post(reverse("computer-settings", args=[target.pk]), {
        "python_path": "", "working_dir": "", "cpu_arch": "amd64", "dataset_transfer": "relay",
        "dataset_cache_limit_gib": "100", "enabled": "on", "action": "save"}, **HTMX)
    assert refused.status_code == 200 and html(refused).count("Required to enable the computer.") == 2
    # With Enabled off the empty paths are fine; the computer stays disabled.
    kept = client.post(reverse("computer-settings", args=[target.pk]), {
        "cpu_arch": "arm64", "dataset_transfer": "direct", "dataset_cache_limit_gib": "50", "gpu_ids": "",
        "action": "save"}, **HTMX)
    assert json.loads(kept.headers["HX-Trigger-After-Swap"]) == {"closeDialog": True}
    target.refresh_from_db()
    assert not target.enabled and target.cpu_arch == "arm64" and target.dataset_transfer == "direct"
    assert target.dataset_cache_limit_gib == 50 and target.concurrency == 1


def test_back_returns_to_step_1_of_the_registered_computer_with_its_values(client, world, worker):
    signed_in(client, world.global_admin)
    worker_pk = Worker.objects.get().pk
    client.post(reverse("computer-add"), step1_fields(worker_pk, action="continue"), **HTMX)
    target = ComputeTarget.objects.get(name="gpu-host-1")
    page = html(client.get(reverse("computer-connection", args=[target.pk]) + f"?worker={worker_pk}", **HTMX))
    assert 'value="gpu-host-1"' in page and 'value="gpu-host-1.example.internal"' in page
    assert f'<option value="{worker_pk}" selected>' in page
    assert "gpu-host-1 is registered, disabled." in page


def test_a_check_nobody_claims_expires_and_step_1_says_the_worker_did_not_pick_it_up(client, world, worker):
    from datetime import timedelta

    signed_in(client, world.global_admin)
    client.post(reverse("computer-add"), step1_fields(Worker.objects.get().pk, action="check"), **HTMX)
    target = ComputeTarget.objects.get(name="gpu-host-1")
    check = target.checks.get()
    ConnectionCheck.objects.filter(pk=check.pk).update(created_at=check.created_at - timedelta(minutes=6))
    assert poll(client, target, check).status_code == 200, "the poll applies no deadline: it keeps polling"
    run_periodic()  # computers.expire_stale, as the periodic runner does
    done = poll(client, target, check)
    assert done.status_code == 286
    page = html(done)
    assert "The selected worker did not claim the check" in page
    assert "The worker did not pick up the check within 5 minutes. Check that the worker is running" in page


def test_reading_a_missing_directory_says_so_under_the_field(client, world, worker):
    signed_in(client, world.global_admin)
    worker_pk = Worker.objects.get().pk
    client.post(reverse("computer-add"), step1_fields(worker_pk, action="continue"), **HTMX)
    target = ComputeTarget.objects.get(name="gpu-host-1")
    url = reverse("computer-path-assist", args=[target.pk]) + "?field=python_path"
    client.post(url, {"worker": str(worker_pk), "python_path": "/nope/"}, **HTMX)
    read = DirectoryRead.objects.get()
    worker.complete_read(worker.claim_read(), error="not_found")
    answer = client.post(url + "&poll=1", {"worker": str(worker_pk), "python_path": "/nope/",
                                           "python_path_reads": str(read.pk)}, **HTMX)
    assert answer.status_code == 286 and "This directory does not exist" in html(answer)


def test_the_python_path_offers_executables_and_directories_of_a_read_directory(client, world, worker):
    signed_in(client, world.global_admin)
    worker_pk = Worker.objects.get().pk
    client.post(reverse("computer-add"), step1_fields(worker_pk, action="continue"), **HTMX)
    target = ComputeTarget.objects.get(name="gpu-host-1")
    url = reverse("computer-path-assist", args=[target.pk]) + "?field=python_path"
    client.post(url, {"worker": str(worker_pk), "python_path": "/opt/py/"}, **HTMX)
    read = DirectoryRead.objects.get()
    worker.complete_read(worker.claim_read(), entries=[{"name": "python3.12", "kind": "exec"},
                                                       {"name": "python3", "kind": "symlink"},
                                                       {"name": "lib", "kind": "dir"},
                                                       {"name": "README", "kind": "file"}])
    page = html(client.post(url, {"worker": str(worker_pk), "python_path": "/opt/py/py",
                                  "python_path_reads": str(read.pk)}, **HTMX))
    assert '<option value="/opt/py/python3.12" label="executable">' in page
    assert '<option value="/opt/py/python3" label="link">' in page
    assert '<option value="/opt/py/lib/" label="directory">' in page and "README" not in page


def test_directory_reads_and_step_1_and_2_belong_to_global_administrators(client, world, machines, worker):
    signed_in(client, world.project_admin)
    pk = machines.alices.pk
    assert client.post(reverse("computer-path-assist", args=[pk]) + "?field=working_dir",
                       {"working_dir": "/data/", "worker": "1"}, **HTMX).status_code == 403
    assert client.get(reverse("computer-connection", args=[pk]), **HTMX).status_code == 403
    assert client.get(reverse("computer-settings", args=[pk]), **HTMX).status_code == 403
    assert client.get(reverse("computer-connection", args=[machines.roots.pk]), **HTMX).status_code == 404
    assert DirectoryRead.objects.count() == 0


# Edit computer -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("who, expected", [
    ("global_admin", {"alice-box": 200, "shared-gpu": 200, "root-only": 200}),
    ("project_admin", {"alice-box": 200, "shared-gpu": 403, "root-only": 404}),
    ("member", {"alice-box": 404, "shared-gpu": 403, "root-only": 404}),
    ("outsider", {"alice-box": 404, "shared-gpu": 403, "root-only": 404}),
])
def test_edit_enable_and_check_follow_the_owner_or_global_administrator_rule(client, world, machines, who, expected):
    signed_in(client, getattr(world, who))
    targets = {"alice-box": machines.alices, "shared-gpu": machines.public, "root-only": machines.roots}
    for name, status in expected.items():
        pk = targets[name].pk
        assert client.get(reverse("computer-edit", args=[pk]), **HTMX).status_code == status, (who, name)
        disabled = client.post(reverse("computer-enabled", args=[pk]), {"enabled": "0"}, **HTMX)
        assert disabled.status_code == (204 if status == 200 else status), (who, name)
        check = client.post(reverse("computer-check-request", args=[pk]), **HTMX)
        assert check.status_code == status, (who, name)
        assert client.post(reverse("computer-apply-suggested", args=[pk]), {"runtimes": ["python"]},
                           **HTMX).status_code == status


def test_a_site_computer_is_listed_but_not_offered_to_the_ssh_editor(client, world):
    site = ComputeTarget.objects.create(owner=world.project_admin, name="hpc-site", kind="site")
    signed_in(client, world.project_admin)
    row = re.search(r'<tr data-computer="hpc-site">(.*?)</tr>', html(client.get(reverse("computers"))), re.DOTALL)
    assert "Site" in row.group(1) and "Edit computer" not in row.group(1)
    assert client.get(reverse("computer-edit", args=[site.pk]), **HTMX).status_code == 404


def test_the_owner_researcher_edits_both_tabs_and_saves_them_together(client, world, machines):
    signed_in(client, world.project_admin)
    target = machines.alices
    page = html(client.get(reverse("computer-edit", args=[target.pk]), **HTMX))
    assert "Connection" in page and "Settings after connecting" in page and "Check again" in page
    assert "Unsaved connection changes will be saved before checking." in page
    assert 'value="alice-host.example.internal"' in page and "Worker for this connection" not in page
    response = client.post(reverse("computer-edit", args=[target.pk]), {
        "name": "alice-box", "visibility": "private", "host": "alice-new.example.internal", "port": "22",
        "ssh_user": "aliceuser", "ssh_key_path": "/home/worker/.ssh/alice_key",
        "known_hosts_path": "/home/worker/.ssh/alice_known_hosts", "working_dir": "/data/alice-jobs",
        "python_path": "/opt/alice/bin/python3", "cpu_arch": "amd64", "runtimes": ["python"], "gpu_ids": "0",
        "concurrency": "", "dataset_transfer": "relay", "dataset_cache_limit_gib": "100", "enabled": "on",
        "action": "save"}, **HTMX)
    assert triggers(response) == {"computersChanged": True}
    assert json.loads(response.headers["HX-Trigger-After-Swap"]) == {"closeDialog": True}
    target.refresh_from_db()
    assert target.host == "alice-new.example.internal" and target.enabled and target.gpu_ids == ["0"]
    assert target.concurrency == 1


def test_check_again_saves_unsaved_connection_changes_first_and_polls_with_the_form(client, world, machines, worker):
    signed_in(client, world.global_admin)
    target = machines.public
    worker_pk = Worker.objects.get().pk
    form = {"name": "shared-gpu", "visibility": "public", "host": "moved.example.internal", "port": "2201",
            "ssh_user": "shareduser", "ssh_key_path": "/home/worker/.ssh/shared_key",
            "known_hosts_path": "/home/worker/.ssh/shared_known_hosts", "worker": str(worker_pk),
            "working_dir": "/typed/not/saved", "python_path": "/opt/shared/bin/python3", "cpu_arch": "amd64",
            "gpu_ids": "", "dataset_transfer": "relay", "dataset_cache_limit_gib": "100", "tab": "connection"}
    response = client.post(reverse("computer-edit", args=[target.pk]), {**form, "action": "check"}, **HTMX)
    page = html(response)
    assert "Waiting for the worker to start checking…" in page and "The connection settings were saved." in page
    target.refresh_from_db()
    assert target.host == "moved.example.internal"  # the connection was saved …
    assert target.working_dir == "/data/shared-jobs"  # … and only the connection
    check = target.checks.get()
    assert check.requested_worker.worker_id == "lab-worker-1"
    assert f'hx-post="/settings/computers/{target.pk}/checks/{check.pk}?flow=edit"' in page
    worker.complete_check(worker.claim_check(), result=good_result())
    done = poll(client, target, check, flow="edit", working_dir="/typed/not/saved", host="moved.example.internal",
                tab="settings")
    assert done.status_code == 286
    page = html(done)
    assert "Connection verified" in page and 'value="/typed/not/saved"' in page  # values entered stay
    assert '<option value="/data" label="writable · 4.5 TB free">' in page  # candidates refreshed
    assert 'name="tab" value="settings"' in page


def test_the_worker_for_this_connection_starts_with_the_worker_of_the_last_check(client, world, machines, worker):
    second = ScriptedWorker(world.worker_token, "lab-worker-2")
    second.hello()
    last = Worker.objects.get(worker_id="lab-worker-2")
    ComputeTarget.objects.filter(pk=machines.public.pk).update(last_check_worker=last)
    page = html(signed_in(client, world.global_admin).get(reverse("computer-edit", args=[machines.public.pk]), **HTMX))
    assert f'<option value="{last.pk}" selected>' in page


def test_locked_fields_are_explained_while_jobs_use_the_computer(client, world, machines, monkeypatch):
    from computers import locks

    jobs = [SimpleNamespace(pk=41), SimpleNamespace(pk=42)]
    monkeypatch.setattr(locks, "active_jobs", lambda target: jobs)
    signed_in(client, world.project_admin)
    target = machines.alices
    page = html(client.get(reverse("computer-edit", args=[target.pk]), **HTMX))
    assert ("Jobs 41, 42 are queued or running on this computer, so its destination, runtimes, GPUs, and dataset "
            "settings cannot be changed; save after the Jobs end.") in page
    form = {"name": "alice-box", "visibility": "private", "host": "elsewhere.example.internal", "port": "2201",
            "ssh_user": "aliceuser", "ssh_key_path": target.ssh_key_path, "known_hosts_path": target.known_hosts_path,
            "working_dir": target.working_dir, "python_path": target.python_path, "cpu_arch": "amd64",
            "gpu_ids": "0\n1", "concurrency": "2", "dataset_transfer": "relay", "dataset_cache_limit_gib": "100",
            "action": "save"}
    refused = html(client.post(reverse("computer-edit", args=[target.pk]), form, **HTMX))
    assert "cannot change now; save after the Jobs end." in refused
    assert "Locked while Jobs use this computer." in refused
    target.refresh_from_db()
    assert target.host == "alice-host.example.internal"
    # Enabling and disabling always works.
    assert client.post(reverse("computer-enabled", args=[target.pk]), {"enabled": "0"}, **HTMX).status_code == 204


# Enable/Disable, checks from the details, Suggested settings -----------------------------------------

def test_disable_and_enable_from_the_list_refresh_it_and_explain_a_refusal(client, world, machines):
    signed_in(client, world.global_admin)
    machines.public.working_dir = ""
    machines.public.save()
    refused = client.post(reverse("computer-enabled", args=[machines.public.pk]), {"enabled": "1"}, **HTMX)
    assert refused.headers["HX-Retarget"] == "#dialog-content"
    assert ("The working directory and the Python executable path are required to enable shared-gpu. Enter them with "
            "Edit computer.") in html(refused)
    response = client.post(reverse("computer-enabled", args=[machines.roots.pk]), {"enabled": "1"}, **HTMX)
    assert response.status_code == 204 and triggers(response) == {"computersChanged": True}
    machines.roots.refresh_from_db()
    assert machines.roots.enabled
    assert AuditEvent.objects.filter(action="computer.enable", object_id=str(machines.roots.pk)).exists()
    # Without HTMX: a form post and back to the list.
    plain = client.post(reverse("computer-enabled", args=[machines.roots.pk]), {"enabled": "0"})
    assert plain.status_code == 302 and plain.url == reverse("computers")
    machines.roots.refresh_from_db()
    assert not machines.roots.enabled


def test_check_connection_in_the_details_asks_the_last_worker_and_redraws_the_details_when_done(
        client, world, machines, worker):
    ComputeTarget.objects.filter(pk=machines.public.pk).update(last_check_worker=Worker.objects.get())
    signed_in(client, world.global_admin)
    panel = client.post(reverse("computer-check-request", args=[machines.public.pk]), **HTMX)
    page = html(panel)
    assert 'id="connection-check"' in page and "Waiting for the worker to start checking…" in page
    check = machines.public.checks.get()
    assert check.requested_worker.worker_id == "lab-worker-1"
    second = html(client.post(reverse("computer-check-request", args=[machines.public.pk]), **HTMX))
    assert "already waiting or running" in second
    worker.complete_check(worker.claim_check(), status="failed", result={
        **good_result(), "items": [*good_result()["items"][:-1],
                                   {"key": "api", "status": "failed", "code": "api_unreachable", "detail": ""}]})
    done = poll(client, machines.public, check, flow="details")
    assert done.status_code == 286
    assert done.headers["HX-Retarget"] == "#computer-details" and done.headers["HX-Reswap"] == "outerHTML"
    page = html(done)
    assert "Could not verify connection" in page
    assert "The target cannot reach the worker's MMT_API_URL, which Jobs need for logging." in page


def test_a_check_nobody_picks_up_tells_the_details_where_to_look(client, world, machines):
    from datetime import timedelta

    # A worker of alice's service account handles alice-box, so the unnamed check is asked; it never claims.
    bot_token = world.token(world.alices_account.user, ["read", "worker:execute"], kind="service")
    assert ScriptedWorker(bot_token, "alice-bot-worker", target_ids=[machines.alices.pk]).hello().status_code == 200
    signed_in(client, world.project_admin)
    client.post(reverse("computer-check-request", args=[machines.alices.pk]), **HTMX)
    check = machines.alices.checks.get()
    assert check.requested_worker is None  # no worker named: one that handles the computer takes it
    ConnectionCheck.objects.filter(pk=check.pk).update(created_at=check.created_at - timedelta(minutes=6))
    run_periodic()
    page = html(poll(client, machines.alices, check, flow="details"))
    assert "The chosen worker did not pick up the check, or no worker claimed the check within 5 minutes" in page
    assert "MMT_WORKER_TARGET_IDS (--target-ids of install)" in page


def test_save_selected_settings_changes_only_what_was_selected(client, world, machines, worker):
    target = machines.public
    ConnectionCheck.objects.create(target=target, status="succeeded", result=_clean(target, good_result()))
    signed_in(client, world.global_admin)
    page = html(client.get(reverse("computer-detail", args=[target.pk])))
    assert "Suggested settings" in page and "Save selected settings" in page
    assert "0 · NVIDIA A100-SXM4-80GB · 80 GiB" in page
    nothing = html(client.post(reverse("computer-apply-suggested", args=[target.pk]), {}, **HTMX))
    assert "Select the GPUs or runtimes to save." in nothing
    saved = client.post(reverse("computer-apply-suggested", args=[target.pk]), {"gpu_ids": ["1"]}, **HTMX)
    assert "Saved the selected settings." in html(saved)
    target.refresh_from_db()
    assert target.gpu_ids == ["1"] and target.runtimes == []


# Whole pages without HTMX ------------------------------------------------------------------------------

def test_the_add_dialog_also_works_as_whole_pages_without_htmx(client, world, worker):
    signed_in(client, world.global_admin)
    page = html(client.get(reverse("computer-add")))
    assert "<html" in page and "hx-disable" in page and "Check connection and continue" in page
    response = client.post(reverse("computer-add"), step1_fields(Worker.objects.get().pk, action="check"))
    target = ComputeTarget.objects.get(name="gpu-host-1")
    check = target.checks.get()
    assert response.status_code == 302
    assert response.url == reverse("computer-connection", args=[target.pk]) + f"?check={check.pk}"
    waiting = html(client.get(response.url))
    assert '<meta http-equiv="refresh" content="2">' in waiting and "Waiting for the worker" in waiting
    worker.complete_check(worker.claim_check(), result=good_result())
    after = client.get(response.url)
    assert after.status_code == 302 and after.url.startswith(reverse("computer-settings", args=[target.pk]))
    step2 = html(client.get(after.url))
    assert "Connection verified" in step2 and 'value="/usr/bin/python3"' in step2
    saved = client.post(reverse("computer-settings", args=[target.pk]), {
        "check": str(check.pk), "working_dir": "/data", "python_path": "/usr/bin/python3", "cpu_arch": "amd64",
        "runtimes": ["python"], "gpu_ids": "0\n1", "dataset_transfer": "relay", "dataset_cache_limit_gib": "100",
        "enabled": "on", "action": "save"})
    assert saved.status_code == 302 and saved.url == reverse("computer-detail", args=[target.pk])
    details = html(client.get(saved.url))
    assert 'data-computer="gpu-host-1"' in details and f'<code id="computer-id">{target.pk}</code>' in details


def test_check_again_and_check_connection_also_work_as_whole_pages_without_htmx(client, world, machines, worker):
    signed_in(client, world.global_admin)
    target = machines.public
    form = {"name": "shared-gpu", "visibility": "public", "host": target.host, "port": "2201",
            "ssh_user": target.ssh_user, "ssh_key_path": target.ssh_key_path,
            "known_hosts_path": target.known_hosts_path, "worker": str(Worker.objects.get().pk),
            "working_dir": target.working_dir, "python_path": target.python_path, "cpu_arch": "amd64",
            "gpu_ids": "", "dataset_transfer": "relay", "dataset_cache_limit_gib": "100", "action": "check"}
    response = client.post(reverse("computer-edit", args=[target.pk]), form)
    check = target.checks.get()
    assert response.status_code == 302 and response.url == reverse("computer-edit", args=[target.pk]) + \
        f"?check={check.pk}"
    waiting = html(client.get(response.url))
    assert '<meta http-equiv="refresh" content="2">' in waiting and "Waiting for the worker" in waiting
    worker.complete_check(worker.claim_check(), result=good_result())
    done = html(client.get(response.url))
    assert "Connection verified" in done and 'http-equiv="refresh"' not in done
    # Check connection in the details: a form post, then the details again.
    again = client.post(reverse("computer-check-request", args=[target.pk]))
    assert again.status_code == 302 and again.url == reverse("computer-detail", args=[target.pk]) + "#connection-check"
    details = html(client.get(reverse("computer-detail", args=[target.pk])))
    assert "Waiting for the worker to start checking…" in details


def test_the_pages_are_translated_to_japanese(client, world, machines):
    signed_in(client, world.global_admin)
    page = html(client.get(reverse("computers"), HTTP_ACCEPT_LANGUAGE="ja"))
    assert '<html lang="ja">' in page
    assert "全体設定" in page  # Global settings, from the shared catalogue


# The project's Compute page ----------------------------------------------------------------------------

def test_the_compute_page_lists_usable_computers_and_the_projects_workers(client, world, machines, worker):
    from datetime import timedelta

    from django.utils import timezone

    stale = ScriptedWorker(world.worker_token, "sleepy")
    stale.hello()
    Worker.objects.filter(worker_id="sleepy").update(last_seen_at=timezone.now() - timedelta(seconds=121),
                                                     active_jobs=3)
    signed_in(client, world.viewer)
    page = html(client.get(reverse("project-compute", args=["lab"])))
    assert 'data-computer="shared-gpu"' in page
    assert 'data-computer="alice-box"' not in page and 'data-computer="root-only"' not in page
    online = re.search(r'<tr data-worker="lab-worker-1">(.*?)</tr>', page, re.DOTALL).group(1)
    assert "Online" in online and "0.1.0" in online and "worker-host" in online
    offline = re.search(r'<tr data-worker="sleepy">(.*?)</tr>', page, re.DOTALL).group(1)
    assert "Offline" in offline and "<td>3</td>" in offline
    alices = html(signed_in(client, world.project_admin).get(reverse("project-compute", args=["lab"])))
    assert 'data-computer="alice-box"' in alices
    assert signed_in(client, world.outsider).get(reverse("project-compute", args=["lab"])).status_code == 404
