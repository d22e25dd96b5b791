"""My settings on sites that run under each person's own account, and the rule Jobs are checked
against: 422 site_account_required until the account name is saved (seed 003 "Keys and connection
checks")."""
from __future__ import annotations

import pytest

from computers.models import ComputeTarget
from mado.errors import ServiceError
from mado.models import AuditEvent
from mado.services import Actor
from sites import services
from sites.models import SiteUserSettings
from tests.sites.conftest import make_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def personal_site(world, make_site):
    return make_site(world.member, visibility="public", account="personal", ssh_user="")


def refused(call, *args) -> ServiceError:
    with pytest.raises(ServiceError) as caught:
        call(*args)
    return caught.value


def test_a_personal_account_site_refuses_jobs_until_my_settings_are_saved(world, personal_site):
    error = refused(services.check_can_submit, world.viewer, personal_site)
    assert error.status == 422 and error.code == "site_account_required"
    assert "My settings" in error.message
    services.save_my_settings(Actor(world.viewer), personal_site, {"account_name": "carol"})
    services.check_can_submit(world.viewer, personal_site)  # no longer refused


def test_service_accounts_are_refused_on_personal_account_sites_with_the_same_code(world, make_site):
    target = make_site(world.project_admin, account="personal", ssh_user="")
    error = refused(services.check_can_submit, world.service_account.user, target)
    assert error.code == "site_account_required" and "service accounts cannot" in error.message


def test_shared_account_manual_and_non_site_computers_need_no_settings(world, make_site):
    shared = make_site(world.member)
    manual = make_site(world.member, name="my-pc", submission="manual", account="personal", launcher=None,
                       host="", known_hosts="", ssh_user="")
    ssh = ComputeTarget.objects.create(owner=world.global_admin, name="ssh-box", kind="ssh")
    for target in (shared, manual, ssh):
        services.check_can_submit(world.member, target)
        services.check_can_submit(world.service_account.user, target)


def test_my_settings_are_refused_where_there_is_nothing_to_save(world, make_site):
    shared = make_site(world.member)
    manual = make_site(world.member, name="my-pc", submission="manual", launcher=None, host="", known_hosts="")
    assert refused(services.save_my_settings, Actor(world.member), shared,
                   {"account_name": "bob"}).code == "my_settings_not_applicable"
    error = refused(services.save_my_settings, Actor(world.member), manual, {"account_name": "bob"})
    assert "--var NAME=VALUE" in error.message


def test_my_settings_keep_account_name_working_directory_and_variables_like_group(world, personal_site):
    services.save_my_settings(Actor(world.viewer), personal_site, {
        "account_name": "u12345", "working_dir": "/home/u12345/mmt", "variables": "GROUP=gp42\nPARTITION=short"})
    mine = SiteUserSettings.objects.get(target=personal_site, user=world.viewer)
    assert (mine.account_name, mine.working_dir, mine.variables) == (
        "u12345", "/home/u12345/mmt", {"GROUP": "gp42", "PARTITION": "short"})


def test_saving_my_settings_again_updates_them_and_audits_before_and_after(world, personal_site):
    actor = Actor(world.viewer)
    services.save_my_settings(actor, personal_site, {"account_name": "u1"})
    services.save_my_settings(actor, personal_site, {"account_name": "u1"})  # unchanged: no second event
    services.save_my_settings(actor, personal_site, {"account_name": "u2", "variables": {"GROUP": "g1"}})
    events = list(AuditEvent.objects.filter(action="site.user_settings.save").order_by("at", "id"))
    assert len(events) == 2
    assert events[0].before is None and events[0].after["account_name"] == "u1"
    assert events[1].before == {"account_name": "u1", "working_dir": "", "variables": {}}
    assert events[1].after == {"computer": personal_site.pk, "account_name": "u2", "working_dir": "",
                               "variables": {"GROUP": "g1"}}
    assert SiteUserSettings.objects.filter(target=personal_site, user=world.viewer).count() == 1


@pytest.mark.parametrize("fields, bad", [
    ({"account_name": ""}, "account_name"),
    ({"account_name": "-oProxyCommand=sh"}, "account_name"),
    ({"account_name": "bob smith"}, "account_name"),
    ({"account_name": "bob", "working_dir": "~/mmt"}, "working_dir"),
    ({"account_name": "bob", "variables": "GROUP=$(id)"}, "variables"),
    ({"account_name": "bob", "shell": "/bin/sh"}, "shell"),
])
def test_my_settings_refuse_invalid_values_naming_the_field(world, personal_site, fields, bad):
    error = refused(services.save_my_settings, Actor(world.member), personal_site, fields)
    assert error.code == "invalid_my_settings" and bad in error.fields


def test_the_requesters_own_variables_and_working_directory_reach_the_job_shell(world, personal_site):
    services.save_my_settings(Actor(world.viewer), personal_site, {
        "account_name": "u1", "working_dir": "/home/u1/mmt", "variables": {"GROUP": "gp42", "PARTITION": "short"}})
    job = make_job(personal_site, world.viewer, world.project, gpu_count=2, walltime_seconds=7200)
    values = services.shell_values(personal_site, [job])
    assert values.variables == {"PARTITION": "short", "CPUS": "4", "GROUP": "gp42"}
    assert values.spec_dir == f"/home/u1/mmt/.mmt-submissions/{job.pk}"
    assert values.runner == f"/home/u1/mmt/.mmt-submissions/{job.pk}/mmt-runner"
    assert (values.gpu_count, values.walltime_seconds, values.project_id, values.target_id) == (
        2, 7200, world.project.pk, personal_site.pk)
