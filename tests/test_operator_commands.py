"""Operator commands: create_token and demo."""
from __future__ import annotations

import os
import stat
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from mado.models import ApiToken, Project, ServiceAccount
from tests.conftest import bearer


def test_create_token_prints_a_working_token_with_the_scopes_asked_for(world):
    out = StringIO()
    call_command("create_token", "bob", "--project", "lab", "--scopes", "read,jobs:write", "--expires-days", "7",
                 stdout=out)
    plaintext = out.getvalue().strip()
    info = bearer(plaintext).get("/api/auth/token").json()
    assert info["kind"] == "personal"
    assert info["scopes"] == ["jobs:write", "read"]
    token = ApiToken.objects.get(prefix=plaintext[:12])
    assert round((token.expires_at - token.created_at).total_seconds() / 86400) == 7


def test_create_token_finds_a_service_account_by_name(world):
    out = StringIO()
    call_command("create_token", "GPU-host-1-worker", "--project", "lab", "--scopes", "read,worker:execute", stdout=out)
    assert bearer(out.getvalue().strip()).get("/api/auth/token").json()["kind"] == "service"


def test_create_token_rejects_unknown_scopes_and_says_which(world):
    with pytest.raises(CommandError, match="Unknown scope write:all"):
        call_command("create_token", "bob", "--project", "lab", "--scopes", "read,write:all")
    assert not ApiToken.objects.filter(user=world.member).exists()


def test_create_token_refuses_worker_execute_for_a_person(world):
    with pytest.raises(CommandError, match="only to service accounts whose role is Admin"):
        call_command("create_token", "alice", "--project", "lab", "--scopes", "worker:execute")


def test_create_token_explains_unknown_projects_and_non_members(world):
    with pytest.raises(CommandError, match="No project nope"):
        call_command("create_token", "bob", "--project", "nope", "--scopes", "read")
    with pytest.raises(CommandError, match="has no role in project lab"):
        call_command("create_token", "mallory", "--project", "lab", "--scopes", "read")


def test_demo_creates_admin_project_and_a_private_worker_token_once(db, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    out = StringIO()
    call_command("demo", stdout=out)
    password = (tmp_path / "admin-password").read_text().strip()
    assert password in out.getvalue()
    token_file = tmp_path / "worker-token"
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "admin-password").st_mode) == 0o600
    info = bearer(token_file.read_text().strip()).get("/api/auth/token").json()
    assert info["project"] == "demo" and "worker:execute" in info["scopes"]

    call_command("demo", stdout=StringIO())
    assert Project.objects.filter(slug="demo").count() == 1
    assert ServiceAccount.objects.filter(name="local-worker").count() == 1
    assert ApiToken.objects.count() == 1, "a still-valid worker token is kept, not re-issued"
    from django.contrib.auth import authenticate

    assert authenticate(username="admin", password=password).is_superuser


def test_create_project_makes_an_audited_project_with_its_first_admin(world):
    from mado.models import AuditEvent, Membership

    out = StringIO()
    call_command("create_project", "vision-lab", "--name", "Vision", "--admin", "bob", stdout=out)
    project = Project.objects.get(slug="vision-lab")
    assert project.name == "Vision"
    assert Membership.objects.get(project=project, user=world.member).role == "admin"
    assert AuditEvent.objects.filter(action="project.create", project=project, actor_label="system").exists()
    with pytest.raises(CommandError, match="already exists"):
        call_command("create_project", "vision-lab")
    with pytest.raises(CommandError, match="No user named ghost"):
        call_command("create_project", "other-lab", "--admin", "ghost")


def test_demo_in_dev_mode_adds_an_enabled_local_computer_for_the_local_worker(db, settings, tmp_path):
    from computers.access import usable_by
    from computers.models import ComputeTarget

    settings.VAR_DIR = tmp_path
    settings.DEV_MODE = True
    call_command("demo", stdout=StringIO())
    local = ComputeTarget.objects.get(name="local")
    assert local.kind == "local" and local.enabled and local.runtimes == ["python"]
    assert (tmp_path / "local-jobs").is_dir()
    worker_user = ServiceAccount.objects.get(name="local-worker").user
    assert usable_by(worker_user).filter(pk=local.pk).exists(), "the demo worker may run the Local computer's jobs"
    from jobs.models import Job

    sample = Job.objects.get()
    assert sample.target == local and sample.status == "queued" and sample.name == "hello-local"
    call_command("demo", stdout=StringIO())
    assert ComputeTarget.objects.filter(name="local").count() == 1
    assert Job.objects.count() == 1, "the sample job is queued once"
