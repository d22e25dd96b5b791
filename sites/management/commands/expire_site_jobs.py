"""End site Jobs past their deadlines now (the server also does this on its own at most once a second
while launchers, runners or people use it): `submitting` without a report for 15 minutes, and
`submitted` without a runner within the site's queue timeout. Suits a cron job on quiet servers."""
from __future__ import annotations

from django.core.management.base import BaseCommand

from sites import checks, submissions


class Command(BaseCommand):
    help = "Fail site Jobs whose submission report or runner did not arrive in time; expire unanswered site checks."

    def handle(self, *args, **options):
        ended = submissions.expire_overdue(force=True)
        checks.expire_checks(force=True)
        self.stdout.write(f"Ended {ended} overdue site Job{'s' if ended != 1 else ''}.")
