"""`python manage.py mado_periodic`: every time-based rule, in one loop (mado.periodic)."""
from __future__ import annotations

import signal
import threading

from django.core.management.base import BaseCommand

from mado import periodic


class Command(BaseCommand):
    help = ("Run the time-based rules (workers going offline and online, jobs not responding, expired checks, "
            "site deadlines, requeues, notification delivery) in a loop. Safe to run twice at once.")

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="Run every task once and exit (for scripts and tests).")

    def handle(self, *args, once: bool = False, **options):
        names = ", ".join(sorted(task.name for task in periodic.tasks()))
        if once:
            ran = periodic.run_due(everything=True)
            self.stdout.write(f"Ran {len(ran)} of {len(periodic.tasks())} tasks: {', '.join(ran) or '-'}.")
            return
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        self.stdout.write(f"Periodic runner started with {len(periodic.tasks())} tasks: {names}.")
        self.stdout.flush()
        while not stop.is_set():
            periodic.run_due()
            # Wake for the next due task; a signal ends the wait at once.
            stop.wait(min(max(periodic.seconds_to_next(), 0.05), 5.0))
        self.stdout.write("Periodic runner stopped.")
