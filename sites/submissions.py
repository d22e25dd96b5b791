"""Submissions of Jobs to a site's scheduler (docs/sites-protocol.md): claims by the launcher and by
`mado-tracking submit`, their reports, cancellations of Jobs already in the scheduler, the runner on
the compute node reporting with the Job's job token, and the timeouts of the phases in between.

Races are settled in the database. A claim locks the site's settings row (so capacity is counted once
per site at a time) and takes Jobs with FOR UPDATE SKIP LOCKED; everything that changes a Job locks
the Job row first and its Submission second, so no two paths wait on each other in a cycle."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone
from django.utils.translation import gettext as _

from computers import access as computer_access
from jobs import lifecycle, outputs
from jobs import services as job_services
from jobs.choices import MAIN_REPLICA, SITE_ACTIVE_STATUSES, EndReason, JobStatus
from jobs.models import Job, JobReplica
from jobs.serializers import worker_job_payload
from mado import access as identity
from mado import services as identity_services
from mado.choices import ROLE_RANK, SCOPE_MIN_ROLE, Role, Scope
from mado.errors import Conflict, Forbidden, ServiceError
from mado.longpoll import notify
from mado.models import Membership
from mado.services import SYSTEM, Actor, audit
from mado.validation import BIGINT_MAX, as_int
from sites import allowed_hosts, services, shells
from sites.choices import DEFAULT_WALLTIME_SECONDS, SUBMIT_REPORT_TIMEOUT, SubmissionMethod, SubmissionStatus
from sites.models import CancelState, Launcher, SiteSettings, SiteUserSettings, Submission

SITES_CHANNEL = "mado_sites"
MAX_CLAIM = 50
CLAIM_SCAN = 500  # queued Jobs looked at per claim: enough to fill 50 from a few groups
EXPIRY_INTERVAL_SECONDS = 1.0
OUTCOMES = {"submitted": SubmissionStatus.SUBMITTED, "failed": SubmissionStatus.FAILED,
            "not_tried": SubmissionStatus.NOT_TRIED}
HEARTBEAT_SECONDS = 5
LOG_INTERVAL_SECONDS = 1
# How long main1's runner of a cluster job waits, once its code ended, for the subs to finish (so their
# last log lines arrive before main1's finish revokes the job token); told in the start answer.
REPLICA_WAIT_SECONDS = 10
_last_expiry = 0.0


@dataclass
class Batch:
    """Jobs claimed together: one script, one array in the scheduler."""

    site: SiteSettings
    rows: list[Submission]
    tokens: dict[int, str]
    script: str
    adopt: bool = False


# Who may be submitted -----------------------------------------------------------------------------

def waiting(site: SiteSettings, status: str = JobStatus.QUEUED):
    """Jobs of `site` in `status` whose requester may still use it: its visibility may have changed
    since they were created; on a site under each person's own account, only those whose requester
    saved My settings (without an account there is nobody to log in as)."""
    target = site.target
    jobs = Job.objects.filter(target=target, status=status).filter(
        Q(target__visibility="public") | Q(target__owner=F("created_by"))
        | Q(created_by__service_account__created_by=F("target__owner")))
    if site.uses_personal_accounts:
        jobs = jobs.filter(Exists(SiteUserSettings.objects.filter(target=target, user=OuterRef("created_by"))))
    return jobs.order_by("created_at", "id")


def active_count(target) -> int:
    return Job.objects.filter(target=target, status__in=SITE_ACTIVE_STATUSES).count()


def free_slots(site: SiteSettings) -> int:
    return max(0, site.max_active_submissions - active_count(site.target))


# Claims -------------------------------------------------------------------------------------------

def launcher_claim(launcher: Launcher, computer, limit=None) -> list[dict]:
    """Unreported claims of this launcher first (adopt), then new Jobs up to the site's capacity."""
    limit = _limit(limit)
    computer_id = as_int(computer, low=1, high=BIGINT_MAX)
    if computer_id is None:
        raise ServiceError("Give the site's computer id from the config.", "invalid",
                           fields={"computer": ["A computer id."]})
    expire_overdue()
    with transaction.atomic():
        site = (SiteSettings.objects.select_for_update(of=("self",)).select_related("target", "launcher")
                .filter(target_id=computer_id, launcher=launcher, submission=SubmissionMethod.AUTOMATIC).first())
        if site is None:
            raise ServiceError("This launcher serves no automatic site with this computer id; read the sites "
                               "of its config.", "not_found", status=404)
        if not allowed_hosts.site_allowed(site):
            raise Conflict(allowed_hosts.site_refusal(site), "launcher_host_not_allowed")
        batches = _adopt(launcher, site, limit)
        room = min(limit - sum(len(b.rows) for b in batches), free_slots(site))
        if site.target.enabled and room > 0:
            batches += _claim(Actor(launcher.token.user if launcher.token_id else None), site, waiting(site),
                              room, launcher=launcher)
    return [submission_body(batch) for batch in batches]


def manual_claim(actor: Actor, target, project, data: dict) -> list[dict]:
    """`mado-tracking submit`: the caller's `waiting_manual` Jobs in the token's project, or with
    `all` everyone's (the computer's owner only). `project` None (a browser session, no token): the
    projects where the caller may write Jobs now (see `in_callers_projects`)."""
    user = actor.user
    site = _manual_site(user, target)
    everyone = _flag(data.get("all"), "all")
    if everyone and target.owner_id != user.pk:
        raise Forbidden(_("Only the computer's owner submits other people's Jobs (--all); run without --all to "
                          "submit your own."), "site_owner_required")
    limit = _limit(data.get("limit"))
    work_dir = data.get("work_dir")
    if work_dir not in (None, "") and not shells.is_path(work_dir):
        raise ServiceError(_("work_dir must be %(rule)s.") % {"rule": shells.path_rule()}, "invalid",
                           fields={"work_dir": [_("Invalid path.")]})
    variables = shells.parse_variables(data.get("variables") or {})
    with transaction.atomic():
        site = SiteSettings.objects.select_for_update(of=("self",)).select_related("target").get(pk=site.pk)
        jobs = in_callers_projects(waiting(site, JobStatus.WAITING_MANUAL), user, project)
        if not everyone:
            jobs = jobs.filter(created_by=user)
        room = min(limit, free_slots(site))
        batches = _claim(actor, site, jobs, room, submitted_by=user, work_dir=work_dir or None,
                         variables=variables) if room > 0 else []
    return [submission_body(batch) for batch in batches]


def manual_summary(user, target, project, *, everyone: bool) -> dict:
    """What `mado-tracking submit --dry-run` shows."""
    site = _manual_site(user, target)
    jobs = in_callers_projects(waiting(site, JobStatus.WAITING_MANUAL), user, project)
    can_all = target.owner_id == user.pk
    shell = services.current_job_shell(target)
    return {"computer": target.pk, "name": target.name, "waiting": jobs.filter(created_by=user).count(),
            "waiting_all": jobs.count() if can_all and everyone else None,
            "job_shell_version": shell.version if shell else None, "working_dir": site.working_dir,
            "variables": site.variables, "can_all": can_all}


def manual_submitters(user, target, *, project=None, job=None) -> dict:
    """Whether `user` can submit with mado-tracking submit on the manual site `target` (the pages show the
    commands only then), and otherwise who can, in words. With `job`: that Job (its requester, or the
    computer's owner with --all, each with a member or admin role in its project); without: the user's
    own Jobs of `project`, as on the New job form and the Jobs list."""
    owner = target.owner.get_username()
    usable = user.is_authenticated and computer_access.can_use(user, target)
    if job is not None:
        project = job.project
        site = SiteSettings.objects.filter(target=target).first()
        still = site is not None and waiting(site, JobStatus.WAITING_MANUAL).filter(pk=job.pk).exists()
        requester = job.created_by.get_username()
        if not still:
            return {"can_submit": False, "who_can": _(
                "Nobody can submit this Job now: %(name)s no longer lets %(requester)s use it (it is Private, or "
                "%(requester)s has not saved My settings). Its owner %(owner)s can make it Public again; otherwise "
                "stop this Job.") % {"name": target.name, "requester": requester, "owner": owner}}
        mine = job.created_by_id == user.pk or target.owner_id == user.pk
        if usable and mine and _may_write(user, project):
            return {"can_submit": True, "who_can": ""}
        if job.created_by_id == target.owner_id:
            who = _("Only %(owner)s, who requested it and owns %(name)s, can submit this Job, with their own API "
                    "token.") % {"owner": owner, "name": target.name}
        else:
            who = _("Only %(requester)s, who requested it, can submit this Job with their own API token, or "
                    "%(owner)s, the computer's owner, with --all.") % {"requester": requester, "owner": owner}
        return {"can_submit": False, "who_can": who}
    if not usable:
        return {"can_submit": False, "who_can": _(
            "%(name)s is Private: only Jobs of its owner %(owner)s (and of the service accounts %(owner)s created) "
            "are submitted there, by %(owner)s. Ask %(owner)s to make it Public, or choose another computer.")
            % {"name": target.name, "owner": owner}}
    if project is not None and not _may_write(user, project):
        return {"can_submit": False, "who_can": _(
            "Submitting Jobs of %(project)s takes the Member or Admin role there; the people who requested them "
            "submit them. Ask a project admin for the role.") % {"project": project.name}}
    return {"can_submit": True, "who_can": ""}


def _may_write(user, project) -> bool:
    """A member or admin of `project` now (global administrators are admins everywhere): who may hold a
    jobs:write token of it."""
    return identity.has_role(user, project, Role(SCOPE_MIN_ROLE[Scope.JOBS_WRITE]))


def in_callers_projects(jobs, user, project):
    """The Jobs a manual claim may take: those of the token's project (write tokens are issued per
    project), or, for a browser session (`project` None), those of the projects where the caller's
    current role may write Jobs (member or admin; global administrators are admins everywhere). Being
    the site's owner is never enough to receive another project's Jobs, their scripts and job tokens."""
    if project is not None:
        return jobs.filter(project=project)
    if identity.is_global_admin(user):
        return jobs
    minimum = ROLE_RANK[Role(SCOPE_MIN_ROLE[Scope.JOBS_WRITE])]
    roles = [role.value for role, rank in ROLE_RANK.items() if rank >= minimum]
    writable = Membership.objects.filter(user=user, role__in=roles).values("project_id")
    return jobs.filter(project_id__in=writable)


def _manual_site(user, target) -> SiteSettings:
    if identity.is_job_principal(user):
        raise Forbidden(_("Submitting Jobs takes your own API token, not a job token."), "job_token_forbidden")
    site = services.site_settings_of(target)
    if not computer_access.can_use(user, target):
        raise ServiceError(_("No site with this id that you can use."), "not_found", status=404)
    if site.submission != SubmissionMethod.MANUAL:
        raise Conflict(_("%(name)s submits automatically through its launcher; mado-tracking submit is for sites "
                         "that submit manually.") % {"name": target.name}, "site_not_manual")
    return site


def _claim(actor: Actor, site: SiteSettings, jobs, room: int, *, launcher: Launcher | None = None,
           submitted_by=None, work_dir: str | None = None, variables: dict | None = None) -> list[Batch]:
    """Take up to `room` Jobs (SKIP LOCKED) and group them: one requester and project with the same
    GPU count and time limit make one array. A cluster job is always submitted alone (its one batch
    job holds a node per replica)."""
    taken = list(jobs.select_for_update(skip_locked=True, of=("self",))
                 .select_related("project", "created_by", "target")[:CLAIM_SCAN])
    groups: dict[tuple, list[Job]] = {}
    for job in taken[:room]:
        key = (job.project_id, job.created_by_id, job.gpu_count or 0, job.walltime_seconds or DEFAULT_WALLTIME_SECONDS)
        if job.is_cluster:
            key = ("cluster", job.pk)
        groups.setdefault(key, []).append(job)
    batches = []
    for group in groups.values():
        batch = _submit_group(actor, site, group, launcher=launcher, submitted_by=submitted_by, work_dir=work_dir,
                              variables=variables)
        if batch is not None:
            batches.append(batch)
    return batches


def _submit_group(actor, site, jobs, *, launcher, submitted_by, work_dir, variables) -> Batch | None:
    target = site.target
    account_name, work_dir = _account(site, jobs[0].created_by_id, work_dir)
    try:
        script, shell = services.render_submission(target, jobs, work_dir=work_dir, extra_variables=variables)
    except ServiceError as exc:
        # A value the job shell refuses would refuse every later claim too: end these Jobs, with why.
        for job in jobs:
            _end(actor, job, JobStatus.FAILED, EndReason.SUBMIT_FAILED, error=f"Not submitted: {exc.message}")
        return None
    now = timezone.now()
    batch_id = uuid.uuid4()
    by = f"launcher {launcher.name}" if launcher else f"{submitted_by.username} with mado-tracking submit"
    rows, tokens = [], {}
    for index, job in enumerate(jobs):
        lifecycle.move(job, JobStatus.SUBMITTING, at=now, lease_id=uuid.uuid4())
        rows.append(Submission.objects.create(
            job=job, target=target, job_shell=shell, launcher=launcher, submitted_by=submitted_by, batch=batch_id,
            array_index=index, account_name=account_name, work_dir=work_dir, lease_id=job.lease_id, claimed_at=now))
        _token, tokens[job.pk] = identity_services.issue_job_token(job_id=job.pk, lease_id=job.lease_id,
                                                                   project=job.project, user=job.created_by)
        if job.is_cluster:
            # The site is every replica's computer; its scheduler picks the nodes (one per replica).
            JobReplica.objects.bulk_create([JobReplica(job=job, index=i, name=name, target=target, gpu_ids=[])
                                            for i, name in enumerate(job.replica_names)], ignore_conflicts=True)
        job_services._event(job, "claimed", f"Claimed by {by} (job shell version {shell.version})")
        audit(actor, "job.claim", job, project=job.project,
              after={"batch": str(batch_id), "launcher": launcher.name if launcher else None,
                     "job_shell_version": shell.version})
    return Batch(site=site, rows=rows, tokens=tokens, script=script)


def unreported(launcher: Launcher, site: SiteSettings):
    """Submissions of `site` this launcher claimed and never reported: its next claim adopts them, so
    its config counts them as claimable (and as free room: they already count as active)."""
    return Submission.objects.filter(launcher=launcher, target=site.target, status=SubmissionStatus.CLAIMED,
                                     job__status=JobStatus.SUBMITTING)


def _adopt(launcher: Launcher, site: SiteSettings, limit: int) -> list[Batch]:
    """This launcher's claims it never reported: the answer may have been lost, so they come back with
    new job tokens (the old ones end) and a script that looks for the scheduler job first."""
    rows = list(unreported(launcher, site).select_for_update(of=("self",))
                .select_related("job__project", "job__created_by", "job__target", "job_shell")
                .order_by("claimed_at", "batch", "array_index"))
    grouped: dict[uuid.UUID, list[Submission]] = {}
    for row in rows:
        grouped.setdefault(row.batch, []).append(row)
    batches, count, now = [], 0, timezone.now()
    for batch_rows in grouped.values():
        if count + len(batch_rows) > limit and batches:
            break
        count += len(batch_rows)
        jobs = [row.job for row in batch_rows]
        tokens = {}
        for row in batch_rows:
            identity_services.revoke_job_tokens(row.job_id)
            _token, tokens[row.job_id] = identity_services.issue_job_token(
                job_id=row.job_id, lease_id=row.lease_id, project=row.job.project, user=row.job.created_by)
        # A fresh report deadline: the launcher starts this submission again now.
        Submission.objects.filter(pk__in=[r.pk for r in batch_rows]).update(claimed_at=now)
        script, _shell = services.render_submission(site.target, jobs, job_shell=batch_rows[0].job_shell,
                                                    work_dir=batch_rows[0].work_dir or None, adopt=True)
        batches.append(Batch(site=site, rows=batch_rows, tokens=tokens, script=script, adopt=True))
    return batches


def _account(site: SiteSettings, user_id: int, work_dir: str | None) -> tuple[str, str]:
    """The account the submission logs in as, and the working directory its spec directories go under."""
    if site.submission == SubmissionMethod.MANUAL:
        return "", work_dir or site.working_dir
    if site.uses_personal_accounts:
        mine = SiteUserSettings.objects.get(target=site.target, user_id=user_id)
        return mine.account_name, work_dir or mine.working_dir or site.working_dir
    return site.ssh_user, work_dir or site.working_dir


def submission_body(batch: Batch) -> dict:
    rows, site = batch.rows, batch.site
    first = rows[0]
    requester = first.job.created_by
    work_dir = first.work_dir or site.working_dir
    return {
        "batch": str(first.batch), "computer": site.target_id, "job_ids": [row.job_id for row in rows],
        "job_name": f"mmt-{first.job_id}", "adopt": batch.adopt,
        "user": {"id": requester.pk, "username": requester.username}, "account_name": first.account_name,
        "working_dir": work_dir, "spec_root": f"{work_dir.rstrip('/')}/{services.SPEC_ROOT}",
        "runner_python": site.runner_python, "api_url": site.runner_api_url,
        "job_shell_version": first.job_shell.version, "script": batch.script,
        "jobs": [{"id": row.job_id, "spec_dir": services.spec_dir_for(work_dir, row.job_id),
                  "token": batch.tokens[row.job_id], "job": runner_job_payload(row.job, batch.tokens[row.job_id], site)}
                 for row in rows],
    }


def submission_summary(job: Job, user=None) -> dict | None:
    """What a Job's details show of its submission to a site (None on other computers): the scheduler's
    job id people look for in squeue/qstat, where its runner started, who submitted it (`launcher`, or
    `submitted_by` for mado-tracking submit) and, for `user` when they may read it (failure_detail), the
    launcher's or scheduler's own message of a failed submission (`error`, line breaks kept)."""
    row = Submission.objects.filter(job_id=job.pk).select_related("job_shell", "launcher", "submitted_by").first()
    if row is None:
        return None
    summary = {"status": row.status, "scheduler_job_id": row.scheduler_job_id or None,
               "job_shell_version": row.job_shell.version, "array_index": row.array_index,
               "reported_at": row.reported_at, "runner_hostname": row.runner_hostname or None,
               "runner_started_at": row.runner_started_at,
               "launcher": row.launcher.name if row.launcher_id else None,
               "submitted_by": row.submitted_by.get_username() if row.submitted_by_id else None}
    if user is not None:
        summary["error"] = failure_detail(user, job) or None
    if job.is_cluster:
        # Where each replica's runner started (main1's is runner_hostname as well).
        runners = row.replica_runners or {}
        summary["replica_runners"] = [{"replica": name, "hostname": (runners.get(name) or {}).get("hostname"),
                                       "started_at": (runners.get(name) or {}).get("started_at")}
                                      for name in job.replica_names]
    return summary


# What a failed submission says, and to whom ---------------------------------------------------------
#
# The launcher reports a failed submission with its own message: a login's failure (which may say
# whether a port is closed or speaks SSH, or which host key a server shows: only global administrators
# read those, as for connection checks) or the job shell's stderr on the login node (the scheduler's
# refusal, which the computer's owner fixes in the job shell or the variables). The Job's error is
# written for everyone who sees the Job; the message itself stays in Submission.error and the audit.

def failure_for_users(row: Submission, detail: str) -> str:
    """The Job's error after a failed submission: what happened and what the reader can do."""
    site = row.target.site_settings
    version = row.job_shell.version if row.job_shell_id else "?"
    if site.submission == SubmissionMethod.MANUAL:
        who = row.submitted_by.get_username() if row.submitted_by_id else "mado-tracking submit"
        return (f"Not submitted: the job shell (version {version}) failed when {who} ran mado-tracking submit, "
                f"which printed its message there; the computer's owner and global administrators can read it on "
                "this page. Check the Job's GPUs and time limit and the variables given with --var, then run the "
                "Job again.")
    reason = allowed_hosts.login_reason(detail)
    if allowed_hosts.reveals_network(detail):
        account = f" as {row.account_name}" if row.account_name else ""
        return (f"Not submitted: the launcher could not log in to {site.host}:{site.port}{account}. The computer's "
                "owner checks its host, port, jump hosts and known_hosts with Check connection; global "
                "administrators can read the launcher's message.")
    if allowed_hosts.user_fixable(reason):
        return f"Not submitted: {reason}"
    return (f"Not submitted: the site's scheduler or the job shell (version {version}) refused the Job; the "
            "computer's owner and global administrators can read its message on this page. Check the Job's GPUs "
            "and time limit, the computer's variables and your My settings with the computer's owner, then run the "
            "Job again.")


def failure_detail(user, job: Job) -> str:
    """The launcher's or scheduler's own message of a failed submission, for those who may read it ("" for
    the others): global administrators always; on a manual site the person whose mado-tracking submit
    reported it; the computer's owner unless it is about the network behind the launcher."""
    if user is None or not user.is_authenticated:
        return ""
    row = (Submission.objects.filter(job_id=job.pk, status__in=[SubmissionStatus.FAILED, SubmissionStatus.NOT_TRIED])
           .select_related("target__site_settings").first())
    if row is None or not row.error:
        return ""
    if allowed_hosts.sees_launcher_messages(user):
        return row.error
    if identity.is_job_principal(user) or identity.is_service_user(user):
        return ""
    if row.target.site_settings.submission == SubmissionMethod.MANUAL and row.submitted_by_id == user.pk:
        return row.error
    if row.target.owner_id == user.pk and not allowed_hosts.reveals_network(row.error):
        return row.error
    return ""


def job_error_for(user, job: Job) -> str:
    """The error a Job's page shows `user`: after a failed submission, the launcher's or scheduler's own
    message (line breaks kept) to those who may read it (failure_detail), else the Job's error, which
    says what happened and who can read that message."""
    if job.end_reason != EndReason.SUBMIT_FAILED:
        return job.error
    return failure_detail(user, job) or job.error


def runner_job_payload(job: Job, token: str | None, site: SiteSettings) -> dict:
    """The worker's claim object, addressed to the runner: the site's API URL and the runner's source path."""
    payload = worker_job_payload(job, token)
    payload["api_url"] = site.runner_api_url
    if isinstance(payload.get("source"), dict) and payload["source"].get("download"):
        payload["source"] = {**payload["source"], "download": f"/api/runner/jobs/{job.pk}/source"}
    return payload


# Reports ------------------------------------------------------------------------------------------

def report(actor: Actor, data: dict, *, launcher: Launcher | None = None, submitted_by=None, target=None) -> list[dict]:
    """The outcome of submitting Jobs: `submitted` (with the scheduler's id), `failed` (the masked stderr
    tail) or `not_tried` (a failed login). The same report resent is answered again, unchanged."""
    job_ids, outcome, scheduler_id, error = _clean_report(data)
    expire_overdue()
    with transaction.atomic():
        jobs = {job.pk: job for job in Job.objects.select_for_update(of=("self",)).select_related("project", "target")
                .filter(pk__in=job_ids).order_by("pk")}
        rows = Submission.objects.select_for_update(of=("self",)).filter(job_id__in=job_ids)
        rows = rows.filter(launcher=launcher) if launcher is not None else rows.filter(submitted_by=submitted_by,
                                                                                       target=target)
        rows = {row.job_id: row for row in rows.select_related("target__site_settings")}
        unknown = [i for i in job_ids if i not in rows]
        if unknown:
            raise ServiceError(f"Jobs {', '.join(map(str, unknown))} were not claimed by you; report only the "
                               "job_ids of your claims.", "submission_not_found", status=404,
                               fields={"job_ids": ["Unknown claims."]})
        for job_id in job_ids:
            _apply_report(actor, rows[job_id], jobs[job_id], outcome, scheduler_id, error)
    notify(job_services.JOBS_CHANNEL)
    return [{"id": i, "status": jobs[i].status} for i in job_ids]


def _clean_report(data: dict):
    ids = data.get("job_ids")
    if (not isinstance(ids, list) or not 1 <= len(ids) <= MAX_CLAIM
            or any(as_int(i, low=1, high=BIGINT_MAX) is None or isinstance(i, (bool, str)) for i in ids)
            or len(set(ids)) != len(ids)):
        raise ServiceError(f"job_ids is a list of 1–{MAX_CLAIM} different Job ids from the claim.", "invalid",
                           fields={"job_ids": ["Invalid list."]})
    outcome = data.get("outcome")
    if outcome not in OUTCOMES:
        raise ServiceError("outcome is submitted, failed or not_tried.", "invalid", fields={"outcome": ["Invalid."]})
    scheduler_id = data.get("scheduler_job_id") or ""
    if scheduler_id and (not isinstance(scheduler_id, str) or not shells.SCHEDULER_ID.fullmatch(scheduler_id)):
        raise ServiceError("scheduler_job_id is the id the job shell printed (letters, digits, . _ : - [ ], at most "
                           "200).", "invalid", fields={"scheduler_job_id": ["Invalid id."]})
    error = _error_text(data)
    if outcome != "submitted" and not error.strip():
        error = "The job shell failed without a message." if outcome == "failed" else "Not tried."
    return [int(i) for i in ids], outcome, scheduler_id, shells.stderr_tail(error)


def _apply_report(actor, row: Submission, job: Job, outcome: str, scheduler_id: str, error: str) -> None:
    status = OUTCOMES[outcome]
    if row.status != SubmissionStatus.CLAIMED:
        if row.status == status and (outcome != "submitted" or row.scheduler_job_id == scheduler_id):
            return  # the same report resent after a lost answer
        raise Conflict(f"Job {job.pk} was already reported as {row.status}; a report is sent once.",
                       "submission_already_reported")
    row.status, row.reported_at = status, timezone.now()
    if outcome == "submitted":
        row.scheduler_job_id = scheduler_id
        row.save(update_fields=["status", "reported_at", "scheduler_job_id"])
        if job.status == JobStatus.SUBMITTING:
            lifecycle.move(job, JobStatus.SUBMITTED)
            job_services._event(job, "submitted", f"Submitted to the scheduler as {scheduler_id}" if scheduler_id
                                else "Submitted (no scheduler job id: the runner starts directly)")
            if job.stop_requested_at is not None:
                _stop_submitted(actor, row, job)
        elif job.is_terminal and scheduler_id:
            # Reported after the Job ended (it timed out waiting for this report): keep it from running.
            _queue_cancellation(row, job)
    else:
        # The launcher's or the scheduler's own words stay with the submission (and the audit): the
        # Job's error, which everyone who sees the Job reads, says what went wrong and who can fix it.
        row.error = error
        row.save(update_fields=["status", "reported_at", "error"])
        if job.status == JobStatus.SUBMITTING:
            _end(actor, job, JobStatus.FAILED, EndReason.SUBMIT_FAILED, error=failure_for_users(row, error))
    audit(actor, "job.submission.report", job, project=job.project,
          after={"outcome": outcome, "scheduler_job_id": scheduler_id or None,
                 **({"error": error} if outcome != "submitted" else {})})


# Stop and cancellations ---------------------------------------------------------------------------

def stop(actor: Actor, job: Job) -> None:
    """A stop of a Job in a site's hands (called with the Job row locked). A submitted Job with a
    scheduler id on a launcher site gets a cancellation; one no runner can reach yet ends now; a Job
    being submitted waits for its report; a started runner hears it in its next heartbeat."""
    row = Submission.objects.select_for_update(of=("self",)).select_related("target__site_settings").filter(
        job=job).first()
    if row is not None and job.status == JobStatus.SUBMITTED:
        _stop_submitted(actor, row, job)


def _stop_submitted(actor, row: Submission, job: Job) -> None:
    automatic = row.target.site_settings.submission == SubmissionMethod.AUTOMATIC
    if automatic and row.launcher_id and row.scheduler_job_id and not _batch_runs_on(row):
        _queue_cancellation(row, job)
    else:
        # Its token is revoked: a runner that starts later is refused and exits.
        _end(actor, job, JobStatus.CANCELED, EndReason.CANCELED)


def _batch_runs_on(row: Submission) -> bool:
    """Other Jobs of the same array still to run: canceling the scheduler job would end them too."""
    return (Submission.objects.filter(batch=row.batch).exclude(pk=row.pk)
            .filter(job__status__in=SITE_ACTIVE_STATUSES, job__stop_requested_at__isnull=True).exists())


def _queue_cancellation(row: Submission, job: Job) -> None:
    if row.cancel_state:
        return
    row.cancel_state = CancelState.QUEUED
    row.cancel_requested_at = timezone.now()
    row.save(update_fields=["cancel_state", "cancel_requested_at"])
    job_services._event(job, "cancel_queued", f"Cancellation of {row.scheduler_job_id} queued for the launcher")
    notify(SITES_CHANNEL)


def cancellations(launcher: Launcher) -> list[dict]:
    """Queued cancellations for the launcher, one per scheduler job (an array's Jobs share one)."""
    rows = (Submission.objects.filter(launcher=launcher, cancel_state=CancelState.QUEUED)
            .select_related("target__site_settings", "job_shell", "job").order_by("job_id"))
    items, seen = [], set()
    for row in rows:
        key = (row.target_id, row.scheduler_job_id)
        if key in seen:
            continue
        seen.add(key)
        site = row.target.site_settings
        personal = site.uses_personal_accounts
        mine = (SiteUserSettings.objects.filter(target=row.target, user_id=row.job.created_by_id).first()
                if personal else None)
        try:
            script = services.render_cancellation(row.target, row.job_shell, row.scheduler_job_id,
                                                  variables=mine.variables if mine else None)
        except ServiceError:
            continue  # an id no job shell prints never reaches here; nothing to run for it
        items.append({"job_id": row.job_id, "computer": row.target_id, "scheduler_job_id": row.scheduler_job_id,
                      "user": row.job.created_by_id if personal else None, "account_name": row.account_name,
                      "script": script})
    return items


def report_cancellation(launcher: Launcher, data: dict) -> dict:
    job_id = as_int(data.get("job_id"), low=1, high=BIGINT_MAX)
    ok = data.get("ok")
    if job_id is None or isinstance(data.get("job_id"), (bool, str)) or not isinstance(ok, bool):
        raise ServiceError("Send {job_id, ok: true|false, error?} for a cancellation from the config.", "invalid",
                           fields={"job_id": ["A Job id."], "ok": ["true or false."]})
    error = _error_text(data)
    first = Submission.objects.filter(job_id=job_id, launcher=launcher).exclude(cancel_state="").first()
    if first is None:
        raise ServiceError("No cancellation of this Job was asked of this launcher.", "cancellation_not_found",
                           status=404)
    with transaction.atomic():
        same = Q(batch=first.batch, scheduler_job_id=first.scheduler_job_id, launcher=launcher)
        jobs = {j.pk: j for j in Job.objects.select_for_update(of=("self",)).select_related("project", "target")
                .filter(submission__in=Submission.objects.filter(same)).order_by("pk")}
        rows = list(Submission.objects.select_for_update(of=("self",)).filter(same, cancel_state=CancelState.QUEUED))
        now = timezone.now()
        for row in rows:
            row.cancel_state = CancelState.DONE if ok else CancelState.FAILED
            row.cancel_error = "" if ok else shells.stderr_tail(error or "The cancel script failed without a message.")
            row.cancel_reported_at = now
            row.save(update_fields=["cancel_state", "cancel_error", "cancel_reported_at"])
            job = jobs[row.job_id]
            if ok and row.runner_started_at is None and job.status in (JobStatus.SUBMITTING, JobStatus.SUBMITTED):
                _end(SYSTEM, job, JobStatus.CANCELED, EndReason.CANCELED)
            elif not ok and not job.is_terminal:
                # The timeline is read by everyone who sees the Job: the launcher's login messages stay out.
                shown = ("the launcher could not log in (global administrators can read its message on the "
                         "submission in Django admin)" if allowed_hosts.reveals_network(row.cancel_error)
                         else row.cancel_error)
                job_services._event(job, "cancel_failed", f"The scheduler did not cancel it: {shown}")
    first.refresh_from_db()
    return {"job_id": job_id, "cancel_state": first.cancel_state, "status": Job.objects.get(pk=job_id).status}


# The runner ---------------------------------------------------------------------------------------
#
# A cluster job has one runner per replica, all holding the Job's one job token: each starts with its
# `replica` and is kept in Submission.replica_runners, so runner_conflict means the same replica
# twice; every later call finds its replica by runner_id. The Job ends when main1 ends or a sub fails
# (docs/cluster-jobs.md, "End"); the token goes with it, so the other runners meet 401 and stop. A sub
# that exits 0 is recorded as ended, and every cluster heartbeat answers which subs have not ended:
# main1's runner waits for them (REPLICA_WAIT_SECONDS at most) before its finish ends the Job.

@dataclass
class RunnerCall:
    job: Job
    row: Submission
    runner_id: uuid.UUID
    replica: str  # main1 for an ordinary Job; "" for a cluster job's runner not started yet


def _runner_locked(job_id: int, runner_id, *, starting: bool = False, ended_ok: bool = False) -> RunnerCall:
    runner_id = _uuid(runner_id)
    job = (Job.objects.select_for_update(of=("self",)).select_related("project", "target", "created_by")
           .filter(pk=job_id).first())
    if job is None:
        raise ServiceError("No such Job.", "not_found", status=404)
    row = Submission.objects.select_for_update(of=("self",)).select_related("target__site_settings").filter(
        job=job).first()
    if row is None:
        raise Conflict("This Job was not submitted to a site; only a site's runner uses these endpoints.",
                       "not_a_site_job")
    if job.is_terminal and not ended_ok:
        raise Conflict(f"This Job already ended ({job.status}); stop the runner.", "job_ended")
    if job.is_cluster:
        replica = _replica_of(row, runner_id)
        if not replica and not starting and not job.is_terminal:
            raise Conflict("Call start with your replica first: no replica of this Job has this runner_id.",
                           "runner_not_started")
        return RunnerCall(job, row, runner_id, replica)
    if row.runner_id is None and not starting and not job.is_terminal:
        raise Conflict("Call start first: this Job has no runner yet.", "runner_not_started")
    if row.runner_id is not None and row.runner_id != runner_id:
        raise Conflict("Another runner already runs this Job; this one stops.", "runner_conflict")
    return RunnerCall(job, row, runner_id, MAIN_REPLICA)


def _replica_of(row: Submission, runner_id: uuid.UUID) -> str:
    return next((name for name, entry in (row.replica_runners or {}).items()
                 if entry.get("runner_id") == str(runner_id)), "")


def runner_start(job_id: int, data: dict) -> Job:
    """The runner on the compute node begins: the Job waits for its resources (venv, image)."""
    expire_overdue()
    hostname = data.get("hostname") or ""
    if not isinstance(hostname, str) or len(hostname) > 255:
        raise ServiceError("hostname is the compute node's name (≤ 255 characters).", "invalid",
                           fields={"hostname": ["Invalid."]})
    scheduler_id = data.get("scheduler_job_id") or ""
    if scheduler_id and (not isinstance(scheduler_id, str) or not shells.SCHEDULER_ID.fullmatch(scheduler_id)):
        raise ServiceError("scheduler_job_id holds letters, digits and . _ : - [ ] only.", "invalid",
                           fields={"scheduler_job_id": ["Invalid id."]})
    with transaction.atomic():
        call = _runner_locked(job_id, data.get("runner_id"), starting=True)
        job, row, runner_id = call.job, call.row, call.runner_id
        if job.is_cluster:
            return _start_replica(call, data.get("replica"), hostname, scheduler_id)
        if data.get("replica") not in (None, "", MAIN_REPLICA):
            raise ServiceError("This Job is not a cluster job: its only replica is main1.", "invalid",
                               fields={"replica": ["main1 or absent."]})
        if row.runner_id is not None:
            return job  # the same runner's start resent
        now = timezone.now()
        row.runner_id, row.runner_hostname, row.runner_started_at = runner_id, hostname, now
        fields = ["runner_id", "runner_hostname", "runner_started_at"]
        if scheduler_id and not row.scheduler_job_id:
            row.scheduler_job_id = scheduler_id
            fields.append("scheduler_job_id")
        row.save(update_fields=fields)
        lifecycle.move(job, JobStatus.WAITING_RESOURCES, heartbeat_at=now)
        job_services._event(job, "runner_started", f"Runner started on {hostname or 'the compute node'}")
    return job


def _start_replica(call: RunnerCall, replica, hostname: str, scheduler_id: str) -> Job:
    """One replica's runner of a cluster job: the first start moves the Job to waiting_resources."""
    job, row = call.job, call.row
    names = job.replica_names
    if replica not in names:
        raise ServiceError(f"replica is the one this runner runs: {', '.join(names[:8])}"
                           + (" …" if len(names) > 8 else "") + " (the job shell starts one runner per replica, "
                           "each learning its index from SLURM_PROCID).", "invalid",
                           fields={"replica": ["One of the Job's replicas."]})
    mine = (row.replica_runners or {}).get(replica)
    if mine and mine.get("runner_id") == str(call.runner_id):
        return job  # the same runner's start resent
    if mine or call.replica:
        taken = replica if mine else call.replica
        raise Conflict(f"Another runner already runs {taken} of this Job; this one stops.", "runner_conflict")
    now = timezone.now()
    row.replica_runners = {**(row.replica_runners or {}),
                           replica: {"runner_id": str(call.runner_id), "hostname": hostname,
                                     "started_at": now.isoformat()}}
    fields = ["replica_runners"]
    if replica == MAIN_REPLICA:
        row.runner_id, row.runner_hostname = call.runner_id, hostname
        fields += ["runner_id", "runner_hostname"]
    if row.runner_started_at is None:
        row.runner_started_at = now
        fields.append("runner_started_at")
    if scheduler_id and not row.scheduler_job_id:
        row.scheduler_job_id = scheduler_id
        fields.append("scheduler_job_id")
    row.save(update_fields=fields)
    if lifecycle.can_move(job, JobStatus.WAITING_RESOURCES):  # the first replica's start: submitting or submitted
        lifecycle.move(job, JobStatus.WAITING_RESOURCES, heartbeat_at=now)
    else:
        job.heartbeat_at = now
        job.save(update_fields=["heartbeat_at"])
    job_services._event(job, "runner_started", f"Runner of {replica} started on {hostname or 'a compute node'}")
    return job


def runner_heartbeat(job_id: int, data: dict) -> Job:
    expire_overdue()
    status = data.get("status")
    if status not in (None, JobStatus.RUNNING):
        raise ServiceError("status in a heartbeat is only 'running'.", "invalid", fields={"status": ["running"]})
    with transaction.atomic():
        call = _runner_locked(job_id, data.get("runner_id"))
        job = call.job
        now = timezone.now()
        running = status == JobStatus.RUNNING
        if running and job.is_cluster:
            running = _replica_running(call, now)
        lifecycle.heartbeat(job, now, running=running,
                            started=f"Started: all {job.cluster_size} replicas run" if job.is_cluster else "Started")
    return job


def replicas_running(job: Job) -> list[str]:
    """The subs of a cluster Job that have not reported their end (started or not), in order."""
    row = Submission.objects.filter(job=job).only("replica_runners").first()
    runners = (row.replica_runners if row else None) or {}
    return [name for name in job.replica_names[1:] if not (runners.get(name) or {}).get("ended")]


def _replica_running(call: RunnerCall, now) -> bool:
    """Note that this replica's code runs; True once every replica's does (then the Job runs)."""
    row = call.row
    entry = row.replica_runners[call.replica]
    if not entry.get("running_at"):
        row.replica_runners = {**row.replica_runners, call.replica: {**entry, "running_at": now.isoformat()}}
        row.save(update_fields=["replica_runners"])
    return all((row.replica_runners.get(name) or {}).get("running_at") for name in call.job.replica_names)


def runner_logs(job_id: int, data: dict) -> int:
    with transaction.atomic():
        call = _runner_locked(job_id, data.get("runner_id"))
        chunks = data.get("chunks")
        if call.job.is_cluster and isinstance(chunks, list):
            chunks = [_own_replica(chunk, call.replica) for chunk in chunks]
        return job_services.append_logs(call.job, chunks)


def _own_replica(chunk, replica: str):
    """A runner's chunk is its own replica's: `replica` may be left out, and may not name another."""
    if not isinstance(chunk, dict):
        return chunk  # append_logs says what a chunk is
    if chunk.get("replica") not in (None, "", replica):
        raise ServiceError(f"This runner runs {replica}; it sends only {replica}'s logs.", "invalid",
                           fields={"chunks": ["Another replica's chunk."]})
    return {**chunk, "replica": replica}


def runner_metrics(job_id: int, data: dict) -> int:
    with transaction.atomic():
        call = _runner_locked(job_id, data.get("runner_id"))
        return job_services.add_metrics(call.job, data.get("metrics"))


def runner_outputs(job_id: int, data: dict) -> list[str]:
    with transaction.atomic():
        job = _main_replica(_runner_locked(job_id, data.get("runner_id")))
        # The runner declares what the requester may: the scopes a personal token of theirs could hold.
        scopes = frozenset(identity_services.allowed_scopes(job.created_by, job.project, "personal"))
        return outputs.record_outputs(job, result_text=data.get("result"), files=data.get("files"),
                                      manifest_text=data.get("manifest"), token_scopes=scopes)


def _main_replica(call: RunnerCall) -> Job:
    if call.replica != MAIN_REPLICA:
        raise Conflict(f"Only main1's outputs are collected; the runner of {call.replica} sends none.",
                       "replica_outputs")
    return call.job


def runner_job(job_id: int, runner_id, *, uploading: bool = False) -> Job:
    """The Job of a runner's binary call (an artifact upload, main1's only; the source download),
    checked and unlocked."""
    with transaction.atomic():
        call = _runner_locked(job_id, runner_id)
        job = _main_replica(call) if uploading else call.job
    return job


# What a runner may say about how its Job ended; the deadlines (submit_failed, queue_timeout) and the
# loss of an executor (worker_lost) are the server's to decide, input_failed the worker's.
RUNNER_END_REASONS = (EndReason.EXIT_CODE, EndReason.TIMED_OUT, EndReason.CANCELED, EndReason.START_FAILED,
                      EndReason.INVALID_RESULT, EndReason.REPLICA_FAILED)


def runner_finish(job_id: int, data: dict) -> Job:
    status = data.get("status")
    reason = data.get("end_reason")
    if reason is not None and reason not in RUNNER_END_REASONS:
        raise ServiceError(f"A runner ends a Job with end_reason {', '.join(RUNNER_END_REASONS)} (or none).",
                           "invalid", fields={"end_reason": ["Not a runner's end reason."]})
    exit_code = job_services.clean_completion(status, data.get("exit_code"), data.get("end_reason"))
    error = _error_text(data)
    with transaction.atomic():
        call = _runner_locked(job_id, data.get("runner_id"), ended_ok=True)
        job = call.job
        if job.is_terminal:
            if job.status == status:
                return job  # the same finish resent
            raise Conflict(f"This Job already ended as {job.status}.", "job_already_completed")
        end = _JobEnd(status, exit_code, data.get("end_reason"), error, "")
        if job.is_cluster:
            end = _replica_end(call, end)
            if end is None:
                return job  # a sub is done; the Job runs on until main1 ends
        reason = job_services.finish_completed(job, end.status, exit_code=end.exit_code,
                                               error=shells.stderr_tail(end.error), end_reason=end.reason,
                                               replica=end.replica)
        audit(SYSTEM, "job.complete", job, project=job.project,
              after={"status": end.status, "end_reason": reason, "exit_code": end.exit_code,
                     "runner": str(call.runner_id), **({"replica": end.replica} if end.replica else {})})
    notify(job_services.JOBS_CHANNEL)
    return job


@dataclass
class _JobEnd:
    status: str
    exit_code: int | None
    reason: str | None
    error: str
    replica: str


def _replica_end(call: RunnerCall, end: _JobEnd) -> _JobEnd | None:
    """How one replica's end ends its cluster Job; None when it does not (a sub that exited 0). A stop
    and the time limit are the whole Job's (no replica named); main1's end is the Job's; a sub's
    failure fails the Job naming it."""
    name = call.replica
    if end.status == JobStatus.CANCELED or end.reason == EndReason.TIMED_OUT:
        return end
    if name == MAIN_REPLICA:
        end.replica = name
        return end
    if end.status == JobStatus.FINISHED:
        row = call.row
        row.replica_runners = {**row.replica_runners, name: {**row.replica_runners[name], "ended": end.status}}
        row.save(update_fields=["replica_runners"])
        job_services._event(call.job, "replica_ended", f"{name} finished (exit code 0); the Job runs until main1 ends")
        return None
    reason = EndReason.START_FAILED if end.reason == EndReason.START_FAILED else EndReason.REPLICA_FAILED
    error = end.error or (f"{name} exited with code {end.exit_code}" if end.exit_code is not None
                          else f"{name} failed")
    return _JobEnd(JobStatus.FAILED, end.exit_code, reason, error, name)


# Timeouts -----------------------------------------------------------------------------------------

def expire_overdue(*, force: bool = False) -> int:
    """`submitting` without a report for 15 minutes → failed submit_failed; `submitted` without a
    runner within the site's queue timeout → failed queue_timeout (and the scheduler job canceled).
    At most once a second per process: launchers, runners and job pages all call it."""
    global _last_expiry
    if not force and time.monotonic() - _last_expiry < EXPIRY_INTERVAL_SECONDS:
        return 0
    _last_expiry = time.monotonic()
    now = timezone.now()
    ended = 0
    late = Job.objects.filter(status=JobStatus.SUBMITTING, submission__status=SubmissionStatus.CLAIMED,
                              submission__claimed_at__lt=now - timedelta(seconds=SUBMIT_REPORT_TIMEOUT))
    for job_id in late.values_list("pk", flat=True):
        ended += _expire(job_id, JobStatus.SUBMITTING, EndReason.SUBMIT_FAILED,
                         f"No submission report arrived within {SUBMIT_REPORT_TIMEOUT // 60} minutes: the launcher "
                         "or mado-tracking submit stopped while submitting. Check the scheduler for a job named "
                         "mmt-<Job id> and cancel it if it is there.")
    for site in SiteSettings.objects.filter(target__jobs__status=JobStatus.SUBMITTED).distinct():
        cutoff = now - timedelta(seconds=site.queue_timeout_seconds)
        waiting_too_long = Job.objects.filter(target_id=site.target_id, status=JobStatus.SUBMITTED).filter(
            Q(submission__reported_at__lt=cutoff)
            | Q(submission__reported_at__isnull=True, submission__claimed_at__lt=cutoff))
        for job_id in waiting_too_long.values_list("pk", flat=True):
            ended += _expire(job_id, JobStatus.SUBMITTED, EndReason.QUEUE_TIMEOUT,
                             f"No runner started within the queue timeout ({site.queue_timeout_seconds} s): the "
                             "scheduler kept it waiting, or the runner could not reach this server.")
    return ended


def _expire(job_id: int, status: str, reason: str, error: str) -> int:
    with transaction.atomic():
        job = (Job.objects.select_for_update(skip_locked=True, of=("self",)).select_related("project", "target")
               .filter(pk=job_id, status=status).first())
        if job is None:
            return 0  # moved on meanwhile, or someone holds it right now (next round)
        _end(SYSTEM, job, JobStatus.FAILED, reason, error=error)
        row = Submission.objects.select_for_update(of=("self",)).select_related("target__site_settings").filter(
            job=job).first()
        if (reason == EndReason.QUEUE_TIMEOUT and row is not None and row.launcher_id and row.scheduler_job_id
                and row.target.site_settings.submission == SubmissionMethod.AUTOMATIC and not _batch_runs_on(row)):
            _queue_cancellation(row, job)
    return 1


# helpers ------------------------------------------------------------------------------------------

def _end(actor: Actor, job: Job, status: str, reason: str, *, error: str = "") -> None:
    job_services._finish(job, status, reason, error=error)
    audit(actor, "job.complete", job, project=job.project,
          after={"status": status, "end_reason": reason, "exit_code": None})
    notify(job_services.JOBS_CHANNEL)


def _limit(raw) -> int:
    if raw is None:
        return MAX_CLAIM
    limit = as_int(raw, low=1, high=MAX_CLAIM)
    if limit is None or isinstance(raw, (bool, str)):
        raise ServiceError(f"limit is a whole number from 1 to {MAX_CLAIM}.", "invalid", fields={"limit": ["1–50."]})
    return limit


def _flag(raw, name: str) -> bool:
    if raw in (None, False, True):
        return bool(raw)
    raise ServiceError(f"{name} is true or false.", "invalid", fields={name: ["true or false."]})


def _error_text(data: dict) -> str:
    error = data.get("error") or ""
    if not isinstance(error, str):
        raise ServiceError("error is text.", "invalid", fields={"error": ["Text expected."]})
    return error


def _uuid(raw) -> uuid.UUID:
    try:
        return uuid.UUID(str(raw)) if isinstance(raw, str) else uuid.UUID("")
    except ValueError:
        raise ServiceError("runner_id is the uuid the runner made when it started; send it with every call.",
                           "invalid", fields={"runner_id": ["A uuid."]}) from None
