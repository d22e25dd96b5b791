"""The shared fixture world: a global admin, a project admin (alice, who also owns computers in some
tests), a member, a viewer, an outsider, an admin-role service account set up by the global admin with
a worker token, and alice's own service account, in project `lab`; plus API clients for each."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from mado import services
from mado.choices import Role, TokenKind
from mado.models import Membership, Project

# Fixture modules shared by many test files (computers, scripted workers, jobs).
# The real schedulers are session fixtures registered once here: importing them into several conftest
# modules would make one instance per module (two Slurm clusters, and a second Grid Engine blocked on
# the first one's lock).
pytest_plugins = ["tests.computer_fixtures", "tests.job_fixtures", "tests.peers.slurm", "tests.peers.gridengine"]

ALL_MEMBER_SCOPES = ["read", "jobs:write", "runs:write", "artifacts:write", "registry:write", "admin"]
WORKER_SCOPES = ["read", "worker:execute", "artifacts:write"]


class World:
    def __init__(self):
        self.project = Project.objects.create(slug="lab", name="Lab")
        self.other_project = Project.objects.create(slug="other", name="Other")
        self.global_admin = User.objects.create_superuser("root", password="root-pass-123")
        self.project_admin = self._user("alice", Role.ADMIN)
        self.member = self._user("bob", Role.MEMBER)
        self.viewer = self._user("carol", Role.VIEWER)
        self.outsider = User.objects.create_user("mallory", password="mallory-pass-123")
        Membership.objects.create(project=self.other_project, user=self.outsider, role=Role.ADMIN)
        # The worker's service account is set up by a global administrator, so its worker serves the
        # project's jobs on Public computers and on the global administrator's Private ones.
        self.service_account = services.create_service_account(
            services.Actor(self.global_admin), self.project, name="gpu-host-1-worker", role=Role.ADMIN
        )
        self.worker_token = self.token(self.service_account.user, WORKER_SCOPES, kind=TokenKind.SERVICE)
        # A researcher's own service account: it may use alice's Private computers.
        self.alices_account = services.create_service_account(
            services.Actor(self.project_admin), self.project, name="alice-bot", role=Role.ADMIN
        )

    def _user(self, username: str, role: str) -> User:
        user = User.objects.create_user(username, password=f"{username}-pass-123")
        Membership.objects.create(project=self.project, user=user, role=role)
        return user

    def token(self, user: User, scopes: list[str], *, project: Project | None = None, kind=TokenKind.PERSONAL,
              days: int | None = None) -> str:
        _, plaintext = services.issue_token(services.SYSTEM, user=user, project=project or self.project,
                                            scopes=scopes, kind=kind, expires_in_days=days)
        return plaintext

    def member_token(self, user: User, project: Project | None = None) -> str:
        project = project or self.project
        scopes = services.allowed_scopes(user, project, TokenKind.PERSONAL)
        return self.token(user, scopes, project=project)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's, and at the end of the session: the live server's request threads may still hold
    database sessions (a client's keep-alive connection outlives its test); they are ended before the test
    database is dropped, or DROP DATABASE waits 5 s for them and then fails, leaving the database behind."""
    yield
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    # The default PBKDF2 costs ~0.3 s per user; the fixture world creates several.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def world(db) -> World:
    return World()


def bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.fixture
def api():
    return bearer


def assert_error(response, status: int, code: str | None = None) -> dict:
    """Every API error has the same body: a sentence saying what to fix and a snake_case code."""
    assert response.status_code == status, response.content
    body = response.json()
    assert isinstance(body.get("error"), str) and len(body["error"]) > 10, body
    assert isinstance(body.get("code"), str) and body["code"].replace("_", "").isalnum(), body
    if code is not None:
        assert body["code"] == code, body
    return body
