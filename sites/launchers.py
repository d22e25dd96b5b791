"""Launchers (DESIGN §8): a global administrator registers a `mado-tracking-launcher`, gets its token
once, can recreate that token (the old one stops at once) or revoke the launcher. Each launcher's
token is held by its own service-like user (no password, no membership, never signs in) and carries
only `launcher:execute`, which mado.permissions lets reach the launcher endpoints and nothing else.
Each change runs in one transaction and writes an AuditEvent."""
from __future__ import annotations

import uuid

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from mado import services as identity_services
from mado.choices import Scope, TokenKind
from mado.errors import Conflict, ServiceError
from mado.longpoll import notify, wait_for
from mado.models import ApiToken, Project
from mado.services import Actor, audit, issue_token, revoke_token
from mado.validation import NAME_PATTERN
from sites import allowed_hosts as host_policy
from sites import checks, submissions
from sites.choices import LAUNCHER_POLL_SECONDS, AccountKind, SubmissionMethod
from sites.models import Launcher, SiteSettings, SiteUserSettings
from sites.submissions import SITES_CHANNEL

LAUNCHER_SCOPES = [Scope.LAUNCHER_EXECUTE.value]
HOLDER_PREFIX = "launcher-"


def require_global_admin(actor: Actor) -> None:
    identity_services.require_global_admin(actor, _("Only global administrators manage launchers."))


def project_of(launcher: Launcher) -> Project | None:
    """The project the launcher's token belongs to (the launcher model keeps it on its token)."""
    return launcher.token.project if launcher.token_id else None


def state_of(launcher: Launcher) -> str:
    if launcher.is_revoked:
        return "revoked"
    token = launcher.token
    if token is None or token.revoked_at is not None:
        return "no_token"
    if token.expires_at <= timezone.now():
        return "expired"
    return "active"


def last_used(launcher: Launcher):
    token_used = launcher.token.last_used_at if launcher.token_id else None
    seen = [t for t in (launcher.last_seen_at, token_used) if t is not None]
    return max(seen) if seen else None


def register_launcher(actor: Actor, name: str, project: Project, allowed_hosts=None) -> tuple[Launcher, str]:
    """Create the launcher, its holder and its token; the plaintext token is returned once. Without
    `allowed_hosts` it may log in nowhere until a global administrator sets them."""
    require_global_admin(actor)
    patterns = host_policy.parse(allowed_hosts)
    name = (name or "").strip() if isinstance(name, str) else ""
    if not NAME_PATTERN.match(name):
        raise ServiceError(_("Use 1–64 letters, digits, '.', '_' or '-' for the name, starting with a letter or "
                             "digit."), "invalid_name", fields={"name": [_("Invalid name.")]})
    if not isinstance(project, Project):
        raise ServiceError(_("Choose the project the launcher's token belongs to."), "invalid_project",
                           fields={"project": [_("Unknown project.")]})
    taken = Conflict(_("A launcher named %(name)s already exists; choose another name.") % {"name": name},
                     "launcher_name_taken", fields={"name": [_("Already taken.")]})
    if Launcher.objects.filter(name__iexact=name).exists():
        raise taken
    try:
        with transaction.atomic():
            holder = User(username=f"{HOLDER_PREFIX}{uuid.uuid4().hex[:24]}", first_name=name[:150])
            holder.set_unusable_password()
            holder.save()
            launcher = Launcher.objects.create(name=name, created_by=actor.user, allowed_hosts=patterns)
            token, plaintext = _issue(actor, launcher, holder, project)
            audit(actor, "launcher.create", launcher, project=project,
                  after={"name": name, "project": project.slug, "token_prefix": token.prefix,
                         "allowed_hosts": patterns})
    except IntegrityError:
        raise taken from None  # registered by someone else at the same moment
    return launcher, plaintext


def recreate_token(actor: Actor, launcher: Launcher) -> tuple[Launcher, str]:
    """Revoke the launcher's token and issue a new one for the same holder and project (shown once)."""
    require_global_admin(actor)
    with transaction.atomic():
        launcher = Launcher.objects.select_for_update().get(pk=launcher.pk)
        if launcher.is_revoked:
            raise Conflict(_("The launcher %(name)s was revoked; register a new one instead.")
                           % {"name": launcher.name}, "launcher_revoked")
        old = launcher.token
        if old is None:
            raise Conflict(_("The launcher %(name)s has no token to recreate; register a new one instead.")
                           % {"name": launcher.name}, "launcher_without_token")
        revoke_token(actor, old)
        token, plaintext = _issue(actor, launcher, old.user, old.project)
        audit(actor, "launcher.token.recreate", launcher, project=old.project,
              before={"token_prefix": old.prefix}, after={"token_prefix": token.prefix})
    return launcher, plaintext


def set_allowed_hosts(actor: Actor, launcher: Launcher, raw) -> Launcher:
    """Replace the hosts the launcher may log in to (global administrators). Sites that name a host
    outside the new list stay as they are but the launcher no longer gets them in its config, so it
    neither submits to nor checks them until their owners choose an allowed host (or the list allows
    theirs again)."""
    require_global_admin(actor)
    patterns = host_policy.parse(raw)
    with transaction.atomic():
        launcher = Launcher.objects.select_for_update().get(pk=launcher.pk)
        before = list(launcher.allowed_hosts or [])
        if before == patterns:
            return launcher
        launcher.allowed_hosts = patterns
        launcher.save(update_fields=["allowed_hosts"])
        audit(actor, "launcher.allowed_hosts.update", launcher, project=project_of(launcher),
              before={"allowed_hosts": before}, after={"allowed_hosts": patterns})
    notify(SITES_CHANNEL)
    return launcher


def outside_allowed_hosts(launcher: Launcher):
    """The automatic sites of this launcher that name a host it may no longer log in to."""
    sites = (SiteSettings.objects.filter(launcher=launcher, submission=SubmissionMethod.AUTOMATIC)
             .select_related("target", "launcher").order_by("target_id"))
    return [site for site in sites if not host_policy.site_allowed(site)]


def revoke(actor: Actor, launcher: Launcher) -> Launcher:
    """Revoke the launcher and its token. Sites keep pointing at it until their owners choose another."""
    require_global_admin(actor)
    with transaction.atomic():
        launcher = Launcher.objects.select_for_update().get(pk=launcher.pk)
        if launcher.is_revoked:
            return launcher
        if launcher.token is not None:
            revoke_token(actor, launcher.token)
        launcher.revoked_at = timezone.now()
        launcher.save(update_fields=["revoked_at"])
        audit(actor, "launcher.revoke", launcher, project=project_of(launcher),
              before={"state": "active"}, after={"state": "revoked"})
    return launcher


def launcher_for_token(token: ApiToken) -> Launcher | None:
    return Launcher.objects.filter(token=token, revoked_at__isnull=True).first()


def config(launcher: Launcher, *, hostname: str = "", version: str = "", wait: float = 0) -> dict:
    """What the launcher polls: the automatic sites it serves with everything it needs to log in (for
    personal-account sites the people who saved their account, one key each), the keys it already
    published, open connection checks and queued cancellations. With `wait`, held (long-poll) while
    there is nothing to do. Records that it was seen."""
    updates = {"last_seen_at": timezone.now()}
    if hostname:
        updates["hostname"] = hostname[:255]
    if version:
        updates["version"] = version[:64]
    Launcher.objects.filter(pk=launcher.pk).update(**updates)
    latest: list[dict] = []

    def work():
        latest[:] = [_config(launcher)]
        return latest[0] if has_work(latest[0]) else None

    return wait_for(work, wait, SITES_CHANNEL) or latest[0]


def has_work(body: dict) -> bool:
    """A check or cancellation to run, or a Job the launcher could claim now."""
    return bool(body["checks"] or body["cancellations"]
                or any(s["enabled"] and s["claimable"] and s["free"] for s in body["sites"])
                or any(_key_wanted(s) for s in body["sites"]))


def _key_wanted(site: dict) -> bool:
    """A key to make: one asked to be recreated, or an account (shared, or a person who just saved My
    settings) the launcher has published no key for."""
    keys = site.get("keys") or []
    if any(k.get("recreate") for k in keys):
        return True
    have = {k["user"] for k in keys}
    wanted = {a["user"] for a in site.get("accounts") or []} if site["account"] == "personal" else {None}
    return bool(wanted - have)


def _config(launcher: Launcher) -> dict:
    submissions.expire_overdue()
    checks.expire_checks()
    sites = (SiteSettings.objects.filter(launcher=launcher, submission=SubmissionMethod.AUTOMATIC)
             .select_related("target", "launcher").order_by("target_id"))
    return {
        "launcher": {"id": launcher.pk, "name": launcher.name},
        "poll_interval_seconds": LAUNCHER_POLL_SECONDS,
        # Only sites whose login node and jump hosts the launcher may log in to: it logs in nowhere else.
        "sites": [_site_config(launcher, site) for site in sites if host_policy.site_allowed(site)],
        "checks": checks.open_for(launcher),
        "cancellations": submissions.cancellations(launcher),
    }


def _site_config(launcher: Launcher, site: SiteSettings) -> dict:
    from sites import keys, submissions
    from sites.services import current_job_shell

    target = site.target
    shell = current_job_shell(target)
    adoptable = submissions.unreported(launcher, site).count()
    body = {
        "computer": target.pk, "name": target.name, "enabled": target.enabled,
        "account": site.account, "host": site.host, "port": site.port, "ssh_user": site.ssh_user,
        "jump_hosts": site.jump_hosts, "known_hosts": site.known_hosts, "working_dir": site.working_dir,
        "runner_python": site.runner_python, "runner_api_url": site.runner_api_url, "variables": site.variables,
        "max_active_submissions": site.max_active_submissions, "queue_timeout_seconds": site.queue_timeout_seconds,
        "job_shell": {"version": shell.version, "sha256": shell.sha256} if shell else None,
        # This launcher's unreported claims count too: its next claim adopts them first, and they already
        # hold their slots, so a site at capacity can still adopt them.
        "claimable": submissions.waiting(site).count() + adoptable,
        "free": submissions.free_slots(site) + adoptable,
        "keys": keys.keys_of(launcher, target),
    }
    if site.account == AccountKind.PERSONAL:
        accounts = SiteUserSettings.objects.filter(target=target).select_related("user").order_by("user_id")
        body["accounts"] = [{"user": s.user_id, "username": s.user.username, "account_name": s.account_name,
                             "working_dir": s.working_dir or site.working_dir} for s in accounts]
    return body


# helpers ----------------------------------------------------------------------------------------

def _issue(actor: Actor, launcher: Launcher, holder: User, project: Project):
    token, plaintext = issue_token(actor, user=holder, project=project, scopes=LAUNCHER_SCOPES,
                                   kind=TokenKind.LAUNCHER, name=f"launcher {launcher.name}")
    launcher.token = token
    launcher.save(update_fields=["token"])
    return token, plaintext
