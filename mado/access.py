"""Who may do what in a project. Every view, serializer and template asks these helpers, so a rule
lives in one place."""
from __future__ import annotations

import copy

from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import PermissionDenied
from django.http import Http404

from mado.choices import Role
from mado.models import ApiToken, Membership, Project, ServiceAccount, role_at_least


def service_account_of(user: User) -> ServiceAccount | None:
    try:
        return user.service_account
    except (ServiceAccount.DoesNotExist, AttributeError):
        return None


def job_principal(creator: User, project: Project, role: str) -> User:
    """The user a job token acts as: its creator, limited to the creator's role in the job's project.
    A copy, never saved: a global administrator's job must not act as a global administrator."""
    user = copy.copy(creator)
    user.is_superuser = False
    user.is_staff = False
    user.job_scope = (project.pk, role)
    return user


def is_job_principal(user) -> bool:
    return getattr(user, "job_scope", None) is not None


def remember_roles(user) -> None:
    """For a user object that lives one request (an API call's, fresh from its token): its role in a
    project is then looked up once per request, not at every check. Other user objects (sessions,
    services' callers, tests holding one across role changes) are asked every time."""
    user.remembered_roles = {}


def remember_role(user, project: Project, role: str | None) -> None:
    """A role read along with something else (tracking reads it with the Run), for remember_roles' users."""
    memo = getattr(user, "remembered_roles", None)
    if memo is not None:
        memo[project.pk] = role


def role_is_a_membership(user) -> bool:
    """Whether project_role reads the caller's role from a Membership row and from nothing else: not for
    job principals, global administrators and service accounts, whose roles it knows without a query."""
    return not (is_job_principal(user) or user.is_superuser or service_account_of(user) is not None)


def project_role(user: User | AnonymousUser, project: Project) -> str | None:
    """The caller's role in the project: global administrators are admins everywhere; a service
    account has its own role in its one project; others have their membership's role; a job token
    has its creator's role in the job's project only."""
    if not user.is_authenticated:
        return None
    memo = getattr(user, "remembered_roles", None)
    if memo is None:
        return _project_role(user, project)
    if project.pk not in memo:
        memo[project.pk] = _project_role(user, project)
    return memo[project.pk]


def _project_role(user, project: Project) -> str | None:
    if is_job_principal(user):
        project_id, role = user.job_scope
        return role if project.pk == project_id else None
    if user.is_superuser:
        return Role.ADMIN
    account = service_account_of(user)
    if account is not None:
        if account.project_id == project.pk and not account.is_disabled:
            return account.role
        return None
    membership = Membership.objects.filter(project=project, user=user).only("role").first()
    return membership.role if membership else None


def has_role(user, project: Project, minimum: str) -> bool:
    return role_at_least(project_role(user, project), minimum)


def projects_visible_to(user):
    if not user.is_authenticated:
        return Project.objects.none()
    if is_job_principal(user):
        return Project.objects.filter(pk=user.job_scope[0])
    if user.is_superuser:
        return Project.objects.all()
    account = service_account_of(user)
    if account is not None:
        return Project.objects.filter(pk=account.project_id) if not account.is_disabled else Project.objects.none()
    return Project.objects.filter(memberships__user=user)


def tokens_visible_to(user, project: Project):
    """Project admins see every token of the project; others only their own."""
    tokens = ApiToken.objects.filter(project=project).select_related("user", "user__service_account")
    if has_role(user, project, Role.ADMIN):
        return tokens
    return tokens.filter(user=user)


def can_revoke(user, token: ApiToken) -> bool:
    return token.user_id == user.pk or has_role(user, token.project, Role.ADMIN)


def is_service_user(user) -> bool:
    return service_account_of(user) is not None


def project_for_user(user, slug: str, minimum: str = Role.VIEWER) -> Project:
    """The project if the user may see it with at least `minimum`. Projects the user cannot see at
    all are 404, never 403, so their names do not leak."""
    project = projects_visible_to(user).filter(slug=slug).first()
    if project is None:
        raise Http404(f"No project {slug} that you can see; check the project identifier.")
    if not has_role(user, project, minimum):
        raise PermissionDenied(f"This needs the {minimum} role in project {project.slug}; ask a project admin.")
    return project


def holder_label(user) -> str:
    """How a token's holder is named on pages, in the API and in audit rows."""
    account = service_account_of(user)
    return f"service account {account.name}" if account else user.username


def projects_with_roles(user) -> list[tuple[Project, str, bool]]:
    """Every project the user has a role in, with that role and whether it comes from being a global
    administrator (an Admin everywhere, usually without a membership row) rather than a membership."""
    if not user.is_authenticated or is_service_user(user) or is_job_principal(user):
        return []
    roles = dict(Membership.objects.filter(user=user).values_list("project_id", "role"))
    result = []
    for project in projects_visible_to(user).order_by("name", "slug"):
        if user.is_superuser:
            result.append((project, Role.ADMIN, roles.get(project.pk) != Role.ADMIN))
        else:
            result.append((project, roles[project.pk], False))
    return result


def can_manage_members(user, project: Project) -> bool:
    """Project admins (and global administrators) add, change and remove members; service accounts
    never manage people, whatever their role."""
    return not is_service_user(user) and has_role(user, project, Role.ADMIN)


def is_global_admin(user) -> bool:
    """A global administrator acting in person (signed in, or with their own token): never through a
    job's token, never as a service account. The one spelling of this check."""
    return bool(user is not None and user.is_authenticated and user.is_superuser
                and not is_job_principal(user) and not is_service_user(user))


def can_manage_users(user) -> bool:
    """Creating people's accounts and their set-password links is for global administrators."""
    return is_global_admin(user)
