from django.core.management.base import BaseCommand, CommandError

from mado import downloads


class Command(BaseCommand):
    help = ("Build the agent distribution (mado-tracking wheel and sdist) from this checkout into "
            "VAR_DIR/downloads, where /downloads/ serves it. Run it after every deployment of new code.")

    def handle(self, *args, **options):
        try:
            manifest = downloads.build()
        except downloads.BuildError as error:
            raise CommandError(str(error)) from None
        for f in manifest["files"]:
            self.stdout.write(f"{f['filename']}  sha256={f['sha256']}  {f['size']} bytes")
        self.stdout.write(f"Serving mado-tracking {manifest['version']} at /downloads/ (from {downloads.directory()}).")
