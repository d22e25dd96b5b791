"""Adding and changing site computers (seed 003 "Add a computer", DESIGN §8)."""
from __future__ import annotations

import pytest

from computers.models import ComputeTarget
from jobs.models import Job
from mado.errors import ServiceError
from mado.models import AuditEvent
from mado.services import Actor
from sites import services, shells
from sites.models import JobShell, SiteSettings
from tests.sites.conftest import JUMP_HOST, LOGIN_HOST, make_job

pytestmark = pytest.mark.django_db


def refusal(call, *args, **kwargs) -> ServiceError:
    with pytest.raises(ServiceError) as caught:
        call(*args, **kwargs)
    return caught.value


def test_a_researcher_adds_a_site_owns_it_and_it_is_private_by_default(world, make_site):
    target = make_site(world.member)
    assert target.kind == "site"
    assert target.owner == world.member
    assert target.visibility == "private"
    assert target.enabled is True
    assert target.runtimes == ["python"]
    site = SiteSettings.objects.get(target=target)
    assert (site.submission, site.account, site.host, site.ssh_user) == ("automatic", "shared", LOGIN_HOST,
                                                                          "mmtshared")
    assert site.variables == {"PARTITION": "gpu", "CPUS": "4"}
    assert site.template == "slurm"
    assert site.queue_timeout_seconds == 7 * 24 * 3600 and site.max_active_submissions == 10


def test_the_job_shell_starts_as_version_1_of_the_chosen_template(world, make_site):
    target = make_site(world.member, template="pbs")
    shell = JobShell.objects.get(target=target)
    assert shell.version == 1
    assert shell.content == shells.builtin_template("pbs")
    assert shell.sha256 == shells.content_sha256(shell.content)
    assert shell.created_by == world.member


def test_adding_a_site_writes_the_create_audit_events_without_the_known_hosts_text(world, make_site, host_keys):
    target = make_site(world.member)
    created = AuditEvent.objects.get(action="site.create", object_id=str(target.pk))
    assert created.actor == world.member
    assert created.after["name"] == "hpc-cluster" and created.after["launcher"] == "hpc-launcher"
    assert created.after["known_hosts"] == [host_keys.login_fingerprint]
    shell_event = AuditEvent.objects.get(action="site.job_shell.create")
    assert shell_event.after == {"computer": target.pk, "version": 1,
                                 "sha256": JobShell.objects.get(target=target).sha256, "template": "slurm"}


def test_docker_and_apptainer_host_templates_default_to_their_runtime(world, make_site):
    docker = make_site(world.member, name="docker-box", template="docker_host")
    apptainer = make_site(world.member, name="sif-box", template="apptainer_host")
    assert docker.runtimes == ["docker"]
    assert apptainer.runtimes == ["apptainer"]


def test_a_site_may_start_from_pasted_job_shell_content(world, make_site):
    content = shells.builtin_template("slurm").replace("--nodes=1", "--nodes=1 --exclusive")
    target = make_site(world.member, template="", job_shell=content)
    assert JobShell.objects.get(target=target).content == content
    assert SiteSettings.objects.get(target=target).template == ""


def test_every_invalid_field_is_reported_at_once_with_what_to_fix(world, site_fields):
    error = refusal(services.create_site, Actor(world.member), site_fields(
        name="bad name", host="user@login", ssh_user="-root", working_dir="relative/dir",
        runner_python="/usr/bin/python3 -c", runner_api_url="ftp://x", variables="PARTITION=gpu;reboot",
        max_active_submissions=0, queue_timeout_seconds=30, template="lsf", port=70000))
    assert error.code == "invalid_site" and error.status == 422
    assert set(error.fields) == {"name", "host", "ssh_user", "working_dir", "runner_python", "runner_api_url",
                                 "variables", "max_active_submissions", "queue_timeout_seconds", "template", "port"}
    assert "absolute path" in error.fields["working_dir"][0]
    assert "PARTITION" in error.fields["variables"][0]
    assert "between 60 seconds and 30 days" in error.fields["queue_timeout_seconds"][0]


def test_an_automatic_site_needs_a_launcher_a_host_a_shared_account_and_known_hosts(world, site_fields):
    error = refusal(services.create_site, Actor(world.member),
                    site_fields(launcher=None, host="", ssh_user="", known_hosts=""))
    assert set(error.fields) == {"launcher", "host", "ssh_user", "known_hosts"}
    assert "ssh-keyscan login" not in error.fields["known_hosts"][0]  # no host given: nothing to scan


def test_a_revoked_launcher_cannot_be_chosen(world, site_fields, launcher):
    from django.utils import timezone

    launcher.revoked_at = timezone.now()
    launcher.save()
    error = refusal(services.create_site, Actor(world.member), site_fields())
    assert "revoked" in error.fields["launcher"][0]


def test_known_hosts_without_a_key_for_the_host_and_port_is_refused_with_the_keyscan_to_run(world, site_fields):
    error = refusal(services.create_site, Actor(world.member), site_fields(port=2200))
    assert error.fields["known_hosts"] == [(
        f"known_hosts has no key for [{LOGIN_HOST}]:2200. Run ssh-keyscan -p 2200 {LOGIN_HOST}, compare the "
        "fingerprints with the ones the site publishes, then paste the output.")]


def test_every_jump_host_needs_its_key_in_known_hosts(world, site_fields, host_keys):
    error = refusal(services.create_site, Actor(world.member), site_fields(jump_hosts=[f"me@{JUMP_HOST}:2222"]))
    assert f"[{JUMP_HOST}]:2222" in error.fields["known_hosts"][0]
    target = services.create_site(Actor(world.member), site_fields(
        jump_hosts=[f"me@{JUMP_HOST}:2222"], known_hosts=f"{host_keys.login_line}\n{host_keys.jump_line}\n"))
    assert SiteSettings.objects.get(target=target).jump_hosts == [f"me@{JUMP_HOST}:2222"]


def test_more_than_eight_jump_hosts_are_refused(world, site_fields):
    error = refusal(services.create_site, Actor(world.member),
                    site_fields(jump_hosts=[f"gw{i}.example.org" for i in range(9)]))
    assert error.fields["jump_hosts"] == ["At most 8 jump hosts."]


def test_known_hosts_larger_than_64_kib_or_not_known_hosts_is_refused(world, site_fields, host_keys):
    big = "\n".join([host_keys.login_line] * 700)
    assert len(big) > 64 * 1024
    assert "64 KiB" in refusal(services.create_site, Actor(world.member),
                               site_fields(known_hosts=big)).fields["known_hosts"][0]
    garbage = refusal(services.create_site, Actor(world.member), site_fields(known_hosts="hello world\n"))
    assert garbage.fields["known_hosts"][0].startswith("Line 1:")


def test_a_manual_site_needs_no_launcher_host_or_known_hosts(world, site_fields):
    target = services.create_site(Actor(world.member), site_fields(
        submission="manual", launcher=None, host="", ssh_user="", known_hosts=""))
    site = SiteSettings.objects.get(target=target)
    assert site.submission == "manual" and site.launcher is None and site.runs_under_own_account


def test_site_names_are_unique_among_all_computers_regardless_of_case(world, make_site):
    ComputeTarget.objects.create(owner=world.global_admin, name="GPU-Box", kind="ssh")
    error = refusal(make_site, world.member, name="gpu-box")
    assert error.fields["name"] == ["A computer named gpu-box already exists; choose another name."]


def test_unknown_fields_and_other_kinds_are_refused(world, site_fields):
    assert refusal(services.create_site, Actor(world.member), site_fields(password="x")).code == "unknown_fields"
    assert "kind" in refusal(services.create_site, Actor(world.member), site_fields(kind="ssh")).fields


def test_the_owner_changes_a_site_and_the_change_is_audited_with_before_and_after(world, make_site):
    target = make_site(world.member)
    services.update_site(Actor(world.member), target, {"visibility": "public", "variables": "PARTITION=debug",
                                                       "max_active_submissions": 3})
    target.refresh_from_db()
    site = SiteSettings.objects.get(target=target)
    assert target.visibility == "public"
    assert site.variables == {"PARTITION": "debug"} and site.max_active_submissions == 3
    event = AuditEvent.objects.get(action="site.update")
    assert event.before == {"visibility": "private", "variables": {"PARTITION": "gpu", "CPUS": "4"},
                            "max_active_submissions": 10}
    assert event.after == {"visibility": "public", "variables": {"PARTITION": "debug"},
                           "max_active_submissions": 3}


def test_saving_a_site_unchanged_writes_no_audit_event(world, make_site):
    target = make_site(world.member)
    services.update_site(Actor(world.member), target, {"visibility": "private"})
    assert not AuditEvent.objects.filter(action="site.update").exists()


def test_a_change_is_validated_like_a_new_site(world, make_site):
    target = make_site(world.member)
    error = refusal(services.update_site, Actor(world.member), target, {"host": "login.other.example.org"})
    assert "known_hosts has no key for login.other.example.org" in error.fields["known_hosts"][0]
    assert refusal(services.update_site, Actor(world.member), target, {"template": "pbs"}).code == "read_only_fields"


def test_connection_and_runtimes_stay_while_jobs_are_queued_but_visibility_and_limits_change(world, make_site):
    target = make_site(world.member, visibility="public")
    job = make_job(target, world.member, world.project)
    error = refusal(services.update_site, Actor(world.member), target, {"host": "10.0.0.5", "runtimes": ["docker"]})
    assert error.status == 409 and error.code == "computer_in_use"
    assert str(job.pk) in error.message and set(error.fields) == {"host", "runtimes"}
    services.update_site(Actor(world.member), target, {"enabled": False, "queue_timeout_seconds": 3600})
    Job.objects.filter(pk=job.pk).update(status="finished")  # set-up: the lifecycle refuses a direct jump
    services.update_site(Actor(world.member), target, {"host": "10.0.0.5"})
    assert SiteSettings.objects.get(target=target).host == "10.0.0.5"


def test_update_site_refuses_computers_that_are_not_sites(world):
    box = ComputeTarget.objects.create(owner=world.global_admin, name="ssh-box", kind="ssh")
    error = refusal(services.update_site, Actor(world.global_admin), box, {"visibility": "public"})
    assert error.code == "not_a_site" and error.status == 404
