"""`mado-tracking submit` against the real API with a person's Bearer token: Jobs on a manual site wait
as `waiting_manual`; --dry-run counts them; a claim takes the caller's own Jobs in the token's
project (or, for the owner with --all, everyone's); reports; job tokens and other computers refused."""
from __future__ import annotations

import pytest

from jobs.models import Job
from sites.models import Submission
from tests.conftest import assert_error, bearer
from tests.job_fixtures import job_request
from tests.sites.site_jobs import launcher, no_expiry_throttle, queue, registered, site_of  # noqa: F401

pytestmark = pytest.mark.django_db


@pytest.fixture
def pc(world, host_keys, launcher):
    """alice's PC, Public, submitted by hand."""
    return site_of(world.project_admin, host_keys, launcher, name="alices-pc", submission="manual",
                   variables="PARTITION=gpu")


@pytest.fixture
def bob(world):
    return bearer(world.member_token(world.member))


@pytest.fixture
def alice(world):
    return bearer(world.member_token(world.project_admin))


def test_a_job_on_a_manual_site_waits_and_its_requester_submits_it(world, pc, bob):
    created = bob.post("/api/projects/lab/jobs", job_request(pc), format="json")
    assert created.status_code == 201 and created.json()["status"] == "waiting_manual"
    job_id = created.json()["id"]
    summary = bob.get(f"/api/sites/{pc.pk}/submit").json()
    assert summary == {"computer": pc.pk, "name": "alices-pc", "waiting": 1, "waiting_all": None,
                       "job_shell_version": 1, "working_dir": "/work/mmt", "variables": {"PARTITION": "gpu"},
                       "can_all": False}
    response = bob.post(f"/api/sites/{pc.pk}/submissions/claim",
                        {"limit": 5, "work_dir": "/home/bob/mmt", "variables": {"PARTITION": "debug"}}, format="json")
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    item = response.json()["items"][0]
    assert item["job_ids"] == [job_id] and item["adopt"] is False and item["account_name"] == ""
    assert item["working_dir"] == "/home/bob/mmt"
    assert item["jobs"][0]["spec_dir"] == f"/home/bob/mmt/.mmt-submissions/{job_id}"
    assert "export MMT_VAR_PARTITION=debug" in item["script"] and item["jobs"][0]["token"].startswith("mado_mtj_")
    assert Submission.objects.get(job_id=job_id).submitted_by == world.member
    reported = bob.post(f"/api/sites/{pc.pk}/submissions/report",
                        {"job_ids": [job_id], "outcome": "submitted"}, format="json")
    assert reported.json() == {"jobs": [{"id": job_id, "status": "submitted"}]}
    assert bob.post(f"/api/sites/{pc.pk}/submissions/report", {"job_ids": [job_id], "outcome": "submitted"},
                    format="json").status_code == 200, "resent"
    assert bob.post(f"/api/sites/{pc.pk}/submissions/claim", {}, format="json").json() == {"items": []}


def test_only_the_owner_submits_everyones_jobs_and_only_of_the_tokens_project(world, pc, bob, alice):
    bobs = queue(pc, world.member, world.project, status="waiting_manual")[0]
    alices = queue(pc, world.project_admin, world.project, status="waiting_manual")[0]
    elsewhere = queue(pc, world.outsider, world.other_project, status="waiting_manual")[0]
    assert bob.get(f"/api/sites/{pc.pk}/submit?all=1").json()["waiting_all"] is None
    assert_error(bob.post(f"/api/sites/{pc.pk}/submissions/claim", {"all": True}, format="json"),
                 403, "site_owner_required")
    summary = alice.get(f"/api/sites/{pc.pk}/submit?all=1").json()
    assert (summary["waiting"], summary["waiting_all"], summary["can_all"]) == (1, 2, True)
    items = alice.post(f"/api/sites/{pc.pk}/submissions/claim", {"all": True}, format="json").json()["items"]
    assert sorted(j for item in items for j in item["job_ids"]) == sorted([bobs.pk, alices.pk])
    # One submission per requester: bob's Job runs as his own array, under alice's account.
    assert {item["user"]["username"] for item in items} == {"alice", "bob"}
    assert Job.objects.get(pk=elsewhere.pk).status == "waiting_manual"
    # Reports come from whoever claimed: bob cannot report alice's claim.
    assert_error(bob.post(f"/api/sites/{pc.pk}/submissions/report", {"job_ids": [bobs.pk], "outcome": "submitted"},
                          format="json"), 404, "submission_not_found")


def test_own_claims_take_only_the_callers_jobs(world, pc, bob):
    queue(pc, world.project_admin, world.project, status="waiting_manual")
    mine = queue(pc, world.member, world.project, 2, status="waiting_manual")
    items = bob.post(f"/api/sites/{pc.pk}/submissions/claim", {"limit": 1}, format="json").json()["items"]
    assert [item["job_ids"] for item in items] == [[mine[0].pk]]


def test_a_job_token_is_refused_on_every_submit_endpoint(world, pc, bob):
    queue(pc, world.member, world.project, status="waiting_manual")
    item = bob.post(f"/api/sites/{pc.pk}/submissions/claim", {}, format="json").json()["items"][0]
    job_client = bearer(item["jobs"][0]["token"])
    assert_error(job_client.get(f"/api/sites/{pc.pk}/submit"), 403, "job_token_forbidden")
    for call in ("submissions/claim", "submissions/report"):
        assert_error(job_client.post(f"/api/sites/{pc.pk}/{call}", {}, format="json"), 403)


def test_bad_input_and_other_computers_are_refused_with_what_to_do(world, pc, bob, host_keys, launcher):
    automatic = site_of(world.project_admin, host_keys, launcher, name="hpc")
    assert_error(bob.post(f"/api/sites/{automatic.pk}/submissions/claim", {}, format="json"), 409, "site_not_manual")
    assert_error(bob.post(f"/api/sites/{pc.pk}/submissions/claim", {"limit": 0}, format="json"), 422, "invalid")
    assert_error(bob.post(f"/api/sites/{pc.pk}/submissions/claim", {"work_dir": "relative/dir"}, format="json"),
                 422, "invalid")
    assert_error(bob.post(f"/api/sites/{pc.pk}/submissions/claim", {"variables": {"X": "a b"}}, format="json"),
                 422, "invalid_variables")
    assert_error(bob.post(f"/api/sites/{pc.pk}/submissions/claim", {"all": "yes"}, format="json"), 422, "invalid")
    private = site_of(world.project_admin, host_keys, launcher, name="private-pc", submission="manual",
                      visibility="private")
    assert_error(bob.post(f"/api/sites/{private.pk}/submissions/claim", {}, format="json"), 404)
    viewer = bearer(world.member_token(world.viewer))
    assert_error(viewer.post(f"/api/sites/{pc.pk}/submissions/claim", {}, format="json"), 403, "missing_scope")


def test_stopping_a_waiting_manual_job_cancels_it_at_once(world, pc, bob):
    job_id = bob.post("/api/projects/lab/jobs", job_request(pc), format="json").json()["id"]
    response = bob.post(f"/api/jobs/{job_id}/stop")
    assert response.json()["status"] == "canceled" and response.json()["end_reason"] == "canceled"
