"""The permission table of seed 003, row by row, through the services (the API tests check the same
rules reach HTTP as 401/403/404)."""
from __future__ import annotations

import pytest

from computers import access
from mado.errors import ServiceError
from mado.services import Actor, create_service_account
from sites import services

pytestmark = pytest.mark.django_db


def refused(call, *args) -> ServiceError:
    with pytest.raises(ServiceError) as caught:
        call(*args)
    return caught.value


# "Add your own computer (site): Anyone signed in" ------------------------------------------------

@pytest.mark.parametrize("who", ["global_admin", "project_admin", "member", "viewer", "outsider"])
def test_anyone_signed_in_may_add_a_site_and_becomes_its_owner(world, make_site, who):
    user = getattr(world, who)
    target = make_site(user, name=f"site-of-{who}")
    assert target.owner == user


def test_a_signed_out_caller_cannot_add_a_site(world, site_fields):
    assert refused(services.create_site, Actor(None), site_fields()).status == 401


def test_a_service_account_cannot_add_a_site(world, site_fields):
    error = refused(services.create_site, Actor(world.service_account.user), site_fields())
    assert error.status == 403 and error.code == "service_account_cannot_add"


# "Change a computer or its visibility, save the job shell: Owner or global administrator" -------

@pytest.mark.parametrize("who", ["member", "global_admin"])
def test_the_owner_and_global_administrators_change_a_site_and_save_its_job_shell(world, make_site, who):
    target = make_site(world.member, visibility="public")
    actor = Actor(getattr(world, who))
    services.update_site(actor, target, {"visibility": "private"})
    shell, created = services.save_job_shell(actor, target, "mmt_submit() { :; }\nmmt_cancel() { :; }\n")
    assert created and shell.version == 2


@pytest.mark.parametrize("who", ["project_admin", "viewer", "outsider"])
def test_other_people_cannot_change_a_public_site_or_save_its_job_shell_even_if_they_use_it(world, make_site, who):
    target = make_site(world.member, visibility="public")
    actor = Actor(getattr(world, who))
    assert access.can_use(actor.user, target)
    assert refused(services.update_site, actor, target, {"visibility": "private"}).status == 403
    assert refused(services.save_job_shell, actor, target, "mmt_submit() { :; }\nmmt_cancel() { :; }\n").status == 403


def test_a_service_account_of_the_owner_cannot_change_the_owners_site(world, make_site):
    target = make_site(world.project_admin)  # alice created world.alices_account
    actor = Actor(world.alices_account.user)
    assert refused(services.update_site, actor, target, {"visibility": "public"}).status == 403


# "Run Jobs on that computer: Public: everyone. Private: the owner and the Service Accounts the owner created"

def test_a_private_site_runs_jobs_of_its_owner_and_the_service_accounts_the_owner_created(world, make_site):
    target = make_site(world.project_admin)
    other_account = create_service_account(Actor(world.global_admin), world.project, name="root-bot", role="member")
    assert access.can_use(world.project_admin, target)
    assert access.can_use(world.alices_account.user, target)
    assert not access.can_use(other_account.user, target)
    for user in (world.member, world.viewer, world.outsider, world.global_admin):
        assert not access.can_use(user, target)


def test_a_public_site_runs_jobs_of_everyone(world, make_site):
    target = make_site(world.member, visibility="public")
    for user in (world.project_admin, world.viewer, world.outsider, world.global_admin,
                 world.alices_account.user):
        assert access.can_use(user, target)


# "Save your own settings: People who can use that computer" --------------------------------------

@pytest.mark.parametrize("who", ["member", "project_admin", "outsider"])
def test_people_who_can_use_a_personal_account_site_save_their_own_settings(world, make_site, who):
    target = make_site(world.member, visibility="public", account="personal", ssh_user="")
    settings = services.save_my_settings(Actor(getattr(world, who)), target, {"account_name": f"{who}01"})
    assert settings.user == getattr(world, who)


def test_people_who_cannot_use_a_private_site_cannot_save_settings_on_it(world, make_site):
    target = make_site(world.member, account="personal", ssh_user="")
    error = refused(services.save_my_settings, Actor(world.outsider), target, {"account_name": "mallory"})
    assert error.status == 404


def test_service_accounts_cannot_have_their_own_settings(world, make_site):
    target = make_site(world.project_admin, account="personal", ssh_user="")
    assert access.can_use(world.alices_account.user, target)
    error = refused(services.save_my_settings, Actor(world.alices_account.user), target, {"account_name": "bot"})
    assert error.status == 403 and error.code == "service_account_no_settings"
