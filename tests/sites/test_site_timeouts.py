"""The deadlines of site Jobs, with timestamps moved back in the database: `submitting` without a report
for 15 minutes fails submit_failed; `submitted` without a runner within the site's queue timeout fails
queue_timeout and, on a launcher site, has its scheduler job canceled. They run in the periodic runner
(`sites.expire_overdue`), and, at most once a second, before launcher polls and claims, runner calls and
`manage.py expire_site_jobs`; job reads show what they did."""
from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from jobs.models import Job
from mado.services import Actor
from sites import services, submissions
from sites.models import Submission
from tests.conftest import bearer
from tests.support import run_periodic
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
    target = site_of(world.project_admin, host_keys, launcher)
    services.update_site(Actor(world.project_admin), target, {"queue_timeout_seconds": 600})
    return target


def _age(job, **fields):
    Submission.objects.filter(job=job).update(**{k: timezone.now() - v for k, v in fields.items()})


def test_a_claim_without_a_report_for_15_minutes_fails_submit_failed(world, site, lclient):
    job = queue(site, world.member, world.project)[0]
    claim(lclient, site)
    reader = bearer(world.member_token(world.member))
    _age(job, claimed_at=timedelta(minutes=14))
    run_periodic()
    assert reader.get(f"/api/jobs/{job.pk}").json()["status"] == "submitting"
    _age(job, claimed_at=timedelta(minutes=15, seconds=5))
    run_periodic()  # sites.expire_overdue, as the periodic runner does
    body = reader.get(f"/api/jobs/{job.pk}").json()
    assert body["status"] == "failed" and body["end_reason"] == "submit_failed"
    assert "within 15 minutes" in body["error"]
    assert claim(lclient, site) == [], "an expired claim is not adopted"


def test_a_submitted_job_without_a_runner_fails_queue_timeout_and_its_scheduler_job_is_canceled(world, site,
                                                                                                lclient):
    job = queue(site, world.member, world.project)[0]
    submitted(lclient, site, scheduler_job_id="6060")
    _age(job, reported_at=timedelta(seconds=590))
    assert bearer(world.member_token(world.member)).get("/api/projects/lab/jobs").json()["items"][0]["status"] == \
        "submitted"
    _age(job, reported_at=timedelta(seconds=610))
    config = lclient.get("/api/launcher/config").json()
    job.refresh_from_db()
    assert (job.status, job.end_reason) == ("failed", "queue_timeout") and "600 s" in job.error
    assert [(c["job_id"], c["scheduler_job_id"]) for c in config["cancellations"]] == [(job.pk, "6060")]
    lclient.post("/api/launcher/cancellations/report", {"job_id": job.pk, "ok": True}, format="json")
    assert Job.objects.get(pk=job.pk).end_reason == "queue_timeout", "the cancellation keeps the first reason"


def test_a_started_runner_is_not_timed_out(world, site, lclient):
    job = queue(site, world.member, world.project)[0]
    item = submitted(lclient, site)
    Runner(job.pk, item["jobs"][0]["token"]).start()
    _age(job, reported_at=timedelta(days=2))
    assert submissions.expire_overdue(force=True) == 0
    assert Job.objects.get(pk=job.pk).status == "waiting_resources"


def test_a_report_arriving_after_the_deadline_cancels_what_it_submitted(world, site, lclient):
    job = queue(site, world.member, world.project)[0]
    item = claim(lclient, site)[0]
    _age(job, claimed_at=timedelta(minutes=16))
    submissions.expire_overdue(force=True)
    assert report(lclient, item["job_ids"], scheduler_job_id="7070").json()["jobs"][0]["status"] == "failed"
    assert [c["scheduler_job_id"] for c in lclient.get("/api/launcher/config").json()["cancellations"]] == ["7070"]


def test_the_management_command_ends_overdue_jobs(world, site, lclient):
    jobs = queue(site, world.member, world.project, 2, walltime_seconds=60)
    claim(lclient, site)
    for job in jobs:
        _age(job, claimed_at=timedelta(hours=1))
    out = StringIO()
    call_command("expire_site_jobs", stdout=out)
    assert out.getvalue().strip() == "Ended 2 overdue site Jobs."
    assert set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("end_reason", flat=True)) == \
        {"submit_failed"}


def test_expiry_runs_at_most_once_a_second(world, site, lclient, monkeypatch):
    monkeypatch.setattr(submissions, "EXPIRY_INTERVAL_SECONDS", 1.0)
    job = queue(site, world.member, world.project)[0]
    claim(lclient, site)
    submissions.expire_overdue(force=True)
    _age(job, claimed_at=timedelta(hours=1))
    assert submissions.expire_overdue() == 0, "within the second: not run"
    assert submissions.expire_overdue(force=True) == 1


def test_the_periodic_runner_ends_a_manual_site_job_past_its_queue_timeout(world, host_keys, launcher, client):
    """No launcher polls a manual site: the periodic runner applies its deadline, and the pages show it
    (they apply none themselves)."""
    pc = site_of(world.project_admin, host_keys, launcher, name="alices-pc", submission="manual",
                 queue_timeout_seconds=600)
    job = queue(pc, world.member, world.project, status="waiting_manual")[0]
    bob = bearer(world.member_token(world.member))
    items = bob.post(f"/api/sites/{pc.pk}/submissions/claim", {}, format="json").json()["items"]
    reported = bob.post(f"/api/sites/{pc.pk}/submissions/report", {"job_ids": [job.pk], "outcome": "submitted",
                                                                   "scheduler_job_id": "77"}, format="json")
    assert reported.status_code == 200, reported.content
    assert [i["job_ids"] for i in items] == [[job.pk]]
    client.force_login(world.member)
    _age(job, reported_at=timedelta(seconds=610))
    client.get(f"/projects/lab/jobs/{job.pk}/")
    client.get("/projects/lab/jobs/")
    assert Job.objects.get(pk=job.pk).status == "submitted", "a read applies no deadline"
    run_periodic()  # sites.expire_overdue, as the periodic runner does
    page = client.get(f"/projects/lab/jobs/{job.pk}/").content.decode()
    job.refresh_from_db()
    assert (job.status, job.end_reason) == ("failed", "queue_timeout")
    assert "Queue timeout" in page
