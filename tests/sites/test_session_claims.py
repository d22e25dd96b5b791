"""Issue 14, finding 1: `POST /api/sites/{id}/submissions/claim` from a browser session (no token) takes
only the Jobs of projects where the caller may write Jobs now, like a token is limited to its project.
A site's owner with no role in another project never receives that project's Jobs, scripts or job
tokens (which would then read that project's Jobs and datasets)."""
from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from jobs.models import Job
from mado.choices import Role
from mado.models import Membership, Project
from tests.conftest import bearer
from tests.sites.site_jobs import launcher, no_expiry_throttle, queue, registered, site_of  # noqa: F401

pytestmark = pytest.mark.django_db


def session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


@pytest.fixture
def pc(world, host_keys, launcher):
    """alice's Public PC, submitted by hand; alice (admin of `lab`) has no role in `other`."""
    return site_of(world.project_admin, host_keys, launcher, name="alices-pc", submission="manual")


@pytest.fixture
def waiting(world, pc):
    """One waiting Job each: bob's in lab, alice's in lab, mallory's in `other` (where alice has no role)."""
    return {
        "bob": queue(pc, world.member, world.project, status="waiting_manual")[0],
        "alice": queue(pc, world.project_admin, world.project, status="waiting_manual")[0],
        "elsewhere": queue(pc, world.outsider, world.other_project, status="waiting_manual")[0],
    }


def claimed_ids(response) -> list[int]:
    assert response.status_code == 200, response.content
    return sorted(j for item in response.json()["items"] for j in item["job_ids"])


def test_a_session_claim_with_all_takes_no_job_of_a_project_where_the_owner_has_no_role(world, pc, waiting):
    response = session(world.project_admin).post(f"/api/sites/{pc.pk}/submissions/claim", {"all": True},
                                                 format="json")
    assert claimed_ids(response) == sorted([waiting["bob"].pk, waiting["alice"].pk])
    tokens = [job["token"] for item in response.json()["items"] for job in item["jobs"]]
    assert len(tokens) == 2
    assert Job.objects.get(pk=waiting["elsewhere"].pk).status == "waiting_manual"
    assert "mallory" not in response.content.decode()


def test_the_session_dry_run_counts_only_those_projects_too(world, pc, waiting):
    summary = session(world.project_admin).get(f"/api/sites/{pc.pk}/submit?all=1").json()
    assert (summary["waiting"], summary["waiting_all"], summary["can_all"]) == (1, 2, True)


def test_a_token_claim_stays_limited_to_the_tokens_project(world, pc, waiting):
    alice = bearer(world.member_token(world.project_admin))
    response = alice.post(f"/api/sites/{pc.pk}/submissions/claim", {"all": True}, format="json")
    assert claimed_ids(response) == sorted([waiting["bob"].pk, waiting["alice"].pk])
    assert Job.objects.get(pk=waiting["elsewhere"].pk).status == "waiting_manual"


def test_a_session_takes_the_jobs_of_every_project_where_the_caller_may_write_jobs(world, pc, waiting):
    # alice joins `other` as a member: its Jobs are hers to submit as the owner, from a session.
    Membership.objects.create(project=world.other_project, user=world.project_admin, role=Role.MEMBER)
    response = session(world.project_admin).post(f"/api/sites/{pc.pk}/submissions/claim", {"all": True},
                                                 format="json")
    assert claimed_ids(response) == sorted(job.pk for job in waiting.values())


def test_a_viewer_role_is_not_enough_for_a_session_claim(world, pc, waiting):
    Membership.objects.create(project=world.other_project, user=world.project_admin, role=Role.VIEWER)
    response = session(world.project_admin).post(f"/api/sites/{pc.pk}/submissions/claim", {"all": True},
                                                 format="json")
    assert waiting["elsewhere"].pk not in claimed_ids(response)


def test_a_session_claim_of_ones_own_jobs_skips_projects_one_has_left(world, pc):
    left = Project.objects.create(slug="left", name="Left")
    queue(pc, world.member, left, status="waiting_manual")  # bob's, from when he was a member of `left`
    mine = queue(pc, world.member, world.project, status="waiting_manual")[0]
    response = session(world.member).post(f"/api/sites/{pc.pk}/submissions/claim", {}, format="json")
    assert claimed_ids(response) == [mine.pk]


def test_a_global_administrators_session_is_an_admin_of_every_project(world, host_keys, launcher):
    rooted = site_of(world.global_admin, host_keys, launcher, name="root-pc", submission="manual")
    jobs = [queue(rooted, world.member, world.project, status="waiting_manual")[0],
            queue(rooted, world.outsider, world.other_project, status="waiting_manual")[0]]
    response = session(world.global_admin).post(f"/api/sites/{rooted.pk}/submissions/claim", {"all": True},
                                                format="json")
    assert claimed_ids(response) == sorted(job.pk for job in jobs)
