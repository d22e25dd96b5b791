"""State changes of sites (seed 003, DESIGN §8). Each runs in one transaction and writes an AuditEvent.

Site computers are ComputeTarget rows of kind `site` with one SiteSettings; their job shells are
versioned JobShell rows; people on sites that use their own account keep SiteUserSettings."""
from __future__ import annotations

import re
from functools import partial
from urllib.parse import urlsplit

from django.db import IntegrityError, transaction
from django.utils.translation import gettext as _

from computers import access
from computers.choices import CpuArch, Kind, Runtime
from computers.models import ComputeTarget
from computers.services import clean_name_and_visibility
from mado import access as identity
from mado.errors import Conflict, Forbidden, ServiceError
from mado.services import Actor, audit
from mado.validation import BIGINT_MAX, as_int, int_field
from sites import allowed_hosts
from sites import known_hosts as kh
from sites import shells
from sites.choices import (
    DEFAULT_MAX_ACTIVE_SUBMISSIONS,
    DEFAULT_QUEUE_TIMEOUT,
    DEFAULT_WALLTIME_SECONDS,
    MAX_ACTIVE_SUBMISSIONS,
    MAX_JUMP_HOSTS,
    MAX_KNOWN_HOSTS_BYTES,
    MAX_QUEUE_TIMEOUT,
    MIN_QUEUE_TIMEOUT,
    AccountKind,
    SubmissionMethod,
    Template,
)
from sites.models import JobShell, Launcher, SiteSettings, SiteUserSettings

# Site fields come from forms and JSON clients alike: 22.0 is 22.
_whole = partial(int_field, whole_floats=True)

HOST_PATTERN = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?$|^[0-9A-Fa-f:]{2,39}$")
ACCOUNT_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
JUMP_HOST_PATTERN = re.compile(r"^(?:(?P<user>[A-Za-z0-9_][A-Za-z0-9_.-]{0,63})@)?(?P<host>[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:]{2,39}\])"
                               r"(?::(?P<port>[0-9]{1,5}))?$")
SPEC_ROOT = ".mmt-submissions"
RUNNER_NAME = "mmt-runner"

# Job statuses that hold a site: queued plus the site phases before and during the run.
ACTIVE_JOB_STATUSES = ["queued", "claimed", "running", "waiting_manual", "submitting", "submitted",
                       "waiting_resources"]

TARGET_FIELDS = ["name", "visibility", "enabled", "runtimes", "cpu_arch"]
SETTINGS_FIELDS = ["submission", "account", "launcher", "host", "port", "ssh_user", "jump_hosts", "known_hosts",
                   "working_dir", "runner_python", "runner_api_url", "variables", "max_active_submissions",
                   "queue_timeout_seconds"]
EDITABLE_FIELDS = TARGET_FIELDS + SETTINGS_FIELDS
# What queued or running Jobs depend on: unchanged while they exist (409), as for other computers.
LOCKED_FIELDS = ["submission", "account", "launcher", "host", "port", "ssh_user", "jump_hosts", "known_hosts",
                 "working_dir", "runtimes"]
# Where the launcher logs in: checked against its allowed hosts on create and whenever one changes.
DESTINATION_FIELDS = ["submission", "launcher", "host", "jump_hosts"]


# Sites ------------------------------------------------------------------------------------------

def create_site(actor: Actor, data: dict) -> ComputeTarget:
    """Add a site computer (anyone signed in). The creator owns it; Private unless asked otherwise.
    The job shell starts as version 1: the chosen template, or the given content."""
    user = actor.user
    if user is None or not access.can_add(user, Kind.SITE):
        raise Forbidden(_("Sign in to add a computer."), "not_authenticated", status=401)
    if identity.is_service_user(user):
        raise Forbidden(_("Service accounts cannot add computers; a person adds the site and owns it."),
                        "service_account_cannot_add")
    if not isinstance(data, dict):
        raise ServiceError(_("Send the site's fields as an object."), "invalid_site")
    unknown = sorted(set(data) - set(EDITABLE_FIELDS) - {"template", "job_shell", "kind"})
    if unknown:
        raise ServiceError(_("Unknown fields: %(fields)s.") % {"fields": ", ".join(unknown)}, "unknown_fields",
                           fields={name: [_("Unknown field.")] for name in unknown})
    if data.get("kind") not in (None, "", Kind.SITE):
        raise ServiceError(_("This form adds sites only; SSH and Local computers are added as those types."),
                           "invalid_site", fields={"kind": [_("Must be site.")]})
    errors: dict[str, list[str]] = {}
    content, template = _initial_job_shell(data, errors)
    target_values, settings_values = _clean({**data, "template": template}, errors, current=None)
    _check_destination(settings_values, errors)
    if errors:
        raise _invalid(errors)
    with transaction.atomic():
        target = ComputeTarget.objects.create(owner=user, kind=Kind.SITE, **target_values)
        site = SiteSettings.objects.create(target=target, template=template, **settings_values)
        shell = JobShell.objects.create(target=target, version=1, content=content,
                                        sha256=shells.content_sha256(content), created_by=user)
        audit(actor, "site.create", target, after=_snapshot(target, site))
        audit(actor, "site.job_shell.create", shell,
              after={"computer": target.pk, "version": 1, "sha256": shell.sha256, "template": template or None})
    return target


def update_site(actor: Actor, target: ComputeTarget, changes: dict) -> ComputeTarget:
    """Change a site (its owner or a global administrator). Connection, account and runtimes stay
    as they are while Jobs are queued or running on it."""
    site = site_settings_of(target)
    _require_manager(actor, target, _("Only the computer's owner and global administrators can change it."))
    if not isinstance(changes, dict):
        raise ServiceError(_("Send the changed fields as an object."), "invalid_site")
    unknown = sorted(set(changes) - set(EDITABLE_FIELDS))
    if unknown:
        raise ServiceError(_("These fields cannot be changed here: %(fields)s. Save the job shell as a new version "
                             "instead.") % {"fields": ", ".join(unknown)}, "read_only_fields",
                           fields={name: [_("Read only.")] for name in unknown})
    with transaction.atomic():
        target = ComputeTarget.objects.select_for_update().get(pk=target.pk)
        site = SiteSettings.objects.select_for_update().get(pk=site.pk)
        current = _current_values(target, site)
        errors: dict[str, list[str]] = {}
        target_values, settings_values = _clean({**current, **changes}, errors, current=target)
        if any(settings_values[name] != current[name] for name in DESTINATION_FIELDS):
            _check_destination(settings_values, errors)
        if errors:
            raise _invalid(errors)
        merged = {**target_values, **settings_values}
        changed = {k: v for k, v in merged.items() if current[k] != v}
        if not changed:
            return target
        held = [f for f in LOCKED_FIELDS if f in changed]
        jobs = list(active_jobs(target)[:5]) if held else []
        if jobs:
            ids = ", ".join(str(job.pk) for job in jobs)
            raise Conflict(_("Jobs %(ids)s are queued or running on this computer, so %(fields)s cannot change now; "
                             "save after the Jobs end.") % {"ids": ids, "fields": ", ".join(held)}, "computer_in_use",
                           fields={name: [_("Locked while Jobs use this computer.")] for name in held})
        before = _snapshot(target, site, only=changed)
        for name, value in changed.items():
            setattr(target if name in TARGET_FIELDS else site, name, value)
        target.save()
        site.save()
        audit(actor, "site.update", target, before=before, after=_snapshot(target, site, only=changed))
    return target


def site_errors(actor: Actor, data: dict, *, target: ComputeTarget | None = None) -> dict[str, list[str]]:
    """Every problem of the given fields at once, without saving anything: what create_site (or
    update_site of `target`) would refuse, field by field. The site form calls it when it refused a
    field of its own (such as a queue timeout it cannot read), so one Save reports every wrong field;
    fields the form could not read are left out of `data` and take their defaults here."""
    errors: dict[str, list[str]] = {}
    if not isinstance(data, dict):
        return errors
    data = {name: value for name, value in data.items() if name in EDITABLE_FIELDS or name in ("template", "job_shell")}
    if target is None:
        _content, template = _initial_job_shell(data, errors)
        _target, settings_values = _clean({**data, "template": template}, errors, current=None)
        _check_destination(settings_values, errors)
        return errors
    site = site_settings_of(target)
    current = _current_values(target, site)
    _target, settings_values = _clean({**current, **data}, errors, current=target)
    if any(settings_values[name] != current[name] for name in DESTINATION_FIELDS):
        _check_destination(settings_values, errors)
    return errors


def site_settings_of(target: ComputeTarget) -> SiteSettings:
    if target.kind != Kind.SITE:
        raise ServiceError(_("%(name)s is not a site.") % {"name": target.name}, "not_a_site", status=404)
    site = SiteSettings.objects.select_related("launcher").filter(target=target).first()
    if site is None:
        raise ServiceError(_("%(name)s has no site settings; its owner saves them first.") % {"name": target.name},
                           "site_not_configured")
    return site


def active_jobs(target: ComputeTarget):
    from jobs.models import Job

    return Job.objects.filter(target=target, status__in=ACTIVE_JOB_STATUSES).order_by("pk")


# Job shells -------------------------------------------------------------------------------------

def current_job_shell(target: ComputeTarget) -> JobShell | None:
    return JobShell.objects.filter(target=target).order_by("-version").first()


def runs_clusters(target) -> bool:
    """The hook jobs.services asks at creation: whether cluster jobs may go to `target`. True for a site
    whose current job shell defines mmt_supports_clusters (the Slurm template's does); False for every
    other computer and job shell."""
    if getattr(target, "kind", None) != "site":
        return False
    shell = current_job_shell(target)
    return shell is not None and shells.supports_clusters(shell.content)


def save_job_shell(actor: Actor, target: ComputeTarget, content) -> tuple[JobShell, bool]:
    """Save the job shell as the next version; content identical to the current version makes no
    new version. Returns (version, created)."""
    site = site_settings_of(target)
    _require_manager(actor, target, _("Only the computer's owner and global administrators can save its job shell."))
    content = shells.normalize_content(content)
    shells.validate_content(content)
    digest = shells.content_sha256(content)
    try:
        with transaction.atomic():
            # Serialise saves of one site on its settings row; the unique (target, version) is the last word.
            SiteSettings.objects.select_for_update().get(pk=site.pk)
            latest = current_job_shell(target)
            if latest is not None and latest.sha256 == digest:
                return latest, False
            version = (latest.version if latest else 0) + 1
            shell = JobShell.objects.create(target=target, version=version, content=content, sha256=digest,
                                            created_by=actor.user)
            audit(actor, "site.job_shell.create", shell,
                  after={"computer": target.pk, "version": version, "sha256": digest,
                         "bytes": len(content.encode("utf-8"))})
    except IntegrityError:
        raise Conflict(_("Someone saved this job shell at the same moment; reload it and save again."),
                       "job_shell_conflict") from None
    return shell, True


# My settings ------------------------------------------------------------------------------------

def my_settings(user, target: ComputeTarget) -> SiteUserSettings | None:
    if not user.is_authenticated:
        return None
    return SiteUserSettings.objects.filter(target=target, user=user).first()


def save_my_settings(actor: Actor, target: ComputeTarget, data: dict) -> SiteUserSettings:
    """Account name, working directory and variables (such as GROUP) of the caller on a site that runs
    under each person's own account. People who can use the computer; never service accounts."""
    user = actor.user
    if user is None or not user.is_authenticated:
        raise Forbidden(_("Sign in to save your settings."), "not_authenticated", status=401)
    refuse_service_account(user)
    site = site_settings_of(target)
    if not access.can_use(user, target):
        raise ServiceError(_("No computer with this id that you can use."), "not_found", status=404)
    if not site.uses_personal_accounts:
        message = (_("This computer submits manually: mado-tracking submit runs under your account, and takes "
                     "variables with --var NAME=VALUE.") if site.submission == SubmissionMethod.MANUAL else
                   _("This computer runs every Job under its shared account; there is nothing to save in My "
                     "settings."))
        raise ServiceError(message, "my_settings_not_applicable")
    if not isinstance(data, dict):
        raise ServiceError(_("Send your settings as an object."), "invalid_my_settings")
    unknown = sorted(set(data) - {"account_name", "working_dir", "variables"})
    errors: dict[str, list[str]] = {name: [_("Unknown field.")] for name in unknown}
    account_name = str(data.get("account_name") or "").strip()
    if not ACCOUNT_PATTERN.fullmatch(account_name):
        errors["account_name"] = [_("Enter your account name on this computer: letters, digits, _ . -, "
                                    "not starting with . or -.")]
    working_dir = str(data.get("working_dir") or "").strip()
    if working_dir and not shells.is_path(working_dir):
        errors["working_dir"] = [_("The working directory must be %(rule)s.") % {"rule": shells.path_rule()}]
    variables = _variables(data.get("variables"), errors)
    if errors:
        raise _invalid(errors, code="invalid_my_settings")
    values = {"account_name": account_name, "working_dir": working_dir, "variables": variables}
    with transaction.atomic():
        settings = SiteUserSettings.objects.select_for_update().filter(target=target, user=user).first()
        before = None
        if settings is None:
            settings = SiteUserSettings.objects.create(target=target, user=user, **values)
        else:
            before = {k: getattr(settings, k) for k in values}
            if before == values:
                return settings
            for name, value in values.items():
                setattr(settings, name, value)
            settings.save()
        audit(actor, "site.user_settings.save", settings, before=before, after={"computer": target.pk, **values})
    return settings


def refuse_service_account(user) -> None:
    if identity.is_service_user(user):
        raise Forbidden(_("Service accounts cannot have their own settings, so they cannot use computers that run "
                          "under each person's own account."), "service_account_no_settings")


def check_can_submit(user, target: ComputeTarget) -> None:
    """Whether `user` may have Jobs submitted to `target` as far as site accounts go. On a site that
    runs under each person's own account, 422 `site_account_required` until the user saved an account
    name in My settings; service accounts never can. Other computers: nothing to check."""
    if target.kind != Kind.SITE:
        return
    site = site_settings_of(target)
    if not site.uses_personal_accounts:
        return
    if identity.is_service_user(user):
        raise ServiceError(
            _("%(name)s runs Jobs under each person's own account, and service accounts cannot have their own "
              "settings: run these Jobs on a computer with a shared account or manual submission.")
            % {"name": target.name},
            "site_account_required", fields={"computer": [_("Service accounts cannot use this computer.")]})
    if not SiteUserSettings.objects.filter(target=target, user=user).exists():
        raise ServiceError(
            _("%(name)s runs Jobs under your own account: save your account name in My settings of the computer "
              "first, then register the public key shown there.") % {"name": target.name},
            "site_account_required", fields={"computer": [_("Save My settings first.")]})


# Rendering for submissions ----------------------------------------------------------------------

def spec_dir_for(working_dir: str, job_id: int) -> str:
    return f"{working_dir.rstrip('/')}/{SPEC_ROOT}/{job_id}"


def shell_values(target: ComputeTarget, jobs: list, *, work_dir: str | None = None, runner: str | None = None,
                 extra_variables: dict | None = None) -> shells.ShellValues:
    """The job shell values for `jobs` submitted together (one Job, or an array of Jobs of one person
    and project with the same GPU count and time limit): the site's variables, then the requester's
    own (My settings), then `extra_variables` (mado-tracking submit --var)."""
    site = site_settings_of(target)
    if not jobs:
        raise ServiceError("Give at least one Job to submit.", "invalid_submission")
    first = jobs[0]
    same = {(j.target_id, j.project_id, j.created_by_id, j.gpu_count or 0,
             j.walltime_seconds or DEFAULT_WALLTIME_SECONDS) for j in jobs}
    if len(same) != 1 or first.target_id != target.pk:
        raise ServiceError("Jobs submitted together must be on this computer and share project, requester, GPU "
                           "count and time limit.", "invalid_submission")
    variables = dict(site.variables)
    mine = SiteUserSettings.objects.filter(target=target, user_id=first.created_by_id).first()
    if mine is not None and site.uses_personal_accounts:
        variables.update(mine.variables)
        work_dir = work_dir or mine.working_dir or None
    variables.update(shells.parse_variables(extra_variables or {}))
    spec_dir = spec_dir_for(work_dir or site.working_dir, first.pk)
    cluster = first.cluster_size > 1
    if cluster and len(jobs) != 1:
        raise ServiceError("A cluster job is submitted alone, never in an array.", "invalid_submission")
    return shells.ShellValues(
        spec_dir=spec_dir, runner=runner or f"{spec_dir}/{RUNNER_NAME}", job_ids=[j.pk for j in jobs],
        project_id=first.project_id, target_id=target.pk,
        # A cluster job asks its GPUs per replica, and the scheduler's --gres counts per node.
        gpu_count=first.gpus_per_replica if cluster else first.gpu_count or 0,
        walltime_seconds=first.walltime_seconds or DEFAULT_WALLTIME_SECONDS, variables=variables,
        cluster_size=first.cluster_size if cluster else 1)


def render_submission(target: ComputeTarget, jobs: list, *, job_shell: JobShell | None = None,
                      adopt: bool = False, **options) -> tuple[str, JobShell]:
    """The script that submits `jobs`, and the job shell version it was made from. `adopt`: the answer
    to an earlier claim of these Jobs may have been lost, so the script first looks for the scheduler
    job by its name."""
    job_shell = job_shell or current_job_shell(target)
    if job_shell is None:
        raise ServiceError(f"{target.name} has no job shell yet; its owner saves one first.", "job_shell_missing")
    values = shell_values(target, jobs, **options)
    if values.cluster_size > 1 and not shells.supports_clusters(job_shell.content):
        # The job shell changed since the Job was created: it would start main1 alone.
        raise ServiceError(f"Job shell version {job_shell.version} of {target.name} does not run cluster jobs (it "
                           f"defines no {shells.CLUSTER_FUNCTION}); its owner restores it from the Slurm template.",
                           "cluster_not_supported")
    title = (f"Mado Compute: job shell version {job_shell.version} of computer {target.pk} "
             f"(sha256 {job_shell.sha256[:12]}), Jobs {','.join(str(i) for i in values.job_ids)}")
    # Passed only when set, so the script of a first submission is what it always was.
    extra = {"adopt": True} if adopt else {}
    return shells.render_submit(job_shell.content, values, title=title, **extra), job_shell


def render_cancellation(target: ComputeTarget, job_shell: JobShell, scheduler_job_id: str,
                        *, variables: dict | None = None) -> str:
    site = site_settings_of(target)
    merged = {**site.variables, **(variables or {})}
    return shells.render_cancel(job_shell.content, scheduler_job_id=scheduler_job_id, target_id=target.pk,
                                variables=merged,
                                title=f"Mado Compute: cancel {scheduler_job_id} with job shell version "
                                      f"{job_shell.version} of computer {target.pk}")


# Validation -------------------------------------------------------------------------------------

def _initial_job_shell(data: dict, errors: dict) -> tuple[str, str]:
    template = str(data.get("template") or "")
    content = data.get("job_shell")
    if content not in (None, ""):
        try:
            content = shells.normalize_content(content)
            shells.validate_content(content)
        except ServiceError as exc:
            errors["job_shell"] = exc.fields.get("content", [exc.message])
            return "", template if template in Template.values else ""
        if template and template not in Template.values:
            errors["template"] = [_("Choose one of %(templates)s.") % {"templates": ", ".join(Template.values)}]
        return content, template if template in Template.values else ""
    if template not in Template.values:
        errors["template"] = [_("Choose a job shell template: %(templates)s.") % {
            "templates": ", ".join(Template.values)}]
        return "", ""
    return shells.builtin_template(template), template


def _clean(data: dict, errors: dict, *, current: ComputeTarget | None) -> tuple[dict, dict]:
    """Validate every field, collecting all problems so the form shows them together."""
    target: dict = {}
    site: dict = {}

    target.update(clean_name_and_visibility(data, errors, current=current))
    enabled = data.get("enabled", True)
    if not isinstance(enabled, bool):
        errors["enabled"] = [_("Enabled must be true or false.")]
    target["enabled"] = bool(enabled)
    target["cpu_arch"] = data.get("cpu_arch") or CpuArch.AMD64
    if target["cpu_arch"] not in CpuArch.values:
        errors["cpu_arch"] = [_("CPU architecture must be amd64 or arm64.")]
    runtimes = data.get("runtimes")
    if runtimes in (None, [], ""):
        runtimes = _default_runtimes(data.get("template"))
    if not isinstance(runtimes, list) or not runtimes or not set(runtimes) <= set(Runtime.values):
        errors["runtimes"] = [_("Choose 1–4 runtimes from %(runtimes)s.") % {"runtimes": ", ".join(Runtime.values)}]
        runtimes = []
    target["runtimes"] = [r for r in Runtime.values if r in runtimes]

    submission = data.get("submission") or SubmissionMethod.AUTOMATIC
    if submission not in SubmissionMethod.values:
        errors["submission"] = [_("Submission method must be automatic or manual.")]
    account = data.get("account") or AccountKind.SHARED
    if account not in AccountKind.values:
        errors["account"] = [_("Account must be shared or personal.")]
    site["submission"], site["account"] = submission, account
    automatic = submission == SubmissionMethod.AUTOMATIC

    site["launcher"] = _launcher(data.get("launcher"), automatic, errors)
    host = str(data.get("host") or "").strip()
    if host and not HOST_PATTERN.fullmatch(host):
        errors["host"] = [_("Enter the login node's host name or address, without user or port.")]
    elif automatic and not host:
        errors["host"] = [_("Enter the login node the launcher connects to.")]
    site["host"] = host
    site["port"] = _whole(data.get("port", 22), 1, 65535, "port", errors, _("Port must be between 1 and 65535."))
    ssh_user = str(data.get("ssh_user") or "").strip()
    if ssh_user and not ACCOUNT_PATTERN.fullmatch(ssh_user):
        errors["ssh_user"] = [_("The shared account name may hold letters, digits, _ . - and not start with . or -.")]
    elif automatic and account == AccountKind.SHARED and not ssh_user:
        errors["ssh_user"] = [_("Enter the shared account everyone's Jobs run under.")]
    site["ssh_user"] = ssh_user
    site["jump_hosts"] = _jump_hosts(data.get("jump_hosts"), errors)
    # Which keys known_hosts needs is checked only once host, port and jump hosts are valid themselves.
    reachable = not {"host", "port", "jump_hosts"} & set(errors)
    site["known_hosts"] = _known_hosts(data.get("known_hosts"), automatic, reachable, host, site["port"],
                                       site["jump_hosts"], errors)

    for field, message in (("working_dir", _("Enter the working directory as %(rule)s.")),
                           ("runner_python", _("Enter the runner's Python as %(rule)s."))):
        value = str(data.get(field) or "").strip()
        if not shells.is_path(value):
            errors[field] = [message % {"rule": shells.path_rule()}]
        site[field] = value
    site["runner_api_url"] = _api_url(data.get("runner_api_url"), errors)
    site["variables"] = _variables(data.get("variables"), errors)
    site["max_active_submissions"] = _whole(
        data.get("max_active_submissions", DEFAULT_MAX_ACTIVE_SUBMISSIONS), 1, MAX_ACTIVE_SUBMISSIONS,
        "max_active_submissions", errors,
        _("Max active submissions must be between 1 and %(max)s.") % {"max": MAX_ACTIVE_SUBMISSIONS})
    site["queue_timeout_seconds"] = _whole(
        data.get("queue_timeout_seconds", DEFAULT_QUEUE_TIMEOUT), MIN_QUEUE_TIMEOUT, MAX_QUEUE_TIMEOUT,
        "queue_timeout_seconds", errors, _("The queue timeout must be between 60 seconds and 30 days."))
    return target, site


def _check_destination(values: dict, errors: dict) -> None:
    """An automatic site may name as its login node and jump hosts only hosts its launcher may log in
    to (sites.allowed_hosts); fields already refused for another reason are left as they are."""
    if values.get("submission") != SubmissionMethod.AUTOMATIC or "launcher" in errors:
        return
    refusals = allowed_hosts.site_errors(values.get("launcher"), values.get("host", ""), values.get("jump_hosts"))
    for name, messages in refusals.items():
        errors.setdefault(name, messages)


def _default_runtimes(template) -> list[str]:
    if template == Template.DOCKER_HOST:
        return [Runtime.DOCKER]
    if template == Template.APPTAINER_HOST:
        return [Runtime.APPTAINER]
    return [Runtime.PYTHON]


def _launcher(raw, automatic: bool, errors: dict) -> Launcher | None:
    if isinstance(raw, Launcher):
        raw = raw.pk
    if raw in (None, ""):
        if automatic:
            errors["launcher"] = [_("Choose the launcher that logs in to this site (a global administrator "
                                    "registers launchers).")]
        return None
    launcher_id = as_int(raw, low=1, high=BIGINT_MAX)
    launcher = Launcher.objects.filter(pk=launcher_id).first() if launcher_id is not None else None
    if launcher is None:
        errors["launcher"] = [_("No launcher with this id.")]
        return None
    if launcher.is_revoked:
        errors["launcher"] = [_("The launcher %(name)s was revoked; choose another.") % {"name": launcher.name}]
    return launcher


def _jump_hosts(raw, errors: dict) -> list[str]:
    if raw in (None, ""):
        return []
    items = raw.split() if isinstance(raw, str) else raw
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        errors["jump_hosts"] = [_("Give jump hosts as [user@]host[:port], one per line.")]
        return []
    items = [i.strip() for i in items if i.strip()]
    if len(items) > MAX_JUMP_HOSTS:
        errors["jump_hosts"] = [_("At most %(max)s jump hosts.") % {"max": MAX_JUMP_HOSTS}]
    for item in items:
        match = JUMP_HOST_PATTERN.fullmatch(item)
        if not match or (match["port"] and not 1 <= int(match["port"]) <= 65535):
            errors["jump_hosts"] = [_("%(item)s is not [user@]host[:port].") % {"item": item[:80]}]
            break
    return items


def _known_hosts(raw, automatic: bool, check_hosts: bool, host: str, port: int, jump_hosts: list[str], errors: dict) -> str:
    text = shells.normalize_content(raw or "") if isinstance(raw, (str, type(None))) else None
    if text is None:
        errors["known_hosts"] = [_("Paste known_hosts as text.")]
        return ""
    text = text.strip() + ("\n" if text.strip() else "")
    if len(text.encode("utf-8")) > MAX_KNOWN_HOSTS_BYTES:
        errors["known_hosts"] = [_("known_hosts is larger than 64 KiB; paste only this site's lines.")]
        return text
    try:
        keys = kh.parse(text)
    except kh.KnownHostsError as exc:
        errors["known_hosts"] = [_("%(problem)s Paste the output of ssh-keyscan.") % {"problem": exc}]
        return text
    if not automatic:
        return text
    if not keys:
        errors["known_hosts"] = [_("Paste the login node's host keys: run ssh-keyscan for it, compare the "
                                   "fingerprints with the ones the site publishes, then paste the output.")]
        return text
    if not check_hosts:
        return text
    needed = [(host, port)] if host else []
    for item in jump_hosts:
        match = JUMP_HOST_PATTERN.fullmatch(item)
        if match:
            needed.append((match["host"].strip("[]"), int(match["port"] or 22)))
    missing = [h for h in needed if not kh.keys_for(keys, *h)]
    if missing:
        shown = ", ".join(name if p == 22 else f"[{name}]:{p}" for name, p in missing)
        commands = "; ".join(f"ssh-keyscan{'' if p == 22 else f' -p {p}'} {name}" for name, p in missing)
        errors["known_hosts"] = [_("known_hosts has no key for %(hosts)s. Run %(commands)s, compare the fingerprints "
                                   "with the ones the site publishes, then paste the output.")
                                 % {"hosts": shown, "commands": commands}]
    return text


def _api_url(raw, errors: dict) -> str:
    url = str(raw or "").strip()
    parts = urlsplit(url) if url else None
    ok = (parts is not None and parts.scheme in ("http", "https") and parts.hostname and not parts.username
          and not parts.password and not parts.query and not parts.fragment and len(url) <= 2000
          and not any(ch.isspace() or ch in "'\"`$\\<>" for ch in url))
    if not ok:
        errors["runner_api_url"] = [_("Enter this server's URL as the compute nodes reach it, such as "
                                      "https://tracking.example.org (no user, query or quotes).")]
    return url.rstrip("/")


def _variables(raw, errors: dict) -> dict[str, str]:
    try:
        return shells.parse_variables(raw)
    except ServiceError as exc:
        errors["variables"] = exc.fields.get("variables", [exc.message])
        return {}


def _require_manager(actor: Actor, target: ComputeTarget, message: str) -> None:
    if actor.user is not None and not access.can_manage(actor.user, target):
        raise Forbidden(message, "not_owner")


def _invalid(errors: dict, code: str = "invalid_site") -> ServiceError:
    summary = " ".join(f"{name}: {' '.join(messages)}" for name, messages in errors.items())
    return ServiceError(_("Fix these fields: %(summary)s") % {"summary": summary}, code, fields=errors)


def _current_values(target: ComputeTarget, site: SiteSettings) -> dict:
    return {f: getattr(target, f) for f in TARGET_FIELDS} | {f: getattr(site, f) for f in SETTINGS_FIELDS}


def _snapshot(target: ComputeTarget, site: SiteSettings, only=None) -> dict:
    """Audit view of a site: no secrets; known_hosts as its fingerprints."""
    values = _current_values(target, site)
    values["launcher"] = site.launcher.name if site.launcher_id else None
    try:
        values["known_hosts"] = [k.display()["fingerprint"] for k in kh.parse(site.known_hosts)]
    except kh.KnownHostsError:
        values["known_hosts"] = []
    if only is not None:
        values = {k: v for k, v in values.items() if k in only}
    return values
