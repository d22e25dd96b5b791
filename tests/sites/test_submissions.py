"""The launcher's side of submissions through the real API with its Bearer token (PostgreSQL): claims
limited by capacity, visibility and My settings, arrays of same-shaped Jobs with the rendered script,
job tokens per Job, adopt of unreported claims, reports (idempotent, masked), stops turned into
cancellations, the config's claimable counts, and who may call what."""
from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter

import pytest
from django.db import connection

from jobs.models import Job
from mado.models import AuditEvent, JobToken
from mado.services import Actor
from mado.tokens import hash_token
from sites import launchers, services, submissions
from sites.models import Submission
from tests.conftest import ALL_MEMBER_SCOPES, assert_error, bearer
from tests.sites.site_jobs import (  # noqa: F401  (fixtures)
    Runner,
    claim,
    launcher,
    lclient,
    no_expiry_throttle,
    queue,
    registered,
    report,
    site_of,
    submitted,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def site(world, host_keys, launcher):
    return site_of(world.project_admin, host_keys, launcher)


# Claims -------------------------------------------------------------------------------------------

def test_three_same_shaped_jobs_become_one_array_with_one_batch_and_the_rendered_script(world, site, lclient):
    array = queue(site, world.member, world.project, 3, gpu_count=1, walltime_seconds=5400)
    other = queue(site, world.member, world.project, 1, gpu_count=1, walltime_seconds=600)
    items = claim(lclient, site)
    assert [item["job_ids"] for item in items] == [[j.pk for j in array], [other[0].pk]]
    first = items[0]
    assert first["adopt"] is False and first["job_name"] == f"mmt-{array[0].pk}"
    assert first["user"] == {"id": world.member.pk, "username": "bob"} and first["account_name"] == "mmtshared"
    assert first["working_dir"] == "/work/mmt" and first["spec_root"] == "/work/mmt/.mmt-submissions"
    assert first["api_url"] == "https://tracking.example.org" and first["job_shell_version"] == 1
    script = first["script"]
    ids = ",".join(str(j.pk) for j in array)
    assert f"export MMT_JOB_IDS={ids}" in script and "export MMT_ARRAY_SIZE=3" in script
    assert "export MMT_WALLTIME=01:30:00" in script and "export MMT_VAR_PARTITION=gpu" in script
    assert script.rstrip().endswith("mmt_submit") and "sbatch" in script
    # One batch in the database, in array order, each with the job shell version it used.
    rows = list(Submission.objects.filter(job__in=array).order_by("array_index"))
    assert len({r.batch for r in rows}) == 1 and str(rows[0].batch) == first["batch"]
    assert [r.array_index for r in rows] == [0, 1, 2] and {r.job_shell.version for r in rows} == {1}
    for entry, job in zip(first["jobs"], array, strict=True):
        assert entry["spec_dir"] == f"/work/mmt/.mmt-submissions/{job.pk}"
        assert entry["token"].startswith("mado_mtj_") and entry["job"]["id"] == job.pk
        assert entry["job"]["api_url"] == "https://tracking.example.org" and entry["job"]["command"]
        # A job token per Job, stored only as its hash.
        assert JobToken.objects.get(token_hash=hash_token(entry["token"])).job_id == job.pk
    assert set(Job.objects.filter(target=site).values_list("status", flat=True)) == {"submitting"}
    assert len({e["token"] for item in items for e in item["jobs"]}) == 4


def test_claims_stop_at_the_sites_capacity_and_go_on_when_a_job_ends(world, site, lclient):
    services.update_site(Actor(world.project_admin), site, {"max_active_submissions": 2})
    jobs = queue(site, world.member, world.project, 5)
    first = claim(lclient, site)
    assert [j for item in first for j in item["job_ids"]] == [jobs[0].pk, jobs[1].pk]
    assert report(lclient, first[0]["job_ids"], scheduler_job_id="100").status_code == 200
    assert claim(lclient, site) == [], "two submitted Jobs fill the site"
    runner = Runner(jobs[0].pk, first[0]["jobs"][0]["token"])
    assert runner.start().status_code == 200
    assert claim(lclient, site) == [], "waiting for resources still counts"
    assert runner.finish(status="failed", exit_code=1).status_code == 200
    assert [item["job_ids"] for item in claim(lclient, site, limit=5)] == [[jobs[2].pk]]


def test_limit_caps_one_claim(world, site, lclient):
    jobs = queue(site, world.member, world.project, 4)
    assert [item["job_ids"] for item in claim(lclient, site, limit=3)] == [[j.pk for j in jobs[:3]]]
    for bad in (0, 51, "3", True):
        assert_error(lclient.post("/api/launcher/submissions/claim", {"computer": site.pk, "limit": bad},
                                  format="json"), 422, "invalid")


def test_disabled_sites_other_launchers_and_requesters_who_lost_the_site_get_nothing(world, site, lclient,
                                                                                    host_keys):
    mine = queue(site, world.project_admin, world.project)[0]
    bobs = queue(site, world.member, world.project)[0]
    services.update_site(Actor(world.project_admin), site, {"enabled": False})
    assert claim(lclient, site) == []
    services.update_site(Actor(world.project_admin), site, {"enabled": True, "visibility": "private"})
    # Private now: only the owner's Jobs; bob's stays queued.
    assert [item["job_ids"] for item in claim(lclient, site)] == [[mine.pk]]
    assert Job.objects.get(pk=bobs.pk).status == "queued"
    other, token = launchers.register_launcher(Actor(world.global_admin), "hpc-b", world.project)
    assert_error(bearer(token).post("/api/launcher/submissions/claim", {"computer": site.pk}, format="json"),
                 404, "not_found")


def test_personal_account_sites_claim_only_jobs_of_people_who_saved_my_settings(world, host_keys, launcher,
                                                                                lclient):
    target = site_of(world.project_admin, host_keys, launcher, account="personal", ssh_user="")
    services.save_my_settings(Actor(world.member), target, {"account_name": "bob01", "working_dir": "/home/bob01/mmt",
                                                            "variables": {"GROUP": "gp7"}})
    bobs = queue(target, world.member, world.project)[0]
    queue(target, world.project_admin, world.project)  # alice has no My settings (created past the API)
    items = claim(lclient, target)
    assert [item["job_ids"] for item in items] == [[bobs.pk]]
    assert items[0]["account_name"] == "bob01" and items[0]["working_dir"] == "/home/bob01/mmt"
    assert "export MMT_VAR_GROUP=gp7" in items[0]["script"]
    assert "export MMT_SPEC_DIR=/home/bob01/mmt/.mmt-submissions/" in items[0]["script"]


def test_an_unreported_claim_comes_back_adopted_with_a_new_token(world, site, lclient):
    job = queue(site, world.member, world.project)[0]
    lost = claim(lclient, site)[0]
    again = claim(lclient, site)
    assert len(again) == 1 and again[0]["adopt"] is True
    assert again[0]["batch"] == lost["batch"] and again[0]["job_ids"] == [job.pk]
    assert "mmt_find" in again[0]["script"] or "submitting again" in again[0]["script"]
    assert Runner(job.pk, lost["jobs"][0]["token"]).start().status_code == 401, "the lost answer's token ended"
    assert Runner(job.pk, again[0]["jobs"][0]["token"]).start().status_code == 200
    assert Submission.objects.filter(job=job).count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_never_take_the_same_job(world, host_keys, launcher):
    """Sixteen claims at once on real PostgreSQL connections: eight of the launcher on an automatic site,
    eight of the owner's `submit --all` on a manual one, each site with room for 30 of its 60 Jobs.
    The launcher's claims may hand its own unreported claims back (adopt), never a Job twice as new."""
    auto = site_of(world.project_admin, host_keys, launcher, max_active_submissions=30)
    manual = site_of(world.project_admin, host_keys, launcher, name="pc-1", submission="manual",
                     max_active_submissions=30)
    queue(auto, world.member, world.project, 60)
    queue(manual, world.member, world.project, 60, status="waiting_manual")
    fresh: dict[str, list[int]] = {"auto": [], "manual": []}
    errors: list[BaseException] = []
    start = threading.Barrier(16)

    def work(kind):
        try:
            start.wait()
            for _ in range(3):
                if kind == "auto":
                    items = submissions.launcher_claim(launcher, auto.pk, 4)
                else:
                    items = submissions.manual_claim(Actor(world.project_admin), manual, world.project,
                                                     {"all": True, "limit": 4})
                fresh[kind].extend(j for item in items if not item["adopt"] for j in item["job_ids"])
        except BaseException as error:  # surfaced below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(kind,)) for kind in ("auto", "manual") for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for kind, target in (("auto", auto), ("manual", manual)):
        assert [j for j, n in Counter(fresh[kind]).items() if n > 1] == [], kind
        assert Submission.objects.filter(target=target).count() == len(fresh[kind]) <= 30
        assert Job.objects.filter(target=target, status="submitting").count() == len(fresh[kind])
    assert len(fresh["manual"]) == 30, "the manual site fills up"


# Reports ------------------------------------------------------------------------------------------

def test_a_submitted_report_is_idempotent_and_a_different_one_conflicts(world, site, lclient):
    jobs = queue(site, world.member, world.project, 2)
    item = claim(lclient, site)[0]
    first = report(lclient, item["job_ids"], scheduler_job_id="12345")
    assert first.status_code == 200
    assert first.json() == {"jobs": [{"id": j.pk, "status": "submitted"} for j in jobs]}
    assert report(lclient, item["job_ids"], scheduler_job_id="12345").json() == first.json(), "resent: same answer"
    assert_error(report(lclient, item["job_ids"], scheduler_job_id="999"), 409, "submission_already_reported")
    assert_error(report(lclient, item["job_ids"], outcome="failed", error="x"), 409, "submission_already_reported")
    row = Submission.objects.get(job=jobs[0])
    assert row.status == "submitted" and row.scheduler_job_id == "12345" and row.reported_at
    assert AuditEvent.objects.filter(action="job.submission.report").count() == 2


def test_a_failed_report_fails_the_jobs_saying_who_can_read_the_masked_stderr_tail(world, site, lclient):
    """Issue 14: the Job's error says what to do; the scheduler's own message (token masked) stays with
    the submission and the audit, for the computer's owner and global administrators."""
    job = queue(site, world.member, world.project)[0]
    item = claim(lclient, site)[0]
    token = item["jobs"][0]["token"]
    stderr = "sbatch: error: invalid partition\n" + f"token was {token}\n"
    assert report(lclient, item["job_ids"], outcome="failed", error=stderr).json()["jobs"][0]["status"] == "failed"
    job.refresh_from_db()
    assert job.end_reason == "submit_failed" and "invalid partition" not in job.error
    assert job.error.startswith("Not submitted: the site's scheduler or the job shell (version 1) refused the Job")
    assert "owner and global administrators can read its message" in job.error
    row = Submission.objects.get(job=job)
    assert row.status == "failed" and "invalid partition" in row.error
    assert token not in row.error and "****" in row.error
    audit = AuditEvent.objects.get(action="job.submission.report", object_id=str(job.pk))
    assert audit.after["outcome"] == "failed" and "invalid partition" in audit.after["error"]
    assert token not in audit.after["error"]
    assert report(lclient, item["job_ids"], outcome="failed", error=stderr).status_code == 200, "resent"

    # Who reads the scheduler's message, here and in GET /api/jobs/{id}'s submission.
    assert "invalid partition" in submissions.failure_detail(world.global_admin, job)
    assert "invalid partition" in submissions.failure_detail(site.owner, job)
    assert submissions.failure_detail(world.member, job) == ""  # the requester reads the Job's error
    assert submissions.submission_summary(job, world.member)["error"] is None
    assert "invalid partition" in submissions.submission_summary(job, site.owner)["error"]
    assert "\n" in submissions.submission_summary(job, world.global_admin)["error"], "its line breaks kept"


def test_not_tried_reports_say_which_login_failed_and_keep_the_reason_for_administrators(world, site, lclient):
    job = queue(site, world.member, world.project)[0]
    item = claim(lclient, site)[0]
    host = site.site_settings.host
    message = f"Not tried: logging in to {host} failed first: The connection to {host}:22 was refused: check the host."
    assert report(lclient, item["job_ids"], outcome="not_tried", error=message).status_code == 200
    job.refresh_from_db()
    assert job.status == "failed" and job.end_reason == "submit_failed"
    assert job.error.startswith(f"Not submitted: the launcher could not log in to {host}:22 as mmtshared.")
    assert "refused" not in job.error
    assert Submission.objects.get(job=job).status == "not_tried"
    assert submissions.failure_detail(world.global_admin, job) == message
    # The network behind the launcher is not the owner's to probe (as for connection checks).
    assert submissions.failure_detail(site.owner, job) == ""
    assert not job.events.filter(message__contains="was refused").exists()


def test_a_refused_key_is_what_the_user_can_fix_and_stays_in_the_jobs_error(world, site, lclient):
    job = queue(site, world.member, world.project)[0]
    item = claim(lclient, site)[0]
    reason = (f"the login node {site.site_settings.host} refused the launcher's key: add the public key shown in "
              "the computer's details to ~mmtshared/.ssh/authorized_keys there.")
    assert report(lclient, item["job_ids"], outcome="failed", error=reason).status_code == 200
    job.refresh_from_db()
    assert job.error == f"Not submitted: {reason}"


def test_reports_of_jobs_not_claimed_by_this_launcher_or_malformed_are_refused(world, site, lclient):
    job = queue(site, world.member, world.project)[0]
    assert_error(report(lclient, [job.pk]), 404, "submission_not_found")
    claim(lclient, site)
    assert_error(report(lclient, [job.pk], outcome="maybe"), 422, "invalid")
    assert_error(report(lclient, [], outcome="submitted"), 422, "invalid")
    assert_error(report(lclient, [job.pk], scheduler_job_id="12 34; rm -rf /"), 422, "invalid")


# Stops and cancellations --------------------------------------------------------------------------

def test_stopping_a_submitted_job_queues_a_cancellation_and_its_report_cancels_the_job(world, site, lclient):
    job = queue(site, world.member, world.project)[0]
    submitted(lclient, site, scheduler_job_id="777")
    response = bearer(world.member_token(world.member)).post(f"/api/jobs/{job.pk}/stop")
    assert response.status_code == 200 and response.json()["status"] == "submitted"
    cancellations = lclient.get("/api/launcher/config").json()["cancellations"]
    assert [(c["job_id"], c["scheduler_job_id"], c["user"], c["account_name"]) for c in cancellations] == \
        [(job.pk, "777", None, "mmtshared")]
    assert "export MMT_SCHEDULER_JOB_ID=777" in cancellations[0]["script"]
    assert cancellations[0]["script"].rstrip().endswith("mmt_cancel")
    done = lclient.post("/api/launcher/cancellations/report", {"job_id": job.pk, "ok": True}, format="json")
    assert done.status_code == 200 and done.json()["status"] == "canceled"
    job.refresh_from_db()
    assert job.status == "canceled" and job.end_reason == "canceled"
    assert lclient.get("/api/launcher/config").json()["cancellations"] == []
    again = lclient.post("/api/launcher/cancellations/report", {"job_id": job.pk, "ok": True}, format="json")
    assert again.status_code == 200, "resent: same answer"


def test_a_failed_cancellation_leaves_the_job_for_its_runner_or_queue_timeout(world, site, lclient):
    job = queue(site, world.member, world.project)[0]
    submitted(lclient, site, scheduler_job_id="778")
    bearer(world.member_token(world.member)).post(f"/api/jobs/{job.pk}/stop")
    response = lclient.post("/api/launcher/cancellations/report",
                            {"job_id": job.pk, "ok": False, "error": "scancel: error: Invalid job id"}, format="json")
    assert response.status_code == 200 and response.json()["cancel_state"] == "failed"
    assert Job.objects.get(pk=job.pk).status == "submitted"
    assert Submission.objects.get(job=job).cancel_error == "scancel: error: Invalid job id"


def test_stopping_one_job_of_an_array_ends_it_without_canceling_the_others(world, site, lclient):
    jobs = queue(site, world.member, world.project, 2)
    submitted(lclient, site, scheduler_job_id="900")
    bearer(world.member_token(world.member)).post(f"/api/jobs/{jobs[0].pk}/stop")
    assert Job.objects.get(pk=jobs[0].pk).status == "canceled"
    assert lclient.get("/api/launcher/config").json()["cancellations"] == []
    bearer(world.member_token(world.member)).post(f"/api/jobs/{jobs[1].pk}/stop")
    assert [c["job_id"] for c in lclient.get("/api/launcher/config").json()["cancellations"]] == [jobs[1].pk]


def test_a_stop_while_submitting_becomes_a_cancellation_when_the_report_arrives(world, site, lclient):
    job = queue(site, world.member, world.project)[0]
    item = claim(lclient, site)[0]
    bearer(world.member_token(world.member)).post(f"/api/jobs/{job.pk}/stop")
    assert Job.objects.get(pk=job.pk).status == "submitting"
    report(lclient, item["job_ids"], scheduler_job_id="31")
    assert [c["scheduler_job_id"] for c in lclient.get("/api/launcher/config").json()["cancellations"]] == ["31"]


# Config -------------------------------------------------------------------------------------------

def answered_at_once(client, wait: float = 5) -> dict:
    started = time.monotonic()
    body = client.get(f"/api/launcher/config?wait={wait}").json()
    assert time.monotonic() - started < 2, "work waiting: answered at once"
    return body


def test_the_config_counts_claimable_jobs_and_long_polls_only_while_there_is_nothing_to_do(world, site, lclient,
                                                                                         tmp_path):
    body = answered_at_once(lclient)
    assert body["sites"][0]["claimable"] == 0 and body["checks"] == [] and body["cancellations"] == []
    assert body["sites"][0]["keys"] == [], "no key yet: the launcher has one to make, so it is not held"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "key")], check=True)
    public = (tmp_path / "key.pub").read_text()
    assert lclient.post("/api/launcher/keys", {"computer": site.pk, "user": None, "public_key": public},
                        format="json").status_code == 200
    queue(site, world.member, world.project, 2)
    body = answered_at_once(lclient)
    assert body["sites"][0]["claimable"] == 2
    items = claim(lclient, site)
    body = answered_at_once(lclient)
    assert body["sites"][0]["claimable"] == 2, "claimed but unreported: the next claim adopts them"
    report(lclient, [i for item in items for i in item["job_ids"]], scheduler_job_id="4242")
    started = time.monotonic()
    lclient.get("/api/launcher/config?wait=1.5")
    assert time.monotonic() - started >= 1.4, "nothing to do: held"
    assert_error(lclient.get("/api/launcher/config?wait=31"), 400, "invalid")


# Who may call what --------------------------------------------------------------------------------

def test_launcher_tokens_reach_only_launcher_endpoints_and_people_never_do(world, site, lclient):
    job = queue(site, world.member, world.project)[0]
    for method, path in [("get", "/api/projects/lab/jobs"), ("get", f"/api/jobs/{job.pk}"),
                         ("get", f"/api/sites/{site.pk}/submit"), ("post", f"/api/sites/{site.pk}/submissions/claim"),
                         ("post", f"/api/runner/jobs/{job.pk}/start")]:
        response = lclient.get(path) if method == "get" else lclient.post(path, {}, format="json")
        assert_error(response, 403, "launcher_token_forbidden")
    people = [bearer(world.token(world.global_admin, ALL_MEMBER_SCOPES)), bearer(world.member_token(world.member)),
              bearer(world.worker_token)]
    for client in people:
        for method, path in [("get", "/api/launcher/config"), ("post", "/api/launcher/submissions/claim"),
                             ("post", "/api/launcher/submissions/report"), ("post", "/api/launcher/keys"),
                             ("post", "/api/launcher/cancellations/report"),
                             ("post", "/api/launcher/checks/1/complete")]:
            response = (client.get(path) if method == "get"
                        else client.post(path, {"computer": site.pk}, format="json"))
            assert response.status_code == 403, (path, response.content)
    assert Job.objects.get(pk=job.pk).status == "queued"
