"""What the requester reads about a site Job through the API: its submission, with the scheduler's job
id to look for in squeue or qstat. No scheduler is needed for this: the launcher's claim and report go
through the services (sites.submissions) as the launcher endpoints call them."""
from __future__ import annotations


from jobs import services as job_services
from mado.services import Actor
from sites import submissions
from tests.conftest import bearer
from tests.sites.conftest import host_keys, launcher, make_site, site_fields  # noqa: F401  (fixtures)


def test_the_job_detail_api_shows_the_scheduler_job_id_of_a_site_job(world, launcher, make_site):  # noqa: F811
    target = make_site(world.project_admin, visibility="public")
    job = job_services.create_job(Actor(world.project_admin), world.project,
                                  {"computer": target.pk, "runtime": "python", "command": ["python", "train.py"]})
    [claim] = submissions.launcher_claim(launcher, target.pk, 1)
    submissions.report(Actor(None), {"job_ids": claim["job_ids"], "outcome": "submitted", "scheduler_job_id": "4711"},
                       launcher=launcher)

    body = bearer(world.member_token(world.member)).get(f"/api/jobs/{job.pk}").json()
    assert body["status"] == "submitted"
    shown = body["submission"]
    assert (shown["scheduler_job_id"], shown["status"], shown["job_shell_version"]) == ("4711", "submitted", 1)


def test_a_failed_site_jobs_summary_names_who_submitted_it_and_keeps_the_schedulers_lines(world, launcher,
                                                                                        make_site):  # noqa: F811
    """Issue 15 item 13, the sites half: what the Job page needs of a failed site Job: who took it from
    the queue (the launcher, or the person whose mado-tracking submit did), and the scheduler's message
    with its line breaks, for those who may read it (issue 14: the computer's owner, global
    administrators); the requester reads the Job's error, which says so."""
    target = make_site(world.project_admin, visibility="public")
    job = job_services.create_job(Actor(world.member), world.project,
                                  {"computer": target.pk, "runtime": "python", "command": ["python", "train.py"]})
    [claim] = submissions.launcher_claim(launcher, target.pk, 1)
    stderr = "sbatch: error: Batch job submission failed\nsbatch: error: invalid partition specified: gpu"
    submissions.report(Actor(None), {"job_ids": claim["job_ids"], "outcome": "failed", "error": stderr},
                       launcher=launcher)
    job.refresh_from_db()

    summary = submissions.submission_summary(job, world.project_admin)
    assert (summary["launcher"], summary["submitted_by"], summary["status"]) == (launcher.name, None, "failed")
    assert summary["error"] == stderr and summary["error"].splitlines()[1].endswith("specified: gpu")
    assert submissions.job_error_for(world.project_admin, job) == stderr
    assert submissions.job_error_for(world.global_admin, job) == stderr
    assert submissions.job_error_for(world.member, job) == job.error != stderr
    assert "invalid partition" not in job.error
    assert submissions.submission_summary(job, world.member)["error"] is None
    body = bearer(world.member_token(world.member)).get(f"/api/jobs/{job.pk}").json()
    assert "invalid partition" not in str(body)
