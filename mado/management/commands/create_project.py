from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError

from mado import services
from mado.choices import Role
from mado.errors import ServiceError


class Command(BaseCommand):
    help = "Create a project (audited), optionally with its first admin."

    def add_arguments(self, parser):
        parser.add_argument("identifier", help="Lower-case letters, digits and hyphens, e.g. vision-lab.")
        parser.add_argument("--name", default="", help="Display name; defaults to the identifier.")
        parser.add_argument("--admin", default="", help="Username to make the project's first admin.")

    def handle(self, *args, identifier, name, admin, **options):
        admin_user = None
        if admin:
            admin_user = User.objects.filter(username=admin).first()
            if admin_user is None:
                raise CommandError(f"No user named {admin}; create it first (manage.py createsuperuser or Django admin).")
        try:
            project = services.create_project(services.SYSTEM, slug=identifier, name=name)
            if admin_user is not None:
                services.set_membership(services.SYSTEM, project, username=admin, role=Role.ADMIN)
        except ServiceError as error:
            raise CommandError(error.message) from None
        self.stdout.write(f"Created project {project.slug}" + (f" with admin {admin}." if admin else "."))
