"""The one permission class of the API: it checks the token's scope for each view and method.
Project roles are checked by the views through mado.access; scopes only narrow what a token may do."""
from __future__ import annotations

from rest_framework import exceptions
from rest_framework.permissions import SAFE_METHODS, BasePermission

from mado.choices import Scope


class JobTokenForbidden(exceptions.PermissionDenied):
    default_detail = "A job token may only read its project and write its own job's logs, metrics and outputs."
    default_code = "job_token_forbidden"


class LauncherTokenForbidden(exceptions.PermissionDenied):
    default_detail = "A launcher token reaches only the launcher endpoints (/api/launcher/...)."
    default_code = "launcher_token_forbidden"


class MissingScope(exceptions.PermissionDenied):
    default_code = "missing_scope"


def required_scope(view, method: str) -> str | None:
    """Views declare `required_scopes = {"GET": "read", "POST": "admin"}`; reads default to `read`.
    A method absent from the map of a non-safe request needs `admin`, so forgetting to declare fails closed."""
    declared = getattr(view, "required_scopes", None) or {}
    if method in declared:
        return declared[method]
    if method in SAFE_METHODS:
        return Scope.READ.value
    return Scope.ADMIN.value


class ScopePermission(BasePermission):
    def has_permission(self, request, view):
        principal = request.auth
        if getattr(principal, "kind", None) == "launcher" and not getattr(view, "allow_launcher_token", False):
            raise LauncherTokenForbidden()
        if getattr(view, "public", False):
            return True
        if not request.user or not request.user.is_authenticated:
            raise exceptions.NotAuthenticated(
                "Sign in, or send an API token as 'Authorization: Bearer <token>'."
            )
        if principal is None:  # browser session: the user's role decides, in the view
            return True
        if principal.is_job and request.method not in SAFE_METHODS and not getattr(view, "allow_job_token", False):
            raise JobTokenForbidden()
        scope = required_scope(view, request.method)
        if scope and scope not in principal.scopes:
            raise MissingScope(f"This token lacks the {scope} scope; issue a token that has it.")
        return True
