from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class Role(models.TextChoices):
    VIEWER = "viewer", _("Viewer")
    MEMBER = "member", _("Member")
    ADMIN = "admin", _("Admin")


ROLE_RANK = {Role.VIEWER: 1, Role.MEMBER: 2, Role.ADMIN: 3}


class Scope(models.TextChoices):
    READ = "read", "read"
    JOBS_WRITE = "jobs:write", "jobs:write"
    RUNS_WRITE = "runs:write", "runs:write"
    ARTIFACTS_WRITE = "artifacts:write", "artifacts:write"
    REGISTRY_WRITE = "registry:write", "registry:write"
    WORKER_EXECUTE = "worker:execute", "worker:execute"
    ADMIN = "admin", "admin"
    LAUNCHER_EXECUTE = "launcher:execute", "launcher:execute"
    METRICS_READ = "metrics:read", "metrics:read"


# The least project role a token's holder needs for each scope to be issued. worker:execute is
# further limited to admin-role service accounts; launcher:execute to launcher tokens; metrics:read (the
# whole server's figures at /metrics) to global administrators' own tokens.
SCOPE_MIN_ROLE = {
    Scope.READ: Role.VIEWER,
    Scope.JOBS_WRITE: Role.MEMBER,
    Scope.RUNS_WRITE: Role.MEMBER,
    Scope.ARTIFACTS_WRITE: Role.MEMBER,
    Scope.REGISTRY_WRITE: Role.MEMBER,
    Scope.ADMIN: Role.MEMBER,
    Scope.WORKER_EXECUTE: Role.ADMIN,
    Scope.LAUNCHER_EXECUTE: Role.ADMIN,
    Scope.METRICS_READ: Role.ADMIN,
}

USER_SCOPES = [s for s in Scope if s != Scope.LAUNCHER_EXECUTE]


class TokenKind(models.TextChoices):
    PERSONAL = "personal", _("Personal")
    SERVICE = "service", _("Service account")
    LAUNCHER = "launcher", _("Launcher")
