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
