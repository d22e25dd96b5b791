"""State changes of the identity app. Each runs in one transaction and writes an AuditEvent."""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

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
    return AuditEvent.objects.create(
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
    if actor.user is not None and not actor.user.is_superuser:
        raise Forbidden("Only global administrators can create projects.", "global_admin_required")
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


def set_membership(actor: Actor, project: Project, *, username: str, role: str) -> Membership:
    _require_role(actor, project, Role.ADMIN, "Only project admins can add members.")
    if role not in Role.values:
        raise ServiceError(f"Role must be one of {', '.join(Role.values)}.", "invalid_role", fields={"role": ["Unknown role."]})
    user = User.objects.filter(username=username).first()
    if user is None:
        raise ServiceError(f"No user named {username}; check the spelling or create the user first.", "unknown_user",
                           fields={"username": ["Unknown user."]})
    if access.is_service_user(user):
        raise ServiceError("Service accounts belong to one project and cannot be added as members.",
                           "service_account_not_member", fields={"username": ["This is a service account."]})
    with transaction.atomic():
        # get_or_create on the unique (project, user): two admins adding the same person at once
        # end with one membership.
        membership, created = Membership.objects.select_for_update().get_or_create(
            project=project, user=user, defaults={"role": role})
        before = None if created else {"role": membership.role}
        if not created:
            membership.role = role
            membership.save(update_fields=["role"])
        audit(actor, "membership.create" if created else "membership.update", membership, project=project,
              before=before, after={"username": username, "role": role})
    return membership


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
    that it is an admin-role service account)."""
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
    plaintext = tokens.new_token(tokens.JOB_TOKEN_PREFIX)
    token = JobToken.objects.create(
        job_id=job_id, lease_id=lease_id, project=project, user=user,
        prefix=tokens.display_prefix(plaintext), token_hash=tokens.hash_token(plaintext),
    )
    return token, plaintext


def revoke_job_tokens(job_id: int) -> int:
    """Called when a job ends: its code can no longer record anything."""
    return JobToken.objects.filter(job_id=job_id, revoked_at__isnull=True).update(revoked_at=timezone.now())


# helpers ----------------------------------------------------------------------------------------

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

