"""What a Job on a site adds to jobs' creation and stop (registered in jobs.executors by SitesConfig)."""
from __future__ import annotations

from django.utils.translation import gettext as _

from jobs.choices import JobStatus
from sites import shells
from sites.choices import SubmissionMethod
from sites.services import check_can_submit
from sites.submissions import SITES_CHANNEL
from workers.longpoll import notify


def validate(user, target, values: dict, errors: dict) -> None:
    check_can_submit(user, target)  # 422 site_account_required until My settings are saved
    if target.site_settings.submission == SubmissionMethod.MANUAL:
        values["status"] = JobStatus.WAITING_MANUAL  # until its requester runs mado-tracking submit
    if values["cluster_size"] > 1 and not shells.runs_clusters(target):
        errors["cluster_size"] = [_("%(computer)s's job shell does not run cluster jobs (only a job shell that "
                                    "defines mmt_supports_clusters, such as the Slurm template, starts one runner "
                                    "per node); choose a Slurm site, an SSH computer or a compute group.")
                                  % {"computer": target.name}]


def created(job) -> None:
    notify(SITES_CHANNEL)  # wakes the launcher's long-poll
