"""A site's Jobs through a real Slurm (munge + slurmctld + slurmd, tests/peers/slurm.py) end to end:
the launcher logs in to the real sshd as the login user, writes the spec directories, runs the
built-in Slurm job shell (sbatch); slurmd runs the batch script, which execs the runner from the spec
directory; the runner builds the python runtime's venv, runs the code under the supervisor and reports
with the job token. Also: Request stop (scancel through the job shell's mmt_cancel, and the runner's
cancel_requested), the scheduler's SIGTERM before a short time limit, an array of three, and the same
flow on a manual site with `mado-tracking submit` run as a program, and a submission whose report was
lost adopted by the launcher's next round. See conftest.py."""
from __future__ import annotations

import json
import os
import re
import socket
import sys
from datetime import timedelta
from pathlib import Path

from django.utils import timezone

from jobs.models import JobEvent, Metric
from jobs.services import request_stop
from mado.services import Actor, issue_personal_token
from sites import services as site_services
from sites import submissions
from sites.models import Submission
from tests.conftest import bearer
from tests.site_e2e.conftest import TICKER, Site, expected_lines, node_taken, numbered, run_cli, ticks
from tests.support import wait_for


def test_a_job_goes_through_slurm_and_finishes_with_its_logs_metric_and_slurm_id(slurm_site, slurm, sshd, world,
                                                                                 client):
    site = slurm_site
    job = site.job(numbered(200), walltime_seconds=600)
    assert job.status == "queued"

    site.round()
    row = site.submission(job)
    assert row.status == "submitted", row.error
    slurm_id = row.scheduler_job_id
    assert re.fullmatch(r"[0-9]+", slurm_id), slurm_id
    # The scheduler holds it, pending or already running, under the login user and the job shell's name.
    assert slurm.queue(slurm_id) and slurm.queue(slurm_id)[0][1] in ("PENDING", "CONFIGURING", "RUNNING"), \
        slurm.queue(slurm_id)
    details = slurm.show(slurm_id)
    for expected in (f"JobName=mmt-{job.pk}", "Partition=debug", f"UserId={sshd.user}(", "TimeLimit=00:10:00",
                     "Requeue=0"):
        assert expected in details, details

    job = site.wait_status(job, "finished", "failed", "canceled")
    assert (job.status, job.exit_code, job.end_reason) == ("finished", 0, "exit_code"), job.error
    assert site.log(job) == expected_lines(job, 200)
    assert [(m.name, m.value, m.step) for m in Metric.objects.filter(job=job)] == [("loss", 0.25, 1)]
    summary = submissions.submission_summary(job)
    assert (summary["scheduler_job_id"], summary["runner_hostname"]) == (slurm_id, socket.gethostname())
    kinds = list(JobEvent.objects.filter(job=job).order_by("id").values_list("kind", flat=True))
    for earlier, later in (("claimed", "submitted"), ("submitted", "runner_started"), ("runner_started", "started"),
                           ("started", "finished")):
        assert kinds.index(earlier) < kinds.index(later), kinds
    wait_for(lambda: not slurm.queue(slurm_id), timeout=30, what="the batch job to leave the queue")
    assert "JobState=COMPLETED" in slurm.show(slurm_id)

    # What the requester sees: the API's Job and the job page's timeline with the Slurm id.
    answer = bearer(world.member_token(world.project_admin)).get(f"/api/jobs/{job.pk}")
    assert answer.status_code == 200
    assert (answer.json()["status"], answer.json()["exit_code"]) == ("finished", 0)
    client.force_login(world.project_admin)
    page = client.get(f"/projects/{world.project.slug}/jobs/{job.pk}/").content.decode()
    assert f"Submitted to the scheduler as {slurm_id}" in page


def test_request_stop_of_a_pending_job_runs_scancel_through_the_job_shell(slurm_site, slurm, world):
    site = slurm_site
    # Another job takes the whole node, so this one stays pending in the queue.
    with node_taken(slurm):
        job = site.job(numbered(5), walltime_seconds=600)
        site.round()
        slurm_id = site.submission(job).scheduler_job_id
        assert slurm.queue(slurm_id) == [(slurm_id, "PENDING")]

        job = request_stop(Actor(world.project_admin), job)
        row = site.submission(job)
        assert (job.status, row.cancel_state) == ("submitted", "queued")
        site.round()  # the launcher runs the cancel script (mmt_cancel: scancel) over SSH and reports it
        row.refresh_from_db()
        assert (row.cancel_state, row.cancel_error) == ("done", "")
        job = site.wait_status(job, "canceled", timeout=5)
        assert job.end_reason == "canceled"
        wait_for(lambda: not slurm.queue(slurm_id), timeout=30, what="scancel to empty the queue")
        assert "JobState=CANCELLED" in slurm.show(slurm_id)
        assert row.runner_started_at is None


def test_a_job_pending_past_the_queue_timeout_fails_and_the_launcher_cancels_its_slurm_job(slurm_site, slurm):
    site = slurm_site
    with node_taken(slurm):
        job = site.job(numbered(5), walltime_seconds=600)
        site.round()
        row = site.submission(job)
        slurm_id = row.scheduler_job_id
        assert slurm.queue(slurm_id) == [(slurm_id, "PENDING")]
        # The site's queue timeout has passed since the report, with no runner started.
        waited = timedelta(seconds=site.target.site_settings.queue_timeout_seconds + 1)
        Submission.objects.filter(pk=row.pk).update(reported_at=timezone.now() - waited)

        site.round()  # its config poll ends the Job and hands out the cancellation the same round
        job = site.wait_status(job, "failed", timeout=5)
        assert job.end_reason == "queue_timeout" and "queue timeout" in job.error
        row.refresh_from_db()
        assert (row.cancel_state, row.cancel_error) == ("done", "")
        wait_for(lambda: not slurm.queue(slurm_id), timeout=30, what="scancel to empty the queue")
        assert "JobState=CANCELLED" in slurm.show(slurm_id)


def test_request_stop_of_a_running_job_reaches_its_runner_and_the_queue_empties(slurm_site, slurm, world):
    site = slurm_site
    job = site.job(TICKER, walltime_seconds=600)
    site.round()
    slurm_id = site.submission(job).scheduler_job_id
    site.wait_status(job, "running")
    wait_for(lambda: ticks(site.log(job))[-1:] >= [5], timeout=30, what="a few ticks stored")

    request_stop(Actor(world.project_admin), job)
    job = site.wait_status(job, "canceled", "failed", "finished", timeout=40)
    assert (job.status, job.end_reason) == ("canceled", "canceled"), job.error
    got = ticks(site.log(job))
    assert got == list(range(len(got))) and len(got) < 1500
    wait_for(lambda: not slurm.queue(slurm_id), timeout=30, what="the batch job to end with its runner")
    assert "JobState=COMPLETED" in slurm.show(slurm_id) or "JobState=FAILED" in slurm.show(slurm_id)


def test_a_walltime_shorter_than_the_job_ends_it_timed_out_with_its_logs(slurm_site, slurm):
    site = slurm_site
    # Two minutes: the job shell asks Slurm for SIGTERM 60 s before the limit (half of a short limit,
    # mmt_lead_seconds); slurmctld checks time limits every 30 s, so it comes 30–60 s after the start.
    job = site.job(TICKER, walltime_seconds=120)
    site.round()
    slurm_id = site.submission(job).scheduler_job_id
    assert "TimeLimit=00:02:00" in slurm.show(slurm_id)
    site.wait_status(job, "running")

    job = site.wait_status(job, "failed", "finished", "canceled", timeout=150)
    assert (job.status, job.end_reason) == ("failed", "timed_out"), job.error
    assert "time limit" in job.error
    got = ticks(site.log(job))
    assert len(got) > 20 and got == list(range(len(got)))  # every line it printed until SIGTERM, in order
    wait_for(lambda: not slurm.queue(slurm_id), timeout=60, what="the batch job to leave the queue")


def test_three_jobs_alike_go_as_one_slurm_array_and_each_finishes_with_its_own_logs(slurm_site, slurm):
    site = slurm_site
    jobs = [site.job(numbered(30), walltime_seconds=600) for _ in range(3)]
    # This time the launcher is the program an operator runs, for one round, with the same state directory.
    env = {"PATH": os.environ["PATH"], "HOME": str(site.agent.state_dir.parent), "LANG": "C.UTF-8",
           "MMT_API_URL": site.url, "MMT_API_TOKEN": site.launcher_token,
           "MMT_LAUNCHER_STATE_DIR": str(site.agent.state_dir), "MMT_LAUNCHER_LONG_POLL": "0"}
    ran = run_cli([str(Path(sys.executable).parent / "mado-tracking-launcher"), "run", "--once"], env)
    assert ran.returncode == 0, ran.stderr
    assert site.launcher_token not in ran.stdout + ran.stderr and "mado_mtj_" not in ran.stdout + ran.stderr
    rows = [site.submission(job) for job in jobs]
    slurm_id = rows[0].scheduler_job_id
    assert [(r.status, r.scheduler_job_id, r.array_index) for r in rows] == \
        [("submitted", slurm_id, i) for i in range(3)]
    assert len({r.batch for r in rows}) == 1
    assert "ArrayTaskId=" in slurm.show(slurm_id)
    assert sorted(task for task, _ in slurm.queue(slurm_id)) in (
        [f"{slurm_id}_0", f"{slurm_id}_1", f"{slurm_id}_2"], [f"{slurm_id}_1", f"{slurm_id}_2"], [f"{slurm_id}_2"])

    for job in jobs:
        job = site.wait_status(job, "finished", "failed", "canceled")
        assert (job.status, job.exit_code) == ("finished", 0), job.error
        assert site.log(job) == expected_lines(job, 30)
        assert Metric.objects.filter(job=job).count() == 1
    wait_for(lambda: not slurm.queue(slurm_id), timeout=30, what="the array to leave the queue")
    assert Submission.objects.filter(job__in=jobs, runner_started_at__isnull=False).count() == 3


def test_a_manual_site_job_goes_through_mado_tracking_submit_and_slurm_to_finished(server, world, slurm, tmp_path):
    """`mado-tracking submit` run as a program on this machine as the site's login node: the requester's
    personal token (read + jobs:write), SLURM_CONF in the environment as a login shell has it, the
    built-in Slurm job shell run here, and the batch job's runner reporting to the live server."""
    work = tmp_path / "work"
    target = site_services.create_site(Actor(world.project_admin), {
        "name": "manual-cluster", "submission": "manual", "account": "shared", "working_dir": str(work),
        "runner_python": "/usr/bin/python3", "runner_api_url": server, "variables": "PARTITION=debug",
        "template": "slurm", "visibility": "public"})
    site = Site(world, server, target, None, work)
    job = site.job(numbered(50), walltime_seconds=600)
    assert job.status == "waiting_manual"
    _, token = issue_personal_token(Actor(world.project_admin), world.project, scopes=["read", "jobs:write"])
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", "MMT_API_URL": server,
           "MMT_API_TOKEN": token, "SLURM_CONF": str(slurm.conf)}
    try:
        result = run_cli([str(Path(sys.executable).parent / "mado-tracking"), "submit", "--site", str(target.pk)],
                         env)
        assert result.returncode == 0, result.stdout + result.stderr
        row = site.submission(job)
        slurm_id = row.scheduler_job_id
        assert (row.status, row.submitted_by_id) == ("submitted", world.project_admin.pk)
        assert re.fullmatch(r"[0-9]+", slurm_id) and f"submitted as scheduler job {slurm_id}" in result.stdout
        assert token not in result.stdout + result.stderr and "mado_mtj_" not in result.stdout + result.stderr
        assert f"JobName=mmt-{job.pk}" in slurm.show(slurm_id)

        job = site.wait_status(job, "finished", "failed", "canceled")
        assert (job.status, job.exit_code) == ("finished", 0), job.error
        assert site.log(job) == expected_lines(job, 50)
        kinds = list(JobEvent.objects.filter(job=job).order_by("id").values_list("kind", flat=True))
        assert kinds.index("claimed") < kinds.index("submitted") < kinds.index("runner_started") < \
            kinds.index("finished"), kinds
        assert site.submission(job).scheduler_job_id == slurm_id
        wait_for(lambda: not slurm.queue(slurm_id), timeout=30, what="the batch job to leave the queue")
    finally:
        for scheduler_id in site.scheduler_ids():
            slurm.run("scancel", scheduler_id, check=False)
            wait_for(lambda: not slurm.queue(scheduler_id), timeout=30,  # noqa: B023
                     what="the batch job to leave the queue")
        site.kill_leftovers()


def test_a_submission_whose_report_was_lost_is_adopted_not_submitted_twice_and_runs(slurm_site, slurm, monkeypatch):
    """The launcher dies between sbatch and its report (no report on disk either). Its next round gets
    the claim back with adopt: true, the job shell's mmt_find finds the pending job by its name, the
    same Slurm id is reported, and the batch job's runner starts with the new token job.json holds."""
    site = slurm_site
    with node_taken(slurm) as blocker:
        job = site.job(numbered(20), walltime_seconds=600)
        with monkeypatch.context() as lost:
            lost.setattr(site.agent, "report", lambda submission, outcome: None)
            site.round()
        assert (site.submission(job).status, site.wait_status(job, "submitting").status) == ("claimed", "submitting")
        named = slurm.run("squeue", "--noheader", f"--name=mmt-{job.pk}", "--format=%i").stdout.split()
        assert len(named) == 1, named
        first_token = json.loads((site.spec_dir(job) / "job.json").read_text())["token"]

        site.round()
        row = site.submission(job)
        assert (row.status, row.scheduler_job_id) == ("submitted", named[0]), row.error
        assert slurm.run("squeue", "--noheader", f"--name=mmt-{job.pk}", "--format=%i").stdout.split() == named
        assert json.loads((site.spec_dir(job) / "job.json").read_text())["token"] != first_token

        slurm.run("scancel", blocker, check=False)
        job = site.wait_status(job, "finished", "failed", "canceled")
        assert (job.status, job.exit_code) == ("finished", 0), job.error
        assert site.log(job) == expected_lines(job, 20)
