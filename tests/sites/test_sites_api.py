"""Sites through the API (/api/sites…): the same rules as the services reach HTTP with the common error
body, and connection details go only to the owner and global administrators."""
from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from mado.choices import TokenKind
from sites import shells
from sites.models import JobShell
from tests.conftest import assert_error, bearer

pytestmark = [pytest.mark.django_db]


def session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def create(client, fields) -> dict:
    response = client.post("/api/sites", fields, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_a_researcher_adds_a_site_and_sees_all_of_its_settings(world, site_fields, host_keys):
    body = create(session(world.member), site_fields(jump_hosts=[]))
    assert body["kind"] == "site" and body["owner"] == "bob" and body["visibility"] == "private"
    assert body["manageable"] and body["usable"] and body["can_run_jobs"]
    assert body["job_shell"] == {"version": 1, "sha256": shells.content_sha256(shells.builtin_template("slurm"))}
    assert body["launcher"]["name"] == "hpc-launcher" and body["host"] == "login.hpc.example.org"
    assert body["known_hosts_fingerprints"] == [{"line": 1, "hosts": "login.hpc.example.org,10.0.0.5",
                                                 "key_type": "ssh-ed25519",
                                                 "fingerprint": host_keys.login_fingerprint, "marker": None}]
    assert body["variables"] == {"PARTITION": "gpu", "CPUS": "4"}


def test_a_token_needs_the_admin_scope_to_add_a_site(world, site_fields):
    token = world.token(world.member, ["read", "jobs:write"])
    assert_error(bearer(token).post("/api/sites", site_fields(), format="json"), 403, "missing_scope")
    token = world.token(world.member, ["read", "admin"])
    assert bearer(token).post("/api/sites", site_fields(), format="json").status_code == 201


def test_invalid_fields_get_422_with_every_field_named(world, site_fields):
    body = assert_error(session(world.member).post("/api/sites", site_fields(port=0, working_dir="tmp"),
                                                    format="json"), 422, "invalid_site")
    assert set(body["fields"]) == {"port", "working_dir"}


def test_signed_out_callers_get_401(world, site_fields):
    assert_error(APIClient().post("/api/sites", site_fields(), format="json"), 401)


def test_users_of_a_public_site_see_it_without_its_connection_details(world, make_site, host_keys):
    target = make_site(world.member, visibility="public")
    body = session(world.outsider).get(f"/api/sites/{target.pk}").json()
    assert body["usable"] and not body["manageable"]
    for hidden in ("host", "port", "ssh_user", "jump_hosts", "known_hosts", "known_hosts_fingerprints", "launcher"):
        assert hidden not in body
    assert body["runner_api_url"] == "https://tracking.example.org"  # where their Jobs report: for trust
    assert host_keys.login_line.split()[2] not in str(body)


def test_a_private_site_is_404_to_people_who_can_neither_use_nor_manage_it(world, make_site):
    target = make_site(world.member)
    for user in (world.outsider, world.viewer):
        assert_error(session(user).get(f"/api/sites/{target.pk}"), 404)
        assert_error(session(user).get(f"/api/sites/{target.pk}/job-shells"), 404)
    assert session(world.global_admin).get(f"/api/sites/{target.pk}").json()["manageable"]


def test_the_site_list_holds_the_sites_the_caller_can_use_or_manage(world, make_site):
    make_site(world.member, name="bobs-private")
    make_site(world.member, name="bobs-public", visibility="public")
    names = [item["name"] for item in session(world.outsider).get("/api/sites").json()["items"]]
    assert names == ["bobs-public"]


def test_only_the_owner_and_global_admins_patch_a_site(world, make_site):
    target = make_site(world.member, visibility="public")
    assert_error(session(world.outsider).patch(f"/api/sites/{target.pk}", {"enabled": False}, format="json"),
                 403, "not_owner")
    response = session(world.global_admin).patch(f"/api/sites/{target.pk}", {"enabled": False}, format="json")
    assert response.status_code == 200 and response.json()["enabled"] is False


def test_the_computers_api_enables_and_disables_a_site_as_the_sites_api_does(world, make_site):
    """PATCH /api/computers/{id} on a site goes through the site's own rules (it answered 422 for
    `enabled` before, asking for a working directory that a site keeps in its site settings)."""
    target = make_site(world.member)
    owner = session(world.member)
    response = owner.patch(f"/api/computers/{target.pk}", {"enabled": False}, format="json")
    assert response.status_code == 200, response.content
    assert owner.get(f"/api/sites/{target.pk}").json()["enabled"] is False
    response = owner.patch(f"/api/computers/{target.pk}", {"enabled": True}, format="json")
    assert response.status_code == 200 and response.json()["enabled"] is True
    assert_error(owner.patch(f"/api/computers/{target.pk}", {"python_path": "/usr/bin/python3", "shell": 1},
                             format="json"), 422, "read_only_fields")
    assert_error(session(world.outsider).patch(f"/api/computers/{target.pk}", {"enabled": False}, format="json"),
                 404)


def test_saving_a_job_shell_answers_201_for_a_new_version_and_200_when_identical(world, make_site):
    target = make_site(world.member)
    content = "mmt_submit() { :; }\nmmt_cancel() { :; }\n"
    first = session(world.member).post(f"/api/sites/{target.pk}/job-shells", {"content": content}, format="json")
    assert first.status_code == 201 and first.json()["version"] == 2 and first.json()["created"] is True
    again = session(world.member).post(f"/api/sites/{target.pk}/job-shells", {"content": content}, format="json")
    assert again.status_code == 200 and again.json()["version"] == 2 and again.json()["created"] is False
    assert_error(session(world.member).post(f"/api/sites/{target.pk}/job-shells", {"content": "echo"},
                                            format="json"), 422, "invalid_job_shell")


def test_users_of_a_site_read_its_job_shell_versions_the_shell_runs_for_them(world, make_site):
    target = make_site(world.member, visibility="public")
    client = session(world.outsider)
    items = client.get(f"/api/sites/{target.pk}/job-shells").json()["items"]
    assert [i["version"] for i in items] == [1] and "content" not in items[0]
    version = client.get(f"/api/sites/{target.pk}/job-shells/1").json()
    assert version["content"] == JobShell.objects.get(target=target).content
    assert_error(client.get(f"/api/sites/{target.pk}/job-shells/9"), 404)
    assert_error(client.post(f"/api/sites/{target.pk}/job-shells", {"content": "x"}, format="json"), 403)


def test_my_settings_through_the_api_and_the_422_before_them(world, make_site):
    target = make_site(world.member, visibility="public", account="personal", ssh_user="")
    client = session(world.viewer)
    assert client.get(f"/api/sites/{target.pk}").json()["can_run_jobs"] is False
    assert client.get(f"/api/sites/{target.pk}/my-settings").json() == {
        "computer": target.pk, "saved": False, "account_name": "", "working_dir": "", "variables": {}}
    response = client.put(f"/api/sites/{target.pk}/my-settings",
                          {"account_name": "carol1", "variables": "GROUP=gp42"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["saved"] and response.json()["variables"] == {"GROUP": "gp42"}
    assert client.get(f"/api/sites/{target.pk}").json()["can_run_jobs"] is True


def test_my_settings_need_a_jobs_write_token(world, make_site):
    target = make_site(world.member, visibility="public", account="personal", ssh_user="")
    token = world.token(world.viewer, ["read"])
    assert_error(bearer(token).put(f"/api/sites/{target.pk}/my-settings", {"account_name": "c"}, format="json"),
                 403, "missing_scope")


def test_a_service_account_token_is_refused_my_settings_whatever_the_site(world, make_site):
    private_elsewhere = make_site(world.member, account="personal", ssh_user="")
    token = world.token(world.service_account.user, ["read", "jobs:write"], kind=TokenKind.SERVICE)
    body = assert_error(bearer(token).put(f"/api/sites/{private_elsewhere.pk}/my-settings",
                                          {"account_name": "bot"}, format="json"), 403, "service_account_no_settings")
    assert "Service accounts cannot have their own settings" in body["error"]


def test_the_built_in_templates_are_listed_with_their_content(world):
    items = session(world.viewer).get("/api/sites/templates").json()["items"]
    assert [i["key"] for i in items] == ["slurm", "pbs", "gridengine", "tcs", "docker_host", "apptainer_host"]
    assert items[0]["label"] == "Slurm" and items[0]["content"] == shells.builtin_template("slurm")
