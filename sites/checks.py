"""Connection checks of sites (seed 003 "Keys and connection checks"): the site's launcher logs in as
the shared account, or as one person's own account, with a fresh connection and runs `true`.

A check is a SiteCheck row; it ends as a worker's check does (computers.models.CheckBase). The
launcher sees open checks in its config (they become `claimed` when first handed out) and answers
through POST /api/launcher/checks/{id}/complete. One nobody answered ends `expired`, as SSH checks
do, after the launcher's 60 s plus the slack of its poll."""
from __future__ import annotations

import time
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from computers import access
from computers.choices import OPEN_CHECK_STATUSES, CheckStatus, ItemStatus
from mado import access as identity
from mado.errors import Conflict, Forbidden, ServiceError
from mado.longpoll import notify
from mado.models import AuditEvent
from mado.services import SYSTEM, Actor, audit
from mado.validation import as_int
from sites import allowed_hosts, services, shells
from sites.choices import LAUNCHER_POLL_SECONDS, AccountKind, SubmissionMethod
from sites.models import Launcher, SiteCheck, SiteUserSettings
from sites.submissions import SITES_CHANNEL

CHECK_SECONDS = 60  # the launcher's own limit for logging in and running `true`
CHECK_TIMEOUT = timedelta(seconds=CHECK_SECONDS + 2 * LAUNCHER_POLL_SECONDS)
_last_expiry = 0.0


def request_site_check(actor: Actor, target, *, mine: bool) -> SiteCheck:
    """Shared account: the owner or a global administrator. Own account (`mine`): anyone who can use
    the site and has saved My settings."""
    user = actor.user
    if user is None or not user.is_authenticated or identity.is_job_principal(user):
        raise Forbidden(_("Sign in to check a site's connection."), "not_authenticated", status=401)
    site = services.site_settings_of(target)
    if site.submission != SubmissionMethod.AUTOMATIC:
        raise ServiceError(_("%(name)s submits manually, so no launcher logs in to it; run mado-tracking submit "
                             "--dry-run there instead.") % {"name": target.name}, "site_check_not_applicable")
    if mine:
        site_user, account_name = _own_account(user, target, site)
    else:
        if not access.can_manage(user, target):
            raise Forbidden(_("Only the computer's owner and global administrators check the shared account; "
                              "check your own account instead."), "not_owner")
        if site.account != AccountKind.SHARED:
            raise ServiceError(_("%(name)s runs Jobs under each person's own account: check your own account's "
                                 "connection.") % {"name": target.name}, "site_check_not_applicable")
        site_user, account_name = None, site.ssh_user
    launcher = site.launcher
    if launcher is None or launcher.is_revoked:
        raise Conflict(_("%(name)s has no active launcher to log in with; its owner chooses one.") % {
            "name": target.name}, "launcher_unavailable")
    if not allowed_hosts.site_allowed(site):
        raise Conflict(allowed_hosts.site_refusal(site), "launcher_host_not_allowed")
    expire_checks(force=True)
    try:
        with transaction.atomic():
            check = SiteCheck.objects.create(target=target, requested_by=user, launcher=launcher,
                                             site_user=site_user, account_name=account_name)
            audit(actor, "site.check.request", target,
                  after={"check": check.pk, "launcher": launcher.name, "account_name": account_name,
                         "user": site_user.pk if site_user else None})
    except IntegrityError:
        raise Conflict(_("A connection check of this account is already waiting or running; wait for its result."),
                       "target_check_in_progress") from None
    notify(SITES_CHANNEL)
    return check


def _own_account(user, target, site):
    if identity.is_service_user(user):
        services.refuse_service_account(user)
    if not access.can_use(user, target):
        raise ServiceError(_("No site with this id that you can use."), "not_found", status=404)
    if not site.uses_personal_accounts:
        raise ServiceError(_("%(name)s runs every Job under its shared account; its owner checks that connection.")
                           % {"name": target.name}, "site_check_not_applicable")
    mine = SiteUserSettings.objects.filter(target=target, user=user).first()
    if mine is None:
        raise ServiceError(_("Save your account name in My settings of %(name)s first, register the public key "
                             "shown there, then check.") % {"name": target.name}, "site_account_required")
    return user, mine.account_name


def open_for(launcher: Launcher) -> list[dict]:
    """The checks the launcher should run now; handing one out marks it claimed."""
    checks = list(SiteCheck.objects.filter(launcher=launcher, status__in=OPEN_CHECK_STATUSES)
                  .order_by("created_at", "id"))
    fresh = [c.pk for c in checks if c.status == CheckStatus.QUEUED]
    if fresh:
        SiteCheck.objects.filter(pk__in=fresh, status=CheckStatus.QUEUED).update(
            status=CheckStatus.CLAIMED, claimed_at=timezone.now())
    return [{"id": c.pk, "computer": c.target_id, "user": c.site_user_id, "account_name": c.account_name}
            for c in checks]


def complete(launcher: Launcher, check_id: int, data: dict) -> SiteCheck:
    """The launcher's answer: {ok, error?, duration_ms?}. The same answer resent is accepted again."""
    ok = data.get("ok")
    if not isinstance(ok, bool):
        raise ServiceError("ok is true or false.", "invalid", fields={"ok": ["true or false."]})
    error = data.get("error") or ""
    if not isinstance(error, str):
        raise ServiceError("error is text.", "invalid", fields={"error": ["Text expected."]})
    duration = data.get("duration_ms")
    if duration is not None and as_int(duration, low=0, high=3_600_000) is None:
        raise ServiceError("duration_ms is whole milliseconds (0 … 3 600 000).", "invalid",
                           fields={"duration_ms": ["Invalid."]})
    expire_checks(force=True)
    status = CheckStatus.SUCCEEDED if ok else CheckStatus.FAILED
    with transaction.atomic():
        check = (SiteCheck.objects.select_for_update(of=("self",)).select_related("target")
                 .filter(pk=check_id, launcher=launcher).first())
        if check is None:
            raise ServiceError("No check with this id was asked of this launcher.", "not_found", status=404)
        detail = "" if ok else shells.stderr_tail(error or "The login failed without a message.", limit=500)
        if not check.finish(status, lambda: _result(check, ok, detail, duration)):
            return check  # the same answer resent
        token_user = launcher.token.user if launcher.token_id else None
        audit(Actor(token_user), "site.check.finish", check.target,
              after={"check": check.pk, "status": status, "launcher": launcher.name,
                     **({"detail": detail} if detail else {})})
    return check


def _result(check: SiteCheck, ok: bool, detail: str, duration) -> dict:
    # The check keeps only what its readers can fix; the launcher's own message (closed port, not
    # SSH, a host key's fingerprint …) goes to the audit log, where global administrators read it.
    shown = "" if ok else _for_users(check, detail)
    return {"items": [{"key": "connection", "status": ItemStatus.OK if ok else ItemStatus.FAILED,
                       "code": "" if ok else "ssh_failed", "detail": shown, "resolution": ""}],
            "account_name": check.account_name, "duration_ms": duration}


def expire_checks(*, force: bool = False) -> None:
    """Site checks without an answer CHECK_TIMEOUT after they were asked end as expired."""
    global _last_expiry
    if not force and time.monotonic() - _last_expiry < 1.0:
        return
    _last_expiry = time.monotonic()
    now = timezone.now()
    stale = list(SiteCheck.objects.filter(status__in=OPEN_CHECK_STATUSES, created_at__lt=now - CHECK_TIMEOUT)
                 .select_related("target"))
    for check in stale:
        if check.expire(now):
            audit(SYSTEM, "site.check.finish", check.target,
                  after={"check": check.pk, "status": "expired", "failure_reason": check.failure_reason})


def _for_users(check: SiteCheck, detail: str) -> str:
    site = services.site_settings_of(check.target)
    return allowed_hosts.check_failure_for_users(detail, site.host, site.port, check.account_name)


def sees_launcher_messages(user) -> bool:
    """Global administrators read the launcher's own message of a failed check; others what they can fix."""
    return allowed_hosts.sees_launcher_messages(user)


def launcher_message(check: SiteCheck) -> str:
    """The launcher's own message of a failed check, from the audit log ("" if none)."""
    rows = (AuditEvent.objects.filter(action="site.check.finish", object_type=check.target._meta.model_name,
                                      object_id=str(check.target_id), after__check=check.pk)
            .order_by("-at", "-id").values_list("after", flat=True))
    for after in rows:
        if isinstance(after, dict) and after.get("detail"):
            return str(after["detail"])
    return ""


def failure_detail(user, check: SiteCheck, detail: str) -> str:
    """A failed item's detail as `user` may read it. Checks stored before this rule keep the launcher's
    message in their result: it is reduced here for everyone but global administrators."""
    if sees_launcher_messages(user):
        return launcher_message(check) or detail
    if not detail or detail.startswith(allowed_hosts.GENERIC_PREFIX):
        return detail
    return _for_users(check, detail)


def check_body(check: SiteCheck, user=None) -> dict:
    result = check.result
    if isinstance(result, dict) and isinstance(result.get("items"), list):
        result = {**result, "items": [
            {**item, "detail": failure_detail(user, check, str(item.get("detail") or ""))}
            if isinstance(item, dict) and item.get("status") == ItemStatus.FAILED else item
            for item in result["items"]]}
    return {"id": check.pk, "computer": check.target_id, "status": check.status,
            "user": check.site_user_id, "account_name": check.account_name,
            "failure_reason": check.failure_reason or None, "result": result,
            "created_at": check.created_at, "finished_at": check.finished_at}


def checks_of(target):
    """The site's checks as the computers API reads them (computers.kinds.checks_of)."""
    return SiteCheck.objects.filter(target=target)


def latest_checks(user, target) -> dict:
    """The last check of the shared account (for its managers) and of the caller's own account."""
    checks = SiteCheck.objects.filter(target=target).select_related("target")
    shared = checks.filter(site_user__isnull=True).first() if access.can_manage(user, target) else None
    own = checks.filter(site_user=user).first() if user.is_authenticated else None
    return {"shared": check_body(shared, user) if shared else None, "mine": check_body(own, user) if own else None}
