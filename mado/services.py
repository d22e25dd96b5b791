"""State changes of the identity app. Each runs in one transaction and writes an AuditEvent."""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.contrib.auth.tokens import default_token_generator
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode
from django.utils.translation import gettext as _

from mado import access, tokens
from mado.choices import SCOPE_MIN_ROLE, Role, Scope, TokenKind
from mado.errors import Conflict, Forbidden, ServiceError
from mado.models import (
    ApiToken,
    AuditEvent,
    JobToken,
    Membership,
    Project,
    ServiceAccount,
    role_at_least,
)
from mado.validation import NAME_PATTERN

SLUG_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")


@dataclass(frozen=True)
class Actor:
    """Who asks for a change and from where; recorded in the audit trail."""

    user: User | None
    ip: str | None = None

    @classmethod
    def from_request(cls, request) -> Actor:
        return cls(user=request.user if request.user.is_authenticated else None, ip=request.META.get("REMOTE_ADDR"))


SYSTEM = Actor(user=None)


def audit(actor: Actor, action: str, obj, *, project: Project | None = None, before=None, after=None) -> AuditEvent:
    row = audit_row(actor, action, obj, project=project, before=before, after=after)
    row.save(force_insert=True)
    return row


def audit_row(actor: Actor, action: str, obj, *, project: Project | None = None, before=None,
              after=None) -> AuditEvent:
    """The audit row, unsaved: for a caller that writes it along with its own change (the job claim)."""
    return AuditEvent(
        actor=actor.user,
        actor_label=actor.user.username if actor.user else "system",
        action=action,
        object_type=obj._meta.model_name,
        object_id=str(obj.pk),
        project=project,
        before=before,
        after=after,
        ip=actor.ip,
    )


# Projects and members ---------------------------------------------------------------------------

def create_project(actor: Actor, *, slug: str, name: str = "") -> Project:
    require_global_admin(actor, "Only global administrators can create projects.")
    slug = slug.strip().lower()
    if not SLUG_PATTERN.match(slug):
        raise ServiceError(
            "Use 1–64 lower-case letters, digits and hyphens for the project identifier, starting with a letter or digit.",
            "invalid_project_slug", fields={"name": ["Invalid identifier."]},
        )
    taken = Conflict(f"A project named {slug} already exists; choose another name.", "project_exists",
                     fields={"name": ["Already taken."]})
    if Project.objects.filter(slug=slug).exists():
        raise taken
    try:
        with transaction.atomic():
            project = Project.objects.create(slug=slug, name=name.strip() or slug)
            audit(actor, "project.create", project, project=project, after={"slug": slug, "name": project.name})
    except IntegrityError:
        raise taken from None  # created by someone else at the same moment
    return project


def set_membership(actor: Actor, project: Project, *, username: str, role: str, only_new: bool = False) -> Membership:
    """Add a person to the project with a role, or change their role (the API's POST does both; the
    Members page's Add dialog passes `only_new` so that it never silently changes an existing role).
    The last admin of a project cannot be turned into a member or viewer."""
    _require_role(actor, project, Role.ADMIN, _("Only project admins can add members or change their roles."))
    if role not in Role.values:
        raise ServiceError(_("Role must be one of %(roles)s.") % {"roles": ", ".join(Role.values)}, "invalid_role",
                           fields={"role": [_("Unknown role.")]})
    username = (username or "").strip()
    user = User.objects.filter(username=username).first()
    if user is None:
        raise ServiceError(
            _("No user named %(username)s; check the spelling, or ask a global administrator to create the user "
              "first.") % {"username": username},
            "unknown_user", fields={"username": [_("Unknown user.")]})
    if access.is_service_user(user):
        raise ServiceError(_("Service accounts belong to one project and cannot be added as members."),
                           "service_account_not_member", fields={"username": [_("This is a service account.")]})
    with transaction.atomic():
        _lock_memberships(project)
        membership = Membership.objects.filter(project=project, user=user).first()
        if membership is None:
            try:
                with transaction.atomic():
                    membership = Membership.objects.create(project=project, user=user, role=role)
            except IntegrityError:
                # Only reachable where the lock above is a no-op (SQLite serialises writers anyway).
                membership = Membership.objects.get(project=project, user=user)
            else:
                audit(actor, "membership.create", membership, project=project,
                      after={"username": username, "role": role})
                return membership
        if only_new:
            raise Conflict(
                _("%(username)s is already a member of %(project)s with the role %(role)s; use Change role "
                  "instead.") % {"username": username, "project": project.name, "role": Role(membership.role).label},
                "already_member", fields={"username": [_("Already a member.")]})
        if membership.role == role:
            return membership
        refusal = last_admin_refusal(project, membership, removing=False) if role != Role.ADMIN else None
        if refusal is not None:
            raise refusal
        before = {"role": membership.role}
        membership.role = role
        membership.save(update_fields=["role"])
        audit(actor, "membership.update", membership, project=project, before=before,
              after={"username": username, "role": role})
    return membership


def remove_membership(actor: Actor, project: Project, *, username: str) -> None:
    """Take a person out of the project. Their personal tokens of the project stop working at the next
    request (their role is gone); the last admin cannot be removed."""
    _require_role(actor, project, Role.ADMIN, _("Only project admins can remove members."))
    with transaction.atomic():
        _lock_memberships(project)
        membership = Membership.objects.select_related("user").filter(project=project, user__username=username).first()
        if membership is None:
            raise ServiceError(_("%(username)s is not a member of %(project)s.")
                               % {"username": username, "project": project.name}, "not_a_member", status=404)
        refusal = last_admin_refusal(project, membership, removing=True)
        if refusal is not None:
            raise refusal
        audit(actor, "membership.delete", membership, project=project,
              before={"username": username, "role": membership.role})
        membership.delete()


def _lock_memberships(project: Project) -> None:
    """Membership changes of one project run one at a time: two admins demoting or removing each other at
    the same moment would otherwise both see another admin left and leave the project with none."""
    Project.objects.select_for_update().filter(pk=project.pk).first()


def last_admin_refusal(project: Project, membership: Membership, *, removing: bool) -> Conflict | None:
    """Why this membership cannot be removed (or lose the Admin role), or None: a project keeps at least
    one admin. The Members page asks before offering the button; the services raise it."""
    if membership.role != Role.ADMIN:
        return None
    if Membership.objects.filter(project=project, role=Role.ADMIN).exclude(pk=membership.pk).exists():
        return None
    name = membership.user.username
    if removing:
        message = _("%(username)s is the last admin of %(project)s and cannot be removed: give another member the "
                    "Admin role first.")
    else:
        message = _("%(username)s is the last admin of %(project)s and must keep the Admin role: give another "
                    "member the Admin role first.")
    return Conflict(message % {"username": name, "project": project.name}, "last_admin",
                    fields=None if removing else {"role": [_("The last admin.")]})


# Users ------------------------------------------------------------------------------------------

def create_user(actor: Actor, *, username: str, email: str, password: str = "") -> User:
    """A global administrator creates a person's account: with an initial password, or with none (an
    unusable one) and a one-time set-password link from `set_password_link`."""
    require_global_admin(actor, _("Only global administrators can create users."))
    username = (username or "").strip()
    email = (email or "").strip()
    errors: dict[str, list[str]] = {}
    try:
        UnicodeUsernameValidator()(username)
        if not username or len(username) > 150:
            raise ValidationError("length")
    except ValidationError:
        errors["username"] = [_("Use up to 150 letters, digits and @ . + - _ characters.")]
    else:
        # Usernames are matched exactly when signing in; two that differ only in case would be confusing.
        if User.objects.filter(username__iexact=username).exists():
            errors["username"] = [_("A user named %(username)s already exists.") % {"username": username}]
    try:
        validate_email(email)
    except ValidationError:
        errors["email"] = [_("Enter an e-mail address such as name@example.org.")]
    if password:
        try:
            validate_password(password, User(username=username, email=email))
        except ValidationError as error:
            errors["password"] = list(error.messages)
    if errors:
        first = next(iter(errors.values()))[0]
        raise ServiceError(first if len(errors) == 1 else _("Correct the fields marked below."), "invalid_user",
                           fields=errors)
    try:
        with transaction.atomic():
            user = User(username=username, email=email)
            if password:
                user.set_password(password)
            else:
                user.set_unusable_password()
            user.save()
            audit(actor, "user.create", user,
                  after={"username": username, "email": email, "password": "initial" if password else "link"})
    except IntegrityError:
        raise Conflict(_("A user named %(username)s already exists.") % {"username": username}, "user_exists",
                       fields={"username": [_("Already taken.")]}) from None
    return user


def set_password_link(actor: Actor, user: User) -> tuple[str, str]:
    """The (uidb64, token) of a one-time set-password link: Django's password-reset tokens, which stop
    working once the password is set (or after PASSWORD_RESET_TIMEOUT). Never stored, never audited."""
    require_global_admin(actor, _("Only global administrators can create set-password links."))
    if access.is_service_user(user):
        raise ServiceError(_("Service accounts have no password; they use API tokens."), "service_account_no_password")
    if not user.is_active:
        raise ServiceError(_("%(username)s is deactivated; activate the user first.") % {"username": user.username},
                           "user_inactive")
    with transaction.atomic():
        audit(actor, "user.set_password_link", user, after={"username": user.username})
    return urlsafe_base64_encode(force_bytes(user.pk)), default_token_generator.make_token(user)


def set_password(user: User, password: str) -> None:
    """Called by the set-password page once its link checked out: the person chose a password."""
    with transaction.atomic():
        user.set_password(password)
        user.save(update_fields=["password"])
        audit(Actor(user=user), "user.set_password", user, after={"username": user.username})


# Service accounts -------------------------------------------------------------------------------

def create_service_account(actor: Actor, project: Project, *, name: str, role: str, description: str = "") -> ServiceAccount:
    _require_role(actor, project, Role.ADMIN, "Only project admins can create service accounts.")
    name = name.strip()
    if not NAME_PATTERN.match(name):
        raise ServiceError(
            "Use 1–64 letters, digits, '.', '_' or '-' for the name, starting with a letter or digit.",
            "invalid_name", fields={"name": ["Invalid name."]},
        )
    if role not in Role.values:
        raise ServiceError(f"Role must be one of {', '.join(Role.values)}.", "invalid_role", fields={"role": ["Unknown role."]})
    if len(description) > 500:
        raise ServiceError("Keep the description under 500 characters.", "invalid_description",
                           fields={"description": ["Too long."]})
    taken = Conflict(f"A service account named {name} already exists in this project; choose another name.",
                     "service_account_name_taken", fields={"name": ["Already taken in this project."]})
    if ServiceAccount.objects.filter(project=project, name__iexact=name).exists():
        raise taken
    try:
        with transaction.atomic():
            user = User(username=f"sa-{uuid.uuid4().hex[:24]}", first_name=name[:150])
            user.set_unusable_password()
            user.save()
            account = ServiceAccount.objects.create(
                user=user, project=project, name=name, role=role, description=description, created_by=actor.user
            )
            audit(actor, "service_account.create", account, project=project,
                  after={"name": name, "role": role, "description": description})
    except IntegrityError:
        # Two admins choosing the same name at once: the case-insensitive unique index decides.
        raise taken from None
    return account


def disable_service_account(actor: Actor, account: ServiceAccount) -> ServiceAccount:
    _require_role(actor, account.project, Role.ADMIN, "Only project admins can disable service accounts.")
    with transaction.atomic():
        account = ServiceAccount.objects.select_for_update().get(pk=account.pk)
        if account.disabled_at is None:
            account.disabled_at = timezone.now()
            account.save(update_fields=["disabled_at"])
            audit(actor, "service_account.disable", account, project=account.project,
                  before={"disabled": False}, after={"disabled": True})
    return account


# API tokens -------------------------------------------------------------------------------------

def allowed_scopes(user: User, project: Project, kind: str) -> list[str]:
    """Scopes a token for this holder may carry, given the holder's role (and, for worker:execute,
    that it is an admin-role service account; for metrics:read, that it is a global administrator)."""
    role = access.project_role(user, project)
    account = access.service_account_of(user)
    result = []
    for scope in Scope:
        if scope == Scope.LAUNCHER_EXECUTE:
            if kind == TokenKind.LAUNCHER:
                result.append(scope.value)
            continue
        if scope == Scope.WORKER_EXECUTE and (account is None or account.role != Role.ADMIN):
            continue
        if scope == Scope.METRICS_READ and not access.is_global_admin(user):
            continue
        if role_at_least(role, SCOPE_MIN_ROLE[scope]):
            result.append(scope.value)
    return result


def issue_token(
    actor: Actor,
    *,
    user: User,
    project: Project,
    scopes: list[str],
    expires_in_days: int | None = None,
    kind: str = TokenKind.PERSONAL,
    name: str = "",
    ceiling: frozenset[str] | None = None,
) -> tuple[ApiToken, str]:
    """Create a token and return it with its plaintext, which is never stored and shown once.

    `ceiling` is the scope set of the token the request itself came with: a token can never mint a
    token with more rights than it has."""
    scopes = _validate_scopes(user, project, kind, scopes, ceiling)
    days = settings.TOKEN_MAX_DAYS if expires_in_days is None else expires_in_days
    if not isinstance(days, int) or isinstance(days, bool) or not 1 <= days <= settings.TOKEN_MAX_DAYS:
        raise ServiceError(f"Expiry must be between 1 and {settings.TOKEN_MAX_DAYS} days.", "invalid_expiry",
                           fields={"expires_in_days": [f"1–{settings.TOKEN_MAX_DAYS}"]})
    plaintext = tokens.new_token(tokens.API_TOKEN_PREFIX)
    with transaction.atomic():
        token = ApiToken.objects.create(
            user=user, project=project, kind=kind, name=name[:100], prefix=tokens.display_prefix(plaintext),
            token_hash=tokens.hash_token(plaintext), scopes=scopes, created_by=actor.user,
            expires_at=timezone.now() + timedelta(days=days),
        )
        audit(actor, "token.create", token, project=project,
              after={"kind": kind, "holder": access.holder_label(user), "prefix": token.prefix, "scopes": scopes,
                     "expires_at": token.expires_at.isoformat()})
    return token, plaintext


def issue_personal_token(actor: Actor, project: Project, *, scopes, expires_in_days=None, name="", ceiling=None):
    user = actor.user
    if access.is_service_user(user):
        raise Forbidden("Service accounts get their tokens from a project admin, not by themselves.",
                        "service_account_self_issue")
    _require_role(actor, project, Role.MEMBER, "Viewers cannot issue API tokens; ask a project admin for the member role.")
    return issue_token(actor, user=user, project=project, scopes=scopes, expires_in_days=expires_in_days,
                       kind=TokenKind.PERSONAL, name=name, ceiling=ceiling)


def issue_service_account_token(actor: Actor, account: ServiceAccount, *, scopes, expires_in_days=None, name=""):
    """A project admin equips a service account. No scope ceiling from the admin's own token: the
    account's role bounds the scopes, and worker:execute exists only on service-account tokens."""
    _require_role(actor, account.project, Role.ADMIN, "Only project admins can issue tokens for service accounts.")
    if account.is_disabled:
        raise Conflict(f"The service account {account.name} is disabled; create a new one instead.",
                       "service_account_disabled")
    return issue_token(actor, user=account.user, project=account.project, scopes=scopes,
                       expires_in_days=expires_in_days, kind=TokenKind.SERVICE, name=name)


def revoke_token(actor: Actor, token: ApiToken) -> ApiToken:
    if actor.user is not None and not access.can_revoke(actor.user, token):
        raise Forbidden("Only the token's holder or a project admin can revoke it.", "revoke_forbidden")
    with transaction.atomic():
        token = ApiToken.objects.select_for_update().get(pk=token.pk)
        if token.revoked_at is None:
            token.revoked_at = timezone.now()
            token.revoked_by = actor.user
            token.save(update_fields=["revoked_at", "revoked_by"])
            audit(actor, "token.revoke", token, project=token.project,
                  before={"state": "active"}, after={"state": "revoked", "prefix": token.prefix})
    return token


def record_token_use(token: ApiToken) -> None:
    """Write last_used_at at most once per resolution window: a conditional UPDATE, so concurrent
    requests with the same token do not queue on the row."""
    now = timezone.now()
    horizon = now - timedelta(seconds=settings.TOKEN_LAST_USED_RESOLUTION_SECONDS)
    if token.last_used_at is None or token.last_used_at < horizon:
        ApiToken.objects.filter(Q(last_used_at__isnull=True) | Q(last_used_at__lt=horizon), pk=token.pk).update(
            last_used_at=now
        )


# Job tokens -------------------------------------------------------------------------------------

def issue_job_token(*, job_id: int, lease_id: uuid.UUID, project: Project, user: User) -> tuple[JobToken, str]:
    token, plaintext = job_token_row(job_id=job_id, lease_id=lease_id, project=project, user=user)
    token.save(force_insert=True)
    return token, plaintext


def job_token_row(*, job_id: int, lease_id: uuid.UUID, project: Project, user: User) -> tuple[JobToken, str]:
    """A new job token's row, unsaved (the job claim writes it along with the claim), and its plaintext."""
    plaintext = tokens.new_token(tokens.JOB_TOKEN_PREFIX)
    return JobToken(job_id=job_id, lease_id=lease_id, project=project, user=user,
                    prefix=tokens.display_prefix(plaintext), token_hash=tokens.hash_token(plaintext)), plaintext


def revoke_job_tokens(job_id: int) -> int:
    """Called when a job ends: its code can no longer record anything."""
    return JobToken.objects.filter(job_id=job_id, revoked_at__isnull=True).update(revoked_at=timezone.now())


# helpers ----------------------------------------------------------------------------------------

def require_global_admin(actor: Actor, message: str, code: str = "global_admin_required") -> None:
    """Refuse (403 `code`, `message`) unless a global administrator acts in person: not through a job's
    token, never a service account. Operator commands act as the system and pass."""
    user = actor.user
    if user is None:
        return
    if not access.is_global_admin(user):
        raise Forbidden(message, code)


def _require_role(actor: Actor, project: Project, minimum: str, message: str) -> None:
    if actor.user is None:  # operator commands act as the system
        return
    if minimum == Role.ADMIN and access.is_service_user(actor.user):
        # An admin-role service account runs workers; it never manages people, accounts or tokens,
        # so a leaked worker token cannot mint more tokens.
        raise Forbidden("Service accounts cannot manage members, service accounts or their tokens; "
                        "a project admin does this.", "service_account_cannot_manage")
    if not access.has_role(actor.user, project, minimum):
        raise Forbidden(message, "role_required")


def _validate_scopes(user, project, kind, scopes, ceiling) -> list[str]:
    if not isinstance(scopes, (list, tuple)) or not scopes:
        raise ServiceError("Choose at least one scope.", "scopes_required", fields={"scopes": ["Required."]})
    unknown = sorted({str(s) for s in scopes} - set(Scope.values))
    if unknown:
        raise ServiceError(f"Unknown scope {', '.join(unknown)}; use {', '.join(Scope.values)}.", "unknown_scope",
                           fields={"scopes": [f"Unknown: {', '.join(unknown)}"]})
    wanted = list(dict.fromkeys(scopes))
    if Scope.WORKER_EXECUTE in wanted and (access.service_account_of(user) is None
                                           or access.service_account_of(user).role != Role.ADMIN):
        raise ServiceError(
            "The worker:execute scope can be issued only to service accounts whose role is Admin.",
            "worker_execute_requires_admin_service_account", fields={"scopes": ["worker:execute not allowed."]},
        )
    allowed = set(allowed_scopes(user, project, kind))
    refused = [s for s in wanted if s not in allowed]
    if refused:
        raise ServiceError(f"The holder's role does not allow {', '.join(refused)}.", "scope_not_allowed",
                           fields={"scopes": [f"Not allowed: {', '.join(refused)}"]})
    if ceiling is not None and not set(wanted) <= ceiling:
        extra = sorted(set(wanted) - ceiling)
        raise Forbidden(f"Your token cannot grant scopes it does not have: {', '.join(extra)}.", "scope_escalation",
                        fields={"scopes": [f"Not in your token: {', '.join(extra)}"]})
    return wanted

