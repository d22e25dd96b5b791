"""What a Job on a site adds to jobs' creation and stop (registered in jobs.executors by SitesConfig)."""
from __future__ import annotations

from django.utils.translation import gettext as _

from jobs.choices import JobStatus
from mado.longpoll import notify
from sites import views
from sites.choices import SubmissionMethod
from sites.models import SiteSettings, Submission
from sites.services import check_can_submit, runs_clusters
from sites.submissions import SITES_CHANNEL


def validate(user, target, values: dict, errors: dict) -> None:
    check_can_submit(user, target)  # 422 site_account_required until My settings are saved
    if target.site_settings.submission == SubmissionMethod.MANUAL:
        values["status"] = JobStatus.WAITING_MANUAL  # until its requester runs mado-tracking submit
    if values["cluster_size"] > 1 and not runs_clusters(target):
        errors["cluster_size"] = [_("%(computer)s's job shell does not run cluster jobs (only a job shell that "
                                    "defines mmt_supports_clusters, such as the Slurm template, starts one runner "
                                    "per node); choose a Slurm site, an SSH computer or a compute group.")
                                  % {"computer": target.name}]


def created(job) -> None:
    notify(SITES_CHANNEL)  # wakes the launcher's long-poll


def manual_instructions(request, target, project) -> dict | None:
    """The "Submit manually" block of a manual site (seed 003), for the Jobs pages."""
    if not SiteSettings.objects.filter(target=target, submission=SubmissionMethod.MANUAL).exists():
        return None
    return views.manual_instructions(request, target, project)


def submitter(job) -> str | None:
    """Who submitted the Job: the launcher, or the person whose `mado-tracking submit` did."""
    submission = Submission.objects.filter(job=job).select_related("launcher", "submitted_by").first()
    if submission is not None and submission.launcher is not None:
        return _("launcher %(name)s") % {"name": submission.launcher.name}
    if submission is not None and submission.submitted_by is not None:
        return _("%(user)s with mado-tracking submit") % {"user": submission.submitted_by.get_username()}
    return None
