"""Job shell versions (REFERENCE §5): (site, version) unique, rows immutable, content 1 B – 1 MiB with its
sha256, identical content makes no new version, audit site.job_shell.create, and what a saved job
shell must contain."""
from __future__ import annotations

import threading

import pytest
from django.db import IntegrityError, connection, transaction

from mado.errors import ServiceError
from mado.models import AuditEvent
from mado.services import Actor
from sites import services, shells
from sites.models import ImmutableRow, JobShell

pytestmark = pytest.mark.django_db

MINIMAL = "mmt_submit() {\n    sbatch --parsable job.sh\n}\n\nmmt_cancel() {\n    scancel \"$MMT_SCHEDULER_JOB_ID\"\n}\n"


@pytest.fixture
def site(world, make_site):
    return make_site(world.member)


def test_saving_different_content_makes_the_next_version(world, site):
    shell, created = services.save_job_shell(Actor(world.member), site, MINIMAL)
    assert created and shell.version == 2
    assert shell.sha256 == shells.content_sha256(MINIMAL) and shell.created_by == world.member
    assert services.current_job_shell(site) == shell
    assert list(JobShell.objects.filter(target=site).values_list("version", flat=True)) == [2, 1]


def test_saving_identical_content_makes_no_new_version_and_no_audit_event(world, site):
    services.save_job_shell(Actor(world.member), site, MINIMAL)
    again, created = services.save_job_shell(Actor(world.global_admin), site, MINIMAL.replace("\n", "\r\n"))
    assert not created and again.version == 2  # Windows line endings are the same content
    assert JobShell.objects.filter(target=site).count() == 2
    assert AuditEvent.objects.filter(action="site.job_shell.create").count() == 2  # v1 at creation, v2


def test_going_back_to_an_older_content_is_a_new_version(world, site):
    first = services.current_job_shell(site)
    services.save_job_shell(Actor(world.member), site, MINIMAL)
    back, created = services.save_job_shell(Actor(world.member), site, first.content)
    assert created and back.version == 3 and back.sha256 == first.sha256


def test_each_new_version_is_audited(world, site):
    shell, _ = services.save_job_shell(Actor(world.global_admin), site, MINIMAL)
    event = AuditEvent.objects.filter(action="site.job_shell.create").order_by("-id").first()
    assert event.actor == world.global_admin
    assert event.object_type == "jobshell" and event.object_id == str(shell.pk)
    assert event.after == {"computer": site.pk, "version": 2, "sha256": shell.sha256,
                           "bytes": len(MINIMAL.encode())}


def test_a_saved_version_cannot_be_changed(site):
    shell = services.current_job_shell(site)
    shell.content = "mmt_submit() { :; }"
    with pytest.raises(ImmutableRow):
        shell.save()
    assert services.current_job_shell(site).content == shells.builtin_template("slurm")


def test_the_database_refuses_a_second_row_with_the_same_version(world, site):
    with pytest.raises(IntegrityError), transaction.atomic():
        JobShell.objects.create(target=site, version=1, content=MINIMAL, sha256=shells.content_sha256(MINIMAL))


@pytest.mark.parametrize("content, says", [
    ("", "empty"),
    ("   \n", "empty"),
    ("mmt_submit() { :; }\n", "mmt_cancel()"),
    ("echo hello\n", "mmt_submit() and mmt_cancel()"),
    ("mmt_submit() { :; }\nmmt_cancel() { :; }\nif true; then\n", "bash cannot parse"),
    ("mmt_submit() { :; }\nmmt_cancel() { :; }\n#\0\n", "NUL"),
    ("mmt_submit() { :; }\nmmt_cancel() { :; }\n" + "#" * (1024 * 1024), "1 MiB"),
])
def test_content_that_cannot_be_a_job_shell_is_refused_with_the_reason(world, site, content, says):
    with pytest.raises(ServiceError) as caught:
        services.save_job_shell(Actor(world.member), site, content)
    assert caught.value.code == "invalid_job_shell" and says in caught.value.message
    assert JobShell.objects.filter(target=site).count() == 1


def test_bash_only_parses_the_content_it_never_runs_it(world, site, tmp_path):
    canary = tmp_path / "ran"
    content = f"touch {canary}\nmmt_submit() {{ :; }}\nmmt_cancel() {{ :; }}\n"
    services.save_job_shell(Actor(world.member), site, content)
    assert not canary.exists()


def test_every_built_in_template_is_a_valid_job_shell_under_1_mib():
    for template in shells.builtin_templates():
        shells.validate_content(template["content"])
        assert 1 <= len(template["content"].encode()) <= 1024 * 1024
        assert "#@common" not in template["content"]
    assert {t["key"]: t["cancel_command"] for t in shells.builtin_templates()} == {
        "slurm": "scancel", "pbs": "qdel", "gridengine": "qdel", "tcs": "pjdel", "docker_host": None,
        "apptainer_host": None}


@pytest.mark.django_db(transaction=True)
def test_two_owners_saving_at_once_get_consecutive_versions_never_the_same_one(world, make_site):
    if connection.vendor != "postgresql":
        pytest.fail("The suite runs on PostgreSQL (make test); row locks are what this test is about.")
    site = make_site(world.member)
    results, barrier = [], threading.Barrier(4)

    def save(n):
        barrier.wait()
        try:
            results.append(services.save_job_shell(Actor(world.member), site, MINIMAL + f"# {n}\n")[0].version)
        finally:
            connection.close()

    threads = [threading.Thread(target=save, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [2, 3, 4, 5]
