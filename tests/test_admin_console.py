"""The operator's console (Django admin) as a global administrator sees it: every row is listed and
read-only, and the actions change state through the same services as the product's pages."""
from __future__ import annotations

import subprocess
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from computers.models import ComputeGroup, ComputeTarget, ConnectionCheck, DirectoryRead
from jobs.models import GpuReservation, Job
from mado.models import AuditEvent
from mado.services import Actor
from sites.models import JobShell, Launcher, LauncherKey, SiteCheck, SiteSettings, SiteUserSettings, Submission
from tests.computer_fixtures import make_computer
from tests.job_fixtures import JobWorker
from workers.models import Worker

pytestmark = pytest.mark.django_db


@pytest.fixture
def root(client, world):
    client.force_login(world.global_admin)
    return client


def changelist(model) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")


def change_url(obj) -> str:
    return reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])


def make_job(world, target, name="", **extra) -> Job:
    from jobs import services

    data = {"computer": target.pk, "runtime": "python", "command": ["python", "train.py"], "name": name, **extra}
    return services.create_job(Actor(world.member), world.project, data)


def act(client, model, action: str, *objs):
    """Run an admin action on the selected rows; returns the followed page and its messages."""
    response = client.post(changelist(model), {"action": action, "_selected_action": [o.pk for o in objs]},
                           follow=True)
    assert response.status_code == 200
    return response, [(m.level_tag, str(m)) for m in response.context["messages"]]


def page(client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, url
    return response.content.decode()


def test_every_changelist_answers_and_lists_its_row(root, world, gpu_box, job_worker):
    job = make_job(world, gpu_box, name="resnet-sweep", gpu_ids=["1"])
    assert job_worker.claim()["id"] == job.pk
    worker = Worker.objects.get()
    group = ComputeGroup.objects.create(name="rack-a", created_by=world.global_admin)
    group.computers.add(gpu_box)
    check = ConnectionCheck.objects.create(target=gpu_box, requested_by=world.global_admin)
    read = DirectoryRead.objects.create(target=gpu_box, connection={}, path="/data/readme-dir",
                                        requested_worker=worker, requested_by=world.global_admin)
    site = ComputeTarget.objects.create(owner=world.global_admin, name="hpc-cluster", kind="site")
    launcher = Launcher.objects.create(name="hpc-launcher", created_by=world.global_admin)
    settings = SiteSettings.objects.create(target=site, launcher=launcher, host="login.hpc.example.org",
                                working_dir="/work/mmt", runner_python="/usr/bin/python3",
                                runner_api_url="https://tracking.example.org")
    shell = JobShell.objects.create(target=site, version=1, content="#!/bin/sh\n", sha256="ab12cd34ef56" * 5)
    own = SiteUserSettings.objects.create(target=site, user=world.member, account_name="bob-hpc")
    site_check = SiteCheck.objects.create(target=site, launcher=launcher, site_user=world.member,
                                          account_name="bob-check", requested_by=world.member)
    key = LauncherKey.objects.create(launcher=launcher, target=site, public_key="ssh-ed25519 AAAA",
                               fingerprint="SHA256:shared-key-fp")
    site_job = Job.objects.create(project=world.project, created_by=world.member, target=site, name="site-run",
                                  status="submitted")
    submission = Submission.objects.create(job=site_job, target=site, job_shell=shell, launcher=launcher,
                                           batch=uuid.uuid4(), status="submitted", scheduler_job_id="slurm-98765")

    expected = [
        (ComputeTarget, "gpu-host-1"), (ComputeTarget, "hpc-cluster"), (ComputeGroup, "rack-a"),
        (ConnectionCheck, change_url(check)), (DirectoryRead, "/data/readme-dir"),
        (Worker, "lab-worker-1"), (Worker, "gpu-host-1-worker"), (Worker, "worker-host"), (Worker, "0.1.0"),
        (Job, "resnet-sweep"), (GpuReservation, change_url(GpuReservation.objects.get(job=job))),
        (SiteSettings, "login.hpc.example.org"), (JobShell, "ab12cd34ef56"), (SiteUserSettings, "bob-hpc"),
        (SiteCheck, "bob-check"),
        (Launcher, "hpc-launcher"), (LauncherKey, "SHA256:shared-key-fp"), (Submission, "slurm-98765"),
    ]
    for model, text in expected:
        assert text in page(root, changelist(model)), (model, text)
    assert change_url(read) in page(root, changelist(DirectoryRead))
    # Each row's read-only page opens too, inlines included (a job's GPUs, a launcher's keys).
    assert "gpu-host-1" in page(root, change_url(job))
    assert "SHA256:shared-key-fp" in page(root, change_url(launcher))
    for obj in (gpu_box, site, group, check, read, worker, GpuReservation.objects.get(job=job), settings, shell,
                own, site_check, key, submission):
        page(root, change_url(obj))


def test_the_worker_list_shows_who_is_online_and_filters_by_presence(root, world, job_worker):
    JobWorker(world.worker_token, "lab-worker-2").hello()
    Worker.objects.filter(worker_id="lab-worker-2").update(last_seen_at=timezone.now() - timedelta(minutes=5))
    online, offline = Worker.objects.get(worker_id="lab-worker-1"), Worker.objects.get(worker_id="lab-worker-2")
    listed = page(root, changelist(Worker) + "?presence=online")
    assert change_url(online) in listed and change_url(offline) not in listed
    listed = page(root, changelist(Worker) + "?presence=offline")
    assert change_url(offline) in listed and change_url(online) not in listed


def test_the_job_list_filters_by_status_and_searches_by_id_and_name(root, world, gpu_box):
    queued = make_job(world, gpu_box, name="alpha")
    canceled = make_job(world, gpu_box, name="beta")
    Job.objects.filter(pk=canceled.pk).update(status="canceled", end_reason="canceled")
    listed = page(root, changelist(Job) + "?status__exact=canceled")
    assert change_url(canceled) in listed and change_url(queued) not in listed
    listed = page(root, changelist(Job) + f"?q={queued.pk}")
    assert change_url(queued) in listed and change_url(canceled) not in listed
    listed = page(root, changelist(Job) + "?q=beta")
    assert change_url(canceled) in listed and change_url(queued) not in listed


@pytest.mark.parametrize("model", [Job, Worker])
def test_long_lists_cost_no_more_queries_than_short_ones(root, world, gpu_box, job_worker, model):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            page(root, changelist(model))
        return len(captured)

    def add(n):
        for i in range(n):
            if model is Job:  # with a worker: nullable foreign keys are not joined by default
                job = make_job(world, gpu_box)
                Job.objects.filter(pk=job.pk).update(worker=Worker.objects.first())
            else:
                JobWorker(world.worker_token, f"w-{Worker.objects.count()}-{i}").hello()

    add(1)
    few = queries()
    add(5)
    assert queries() == few


def test_rows_are_read_only(root, world, gpu_box):
    job = make_job(world, gpu_box, name="alpha")
    for obj in (job, gpu_box):
        assert 'name="_save"' not in page(root, change_url(obj))
        assert root.post(change_url(obj), {"name": "renamed"}).status_code == 403
        delete = reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_delete", args=[obj.pk])
        assert root.post(delete, {"post": "yes"}).status_code == 403
    assert root.get(reverse("admin:jobs_job_add")).status_code == 403
    job.refresh_from_db()
    gpu_box.refresh_from_db()
    assert job.name == "alpha" and gpu_box.name == "gpu-host-1"


def test_disable_works_and_is_audited_as_the_computers_page_does(root, world, gpu_box):
    other = make_computer(world.global_admin, "other-box", enabled=True, working_dir="/w", python_path="/p")
    _, notes = act(root, ComputeTarget, "disable", gpu_box)
    assert notes == [("success", "Disabled 1 computer(s).")]
    assert root.post(reverse("computer-enabled", args=[other.pk]), {"enabled": "0"}).status_code == 302
    gpu_box.refresh_from_db()
    other.refresh_from_db()
    assert not gpu_box.enabled and not other.enabled

    def audited(target):
        event = AuditEvent.objects.get(object_type="computetarget", object_id=str(target.pk))
        return event.action, event.actor, event.before, event.after

    assert audited(gpu_box) == audited(other) == ("computer.disable", world.global_admin, {"enabled": True},
                                                  {"enabled": False})


def test_disabling_a_site_goes_through_the_sites_service_as_the_computers_page_does(root, world, tmp_path):
    from sites import services as site_services

    key = tmp_path / "host"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(key)], check=True)
    kind, blob = (tmp_path / "host.pub").read_text().split()[:2]
    launcher = Launcher.objects.create(name="hpc-launcher", created_by=world.global_admin,
                                       allowed_hosts=["*.hpc.example.org"])
    site = site_services.create_site(Actor(world.global_admin), {
        "name": "hpc-cluster", "submission": "automatic", "account": "shared", "launcher": launcher.pk,
        "host": "login.hpc.example.org", "port": 22, "ssh_user": "mmtshared", "jump_hosts": [],
        "known_hosts": f"login.hpc.example.org {kind} {blob}\n", "working_dir": "/work/mmt",
        "runner_python": "/usr/bin/python3", "runner_api_url": "https://tracking.example.org", "template": "slurm",
        "enabled": True})
    assert site.enabled
    _, notes = act(root, ComputeTarget, "disable", site)
    assert notes == [("success", "Disabled 1 computer(s).")]
    assert not ComputeTarget.objects.get(pk=site.pk).enabled
    event = AuditEvent.objects.filter(object_type="computetarget", object_id=str(site.pk)).first()
    assert event.action == "site.update" and event.after == {"enabled": False}


def test_enable_reports_a_refused_computer_by_name_and_enables_the_others(root, world, gpu_box):
    incomplete = make_computer(world.global_admin, "no-paths-box")  # no working directory nor Python
    ComputeTarget.objects.filter(pk=gpu_box.pk).update(enabled=False)
    _, notes = act(root, ComputeTarget, "enable", gpu_box, incomplete)
    assert ("success", "Enabled 1 computer(s).") in notes
    assert any(level == "error" and text.startswith("no-paths-box:") for level, text in notes), notes
    assert ComputeTarget.objects.get(pk=gpu_box.pk).enabled
    assert not ComputeTarget.objects.get(pk=incomplete.pk).enabled


def test_request_stop_cancels_a_queued_job(root, world, gpu_box):
    job = make_job(world, gpu_box)
    _, notes = act(root, Job, "request_stop", job)
    assert notes == [("success", "Requested stop of 1 job(s).")]
    job.refresh_from_db()
    assert job.status == "canceled" and job.end_reason == "canceled" and job.stop_requested_by == world.global_admin
    assert AuditEvent.objects.filter(action="job.stop_request", object_id=str(job.pk),
                                     actor=world.global_admin).exists()


def test_request_stop_of_an_ended_job_is_reported_by_its_id(root, world, gpu_box):
    job = make_job(world, gpu_box, name="done-run")
    Job.objects.filter(pk=job.pk).update(status="finished", end_reason="exit_code", exit_code=0)
    _, notes = act(root, Job, "request_stop", job)
    assert len(notes) == 1 and notes[0][0] == "error" and notes[0][1].startswith(f"Job {job.pk} (done-run):")
    assert Job.objects.get(pk=job.pk).stop_requested_at is None


def test_mark_as_lost_ends_a_not_responding_job_and_refuses_a_responding_one(root, world, gpu_box, job_worker):
    silent = make_job(world, gpu_box, gpu_ids=["0"])
    fresh = make_job(world, gpu_box, gpu_ids=["1"])
    first = job_worker.claim()
    second = job_worker.claim(active=[first["id"]])
    assert {first["id"], second["id"]} == {silent.pk, fresh.pk}
    assert job_worker.heartbeat(second if second["id"] == fresh.pk else first, "running").status_code == 200
    Job.objects.filter(pk=silent.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=61))

    _, notes = act(root, Job, "mark_lost", silent, fresh)

    assert ("success", "Marked 1 job(s) as lost.") in notes
    errors = [text for level, text in notes if level == "error"]
    assert len(errors) == 1 and errors[0].startswith(f"Job {fresh.pk}:") and "No response" in errors[0]
    silent.refresh_from_db()
    fresh.refresh_from_db()
    assert silent.status == "failed" and silent.end_reason == "worker_lost"
    assert not GpuReservation.objects.filter(job=silent).exists()
    assert fresh.status == "running" and fresh.end_reason == ""
    assert list(GpuReservation.objects.filter(job=fresh).values_list("gpu_id", flat=True)) == ["1"]
    assert AuditEvent.objects.filter(action="job.mark_lost", object_id=str(silent.pk)).count() == 1
    assert not AuditEvent.objects.filter(action="job.mark_lost", object_id=str(fresh.pk)).exists()


def test_revoke_launcher_goes_through_the_launchers_service(root, world):
    launcher = Launcher.objects.create(name="hpc-launcher", created_by=world.global_admin)
    _, notes = act(root, Launcher, "revoke", launcher)
    assert notes == [("success", "Revoked 1 launcher(s).")]
    launcher.refresh_from_db()
    assert launcher.revoked_at is not None
    assert AuditEvent.objects.filter(action="launcher.revoke", object_id=str(launcher.pk)).exists()


def test_a_signed_in_researcher_is_sent_to_the_admin_login(client, world, gpu_box):
    client.force_login(world.project_admin)
    for model in (Job, Worker, ComputeTarget, Launcher):
        response = client.get(changelist(model))
        assert response.status_code == 302 and response["Location"].startswith(reverse("admin:login"))
    job = make_job(world, gpu_box)
    client.post(changelist(Job), {"action": "request_stop", "_selected_action": [job.pk]})
    assert Job.objects.get(pk=job.pk).status == "queued"


def test_service_accounts_are_named_by_their_name_not_their_internal_username(root, world):
    from django.contrib.auth.models import User

    from mado.models import ApiToken, ServiceAccount

    internal = world.service_account.user.username
    assert internal.startswith("sa-")
    from mado.services import audit

    audit(Actor(world.service_account.user), "worker.hello", world.service_account, project=world.project)
    token = ApiToken.objects.get(prefix=world.worker_token[:12])
    for url in (changelist(ApiToken), changelist(AuditEvent), change_url(world.service_account),
                changelist(ServiceAccount)):
        text = page(root, url)
        assert "gpu-host-1-worker" in text, url
        assert internal not in text, url
    detail = page(root, change_url(token))
    assert "gpu-host-1-worker (service account, lab)" in detail.split("</title>")[0]
    people = page(root, changelist(User) + "?kind=service")
    assert "gpu-host-1-worker (lab)" in people and "alice-bot (lab)" in people
    assert ">bob<" not in people


def test_dataset_versions_are_read_only(root, world):
    from datasets.models import Dataset, DatasetVersion

    dataset = Dataset.objects.create(project=world.project, name="imagenet-mini", created_by=world.member)
    version = DatasetVersion.objects.create(dataset=dataset, number=1, status="complete", file_count=3, total_size=30,
                                            digest="sha256:" + "ab" * 32, created_by=world.member)
    listed = page(root, changelist(DatasetVersion))
    assert change_url(version) in listed
    detail = page(root, change_url(version))
    assert 'name="_save"' not in detail and "imagenet-mini" in detail
    assert root.post(change_url(version), {"status": "uploading", "file_count": 0}).status_code == 403
    delete = reverse("admin:datasets_datasetversion_delete", args=[version.pk])
    assert root.post(delete, {"post": "yes"}).status_code == 403
    assert root.get(reverse("admin:datasets_datasetversion_add")).status_code == 403
    version.refresh_from_db()
    assert (version.status, version.file_count) == ("complete", 3)
