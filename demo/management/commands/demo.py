"""The demo world of `make run`: an admin, a project, and a worker service account with its token."""
import os
import secrets
import shutil
import sys
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand
from django.db import transaction

from mado import services
from mado.choices import Role, Scope, TokenKind
from mado.models import ApiToken, Project, ServiceAccount
from mado.tokens import hash_token

SAMPLE_CODE = (
    "import json, os, pathlib, time\n"
    "for step in range(3):\n"
    "    print(f'step {step}: hello from the local computer', flush=True)\n"
    "    time.sleep(1)\n"
    "pathlib.Path(os.environ['MMT_RESULT_FILE']).write_text(json.dumps({'version': 2, 'complete': True,\n"
    "    'metrics': [{'name': 'demo.loss', 'value': 1.0 / (s + 1), 'step': s} for s in range(3)]}))\n"
)
WORKER_SCOPES = [Scope.READ.value, Scope.WORKER_EXECUTE.value, Scope.ARTIFACTS_WRITE.value]
# `make run` starts the demo worker with MMT_WORKER_TARGET_IDS read from this file in var/: the worker
# then serves the Local computer by id, so the checks of its details (which name no worker) reach it.
TARGET_IDS_FILE = "worker-target-ids"


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def write_private(path: Path, text: str) -> None:
    """Write a secret file readable by its owner only, mode 600 from the first byte."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text + "\n")
    os.replace(tmp, path)


class Command(BaseCommand):
    help = "Create the demo admin, the demo project and a worker token (idempotent)."

    def handle(self, *args, **options):
        var = Path(settings.VAR_DIR)
        with transaction.atomic():
            password = self._admin(var)
            project = Project.objects.filter(slug="demo").first() or services.create_project(
                services.SYSTEM, slug="demo", name="Demo")
            admin = User.objects.get(username="admin")
            account = ServiceAccount.objects.filter(project=project, name__iexact="local-worker").first()
            if account is None:
                account = services.create_service_account(
                    services.Actor(user=admin), project, name="local-worker", role=Role.ADMIN,
                    description="The worker that `make run` starts for the Local computer.")
            target_ids = ""
            if settings.DEV_MODE:
                local = self._local_computer(admin, var)
                self._sample_job(admin, project, local)
                target_ids = str(local.pk)
            write_text(var / TARGET_IDS_FILE, target_ids)
            token_file = var / "worker-token"
            if not self._token_still_works(token_file):
                _, plaintext = services.issue_token(
                    services.Actor(user=admin), user=account.user, project=project, scopes=WORKER_SCOPES,
                    kind=TokenKind.SERVICE, name="demo worker")
                write_private(token_file, plaintext)
        self.stdout.write(f"Demo ready. Sign in at {settings.PUBLIC_URL}/ as admin with password: {password}")
        self.stdout.write(f"(The password is kept in {var / 'admin-password'}; the worker token in {token_file}.)")

    def _admin(self, var: Path) -> str:
        password_file = var / "admin-password"
        admin = User.objects.filter(username="admin").first()
        if admin is not None and password_file.exists():
            return password_file.read_text().strip()
        password = secrets.token_urlsafe(12)
        if admin is None:
            admin = User.objects.create_superuser("admin", email="admin@example.invalid", password=password)
            services.audit(services.SYSTEM, "user.create", admin, after={"username": "admin", "superuser": True})
        else:
            admin.set_password(password)
            admin.save(update_fields=["password"])
        write_private(password_file, password)
        return password

    def _local_computer(self, admin, var: Path):
        """A Local computer, run by the worker that `make run` starts next to the server."""
        from computers.models import ComputeTarget
        from computers.services import register_computer

        existing = ComputeTarget.objects.filter(name="local").first()
        if existing is not None:
            return existing
        workdir = var / "local-jobs"
        workdir.mkdir(parents=True, exist_ok=True)
        local = register_computer(services.Actor(user=admin), {
            "name": "local", "kind": "local", "visibility": "private", "enabled": True,
            "working_dir": str(workdir), "python_path": shutil.which("python3") or sys.executable,
            "runtimes": ["python"], "concurrency": 2,
        })
        self.stdout.write("Created the Local computer 'local' (development mode).")
        return local

    def _sample_job(self, admin, project, local) -> None:
        """One job for the local worker to run at once, so the Jobs page shows a whole run."""
        from jobs.models import Job
        from jobs.services import create_job

        if Job.objects.filter(project=project).exists():
            return
        job = create_job(services.Actor(user=admin), project, {
            "computer": local.pk, "runtime": "python", "name": "hello-local",
            "command": ["python", "-c", SAMPLE_CODE],
        })
        self.stdout.write(f"Queued the sample job {job.pk} on 'local': see {settings.PUBLIC_URL}/projects/demo/jobs/")

    @staticmethod
    def _token_still_works(token_file: Path) -> bool:
        if not token_file.exists():
            return False
        return ApiToken.objects.usable().filter(token_hash=hash_token(token_file.read_text().strip())).exists()
