from django.conf import settings
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError

from mado import access, services
from mado.choices import Scope, TokenKind
from mado.errors import ServiceError
from mado.models import Project, ServiceAccount


class Command(BaseCommand):
    help = "Print a new API token for a user or a service account of a project (for scripts and first set-up)."

    def add_arguments(self, parser):
        parser.add_argument("username", help="A username, or the name of a service account of the project.")
        parser.add_argument("--project", required=True, help="The project identifier.")
        parser.add_argument("--scopes", required=True, help=f"Comma-separated: {', '.join(Scope.values)}.")
        parser.add_argument("--expires-days", type=int, default=settings.TOKEN_MAX_DAYS,
                            help=f"1–{settings.TOKEN_MAX_DAYS}, default {settings.TOKEN_MAX_DAYS}.")

    def handle(self, *args, username, project, scopes, expires_days, **options):
        project_obj = Project.objects.filter(slug=project).first()
        if project_obj is None:
            raise CommandError(f"No project {project}; list them with the API or Django admin, or create it first.")
        account = ServiceAccount.objects.filter(project=project_obj, name__iexact=username).first()
        user = account.user if account else User.objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user or service account named {username} in project {project}.")
        if access.project_role(user, project_obj) is None:
            raise CommandError(f"{username} has no role in project {project}; add the membership first.")
        scope_list = [s.strip() for s in scopes.split(",") if s.strip()]
        kind = TokenKind.SERVICE if account else TokenKind.PERSONAL
        try:
            _, plaintext = services.issue_token(services.SYSTEM, user=user, project=project_obj, scopes=scope_list,
                                                expires_in_days=expires_days, kind=kind, name="create_token")
        except ServiceError as error:
            raise CommandError(error.message) from None
        self.stdout.write(plaintext)
