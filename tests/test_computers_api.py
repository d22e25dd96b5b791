"""Computers through the API: validation, the seed's permission table, and who sees connection details."""
from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from computers import locks, services
from computers.models import ComputeTarget
from mado.models import AuditEvent
from mado.services import Actor
from tests.computer_fixtures import SSH_FIELDS
from tests.conftest import assert_error, bearer

SECRET_VALUES = [SSH_FIELDS["host"], SSH_FIELDS["ssh_key_path"], SSH_FIELDS["known_hosts_path"]]


def session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def new_computer(**extra) -> dict:
    return {"name": "gpu-host-1", "kind": "ssh", **SSH_FIELDS, **extra}


class TestAdding:
    def test_a_global_admin_adds_an_ssh_computer_disabled_private_and_owned(self, world):
        response = session(world.global_admin).post("/api/computers", new_computer(), format="json")
        assert response.status_code == 201, response.content
        body = response.json()
        assert body["owner"] == "root" and body["visibility"] == "private" and body["enabled"] is False
        assert body["concurrency"] == 1
        assert AuditEvent.objects.filter(action="computer.create", object_id=str(body["id"])).exists()

    def test_concurrency_defaults_to_the_number_of_gpu_ids(self, world):
        body = session(world.global_admin).post("/api/computers", new_computer(gpu_ids=["0", "1", "2"]),
                                                format="json").json()
        assert body["concurrency"] == 3

    @pytest.mark.parametrize("user", ["project_admin", "member", "viewer", "outsider"])
    def test_researchers_cannot_add_ssh_computers(self, world, user):
        response = session(getattr(world, user)).post("/api/computers", new_computer(), format="json")
        assert_error(response, 403, "global_admin_required")
        assert not ComputeTarget.objects.exists()

    @pytest.mark.parametrize("field,value,message", [
        ("port", 70000, "between 1 and 65535"),
        ("port", 0, "between 1 and 65535"),
        ("concurrency", 129, "between 1 and 128"),
        ("runtimes", ["python", "podman"], "Runtimes must be chosen"),
        ("cpu_arch", "x86", "amd64 or arm64"),
        ("ssh_key_path", "id_ed25519", "absolute SSH key path"),
        ("name", "bad name", "letters, digits"),
        ("gpu_ids", ["0", "0"], "each once"),
    ])
    def test_bad_values_get_422_naming_the_field_and_nothing_is_saved(self, world, field, value, message):
        response = session(world.global_admin).post("/api/computers", new_computer(**{field: value}), format="json")
        body = assert_error(response, 422, "invalid_computer")
        assert field in body["fields"] and message in body["error"]
        assert not ComputeTarget.objects.exists()

    def test_enabling_needs_a_working_directory_and_a_python_path(self, world):
        body = assert_error(session(world.global_admin).post("/api/computers", new_computer(enabled=True),
                                                             format="json"), 422)
        assert set(body["fields"]) == {"working_dir", "python_path"}
        ok = session(world.global_admin).post("/api/computers", new_computer(
            enabled=True, working_dir="/data/mmt-jobs", python_path="/usr/bin/python3"), format="json")
        assert ok.status_code == 201 and ok.json()["enabled"] is True

    def test_names_are_unique_whatever_the_case(self, world):
        session(world.global_admin).post("/api/computers", new_computer(), format="json")
        body = assert_error(session(world.global_admin).post("/api/computers", new_computer(name="GPU-HOST-1"),
                                                             format="json"), 422)
        assert "already exists" in body["fields"]["name"][0]

    def test_local_computers_exist_only_in_dev_mode(self, world, settings):
        settings.DEV_MODE = False
        body = assert_error(session(world.global_admin).post("/api/computers", {"name": "here", "kind": "local"},
                                                             format="json"), 422)
        assert "MADO_DEV_MODE" in body["fields"]["kind"][0]
        settings.DEV_MODE = True
        response = session(world.global_admin).post("/api/computers", {"name": "here", "kind": "local"}, format="json")
        assert response.status_code == 201 and response.json()["host"] == ""

    def test_the_site_kind_is_reserved_for_the_site_form(self, world):
        assert_error(session(world.global_admin).post("/api/computers", new_computer(kind="site"), format="json"),
                     422, "kind_reserved")


ROLES = ["global_admin", "owner", "other_researcher", "owners_service_account", "outsider"]


@pytest.fixture
def clients(world):
    from tests.conftest import WORKER_SCOPES  # noqa: F401

    sa_token = world.token(world.alices_account.user, ["read", "admin"], kind="service")
    return {
        "global_admin": session(world.global_admin),
        "owner": session(world.project_admin),
        "other_researcher": session(world.member),
        "owners_service_account": bearer(sa_token),
        "outsider": session(world.outsider),
    }


# (status for the researcher's private computer, for the admin's public one)
PERMISSIONS = {
    "global_admin": {"detail": (200, 200), "patch": (200, 200), "check": (201, 201)},
    "owner": {"detail": (200, 200), "patch": (200, 403), "check": (201, 403)},
    "other_researcher": {"detail": (404, 200), "patch": (404, 403), "check": (404, 403)},
    "owners_service_account": {"detail": (200, 200), "patch": (403, 403), "check": (403, 403)},
    "outsider": {"detail": (404, 200), "patch": (404, 403), "check": (404, 403)},
}


@pytest.mark.parametrize("role", ROLES)
def test_the_permission_table_of_the_seed_holds_for_every_endpoint(world, computers, clients, role):
    # Workers that handle each computer are online, so the unnamed checks are asked (not refused at once).
    from tests.computer_fixtures import ScriptedWorker

    bot = world.token(world.alices_account.user, ["read", "worker:execute"], kind="service")
    ScriptedWorker(bot, "alice-handler", target_ids=[computers.researchers_private.pk]).hello()
    ScriptedWorker(world.worker_token, "root-handler", target_ids=[computers.admins_public.pk]).hello()
    client = clients[role]
    for index, target in enumerate([computers.researchers_private, computers.admins_public]):
        expected = PERMISSIONS[role]
        detail = client.get(f"/api/computers/{target.pk}")
        assert detail.status_code == expected["detail"][index], (role, target.name, detail.content)
        patch = client.patch(f"/api/computers/{target.pk}", {"visibility": "public"}, format="json")
        assert patch.status_code == expected["patch"][index], (role, target.name, patch.content)
        check = client.post(f"/api/computers/{target.pk}/checks", {}, format="json")
        assert check.status_code == expected["check"][index], (role, target.name, check.content)
        if check.status_code >= 400:
            assert_error(check, check.status_code)


@pytest.mark.parametrize("role", ROLES)
def test_everyone_signed_in_sees_every_computer_in_the_list_but_connection_details_only_when_managing(
        world, computers, clients, role):
    body = clients[role].get("/api/computers").json()
    assert {c["name"] for c in body["items"]} == {"alice-box", "shared-gpu", "root-only"}
    for item in body["items"]:
        assert {"name", "kind", "owner", "visibility", "state"} <= set(item)
    text = json.dumps(body)
    manages_anything = role in ("global_admin", "owner")
    for secret in SECRET_VALUES:
        assert (secret in text) == manages_anything, (role, secret)
    if role == "owner":
        mine = next(i for i in body["items"] if i["name"] == "alice-box")
        other = next(i for i in body["items"] if i["name"] == "shared-gpu")
        assert mine["host"] == SSH_FIELDS["host"] and "host" not in other


def test_a_service_account_uses_its_creators_private_computers_but_never_sees_their_connection(world, computers,
                                                                                            clients):
    body = clients["owners_service_account"].get(f"/api/computers/{computers.researchers_private.pk}").json()
    assert body["usable"] is True and body["gpu_ids"] == ["0", "1"]
    assert not set(SECRET_VALUES) & set(map(str, body.values()))


def test_only_global_admins_choose_workers_and_read_directories(world, computers, clients):
    target = computers.researchers_private.pk
    assert_error(clients["owner"].post(f"/api/computers/{target}/checks", {"worker_id": "w1"}, format="json"), 403)
    assert_error(clients["owner"].post(f"/api/computers/{target}/reads", {"path": "/data/", "worker_id": "w1"},
                                       format="json"), 403)


def test_unauthenticated_callers_see_nothing(db):
    assert_error(APIClient().get("/api/computers"), 401)


class TestChanging:
    def test_visibility_change_enable_and_disable_are_audited_separately(self, world, computers):
        client = session(world.project_admin)
        target = computers.researchers_private
        client.patch(f"/api/computers/{target.pk}", {"visibility": "public"}, format="json")
        client.patch(f"/api/computers/{target.pk}", {"working_dir": "/data", "python_path": "/usr/bin/python3"},
                     format="json")
        client.patch(f"/api/computers/{target.pk}", {"enabled": True}, format="json")
        client.patch(f"/api/computers/{target.pk}", {"enabled": False}, format="json")
        actions = list(AuditEvent.objects.filter(object_id=str(target.pk), object_type="computetarget")
                       .order_by("id").values_list("action", flat=True))
        assert actions == ["computer.visibility_change", "computer.update", "computer.enable", "computer.disable"]
        vis = AuditEvent.objects.get(action="computer.visibility_change")
        assert vis.before == {"visibility": "private"} and vis.after == {"visibility": "public"}

    def test_unknown_fields_are_refused(self, world, computers):
        response = session(world.global_admin).patch(f"/api/computers/{computers.admins_public.pk}",
                                                     {"owner": "bob"}, format="json")
        assert_error(response, 422, "read_only_fields")

    def test_locked_fields_cannot_change_while_jobs_hold_the_computer_but_enable_always_works(self, world, computers,
                                                                                                monkeypatch):
        """A stand-in for the active jobs isolates the lock rule; tests/test_jobs_api.py uses real jobs."""
        class StandInJobs(list):
            def __getitem__(self, item):
                return list.__getitem__(self, item)

        class Job:
            def __init__(self, pk):
                self.pk = pk

        monkeypatch.setattr(locks, "active_jobs", lambda target: StandInJobs([Job(41), Job(42)]))
        client = session(world.project_admin)
        target = computers.researchers_private
        body = assert_error(client.patch(f"/api/computers/{target.pk}", {"gpu_ids": ["0"], "host": "other"},
                                         format="json"), 409, "computer_in_use")
        assert "41, 42" in body["error"] and set(body["fields"]) == {"gpu_ids", "host"}
        assert ComputeTarget.objects.get(pk=target.pk).gpu_ids == ["0", "1"]
        ok = client.patch(f"/api/computers/{target.pk}", {"visibility": "public", "concurrency": 1}, format="json")
        assert ok.status_code == 200

    def test_without_jobs_nothing_is_locked(self, world, computers):
        assert list(locks.active_jobs(computers.researchers_private)) == []
        target = services.update_computer(Actor(world.global_admin), computers.researchers_private, {"gpu_ids": ["0"]})
        assert target.gpu_ids == ["0"]


def test_the_list_costs_the_same_number_of_queries_for_1000_computers(world, django_assert_max_num_queries):
    owner = world.global_admin
    ComputeTarget.objects.bulk_create([ComputeTarget(owner=owner, name=f"node-{i:04d}", kind="ssh", **SSH_FIELDS)
                                       for i in range(1000)])
    client = session(world.member)
    with django_assert_max_num_queries(6):
        body = client.get("/api/computers").json()
    assert len(body["items"]) == 1000
