"""The job's log shows the `[mado]` lines and the program's own lines in the order they happened
(issue 15, item 15): a real `mado-tracking-worker run` following jobs over the loopback sshd, the log
read as the job page and `…/log.txt` show it (chunks in the order they were stored)."""
from __future__ import annotations

from django.db import transaction

from jobs import services as job_services
from jobs.models import LogChunk
from mado.services import Actor

FIRST_LINE = "the program's first line"
PROGRAM = f"print({FIRST_LINE!r}, flush=True)\nprint('its second line', flush=True)\n"
TRAPS = """\
import signal, sys, time
def on_term(signum, frame):
    print("got SIGTERM: saving a checkpoint", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def job_log(job) -> list[str]:
    """The lines of the job page's log (jobs/views.py: every chunk in the order it was stored)."""
    return "".join(LogChunk.objects.filter(job_id=job.pk).order_by("id").values_list("data", flat=True)).splitlines()


def test_the_venv_lines_come_before_the_programs_first_line(e2e):
    e2e.start_worker()
    first = e2e.create_job(command=["python", "-c", PROGRAM])
    e2e.assert_ended_once(e2e.wait_ended(first, timeout=120), "finished")
    lines = job_log(first)
    assert lines[0].startswith("[mado] Creating a venv with /usr/bin/python3"), lines
    assert lines.index("[mado] The venv is ready.") < lines.index(FIRST_LINE), lines
    assert lines[lines.index(FIRST_LINE):] == [FIRST_LINE, "its second line"], lines

    second = e2e.create_job(command=["python", "-c", PROGRAM])
    e2e.assert_ended_once(e2e.wait_ended(second, timeout=60), "finished")
    lines = job_log(second)
    assert lines[0].startswith("[mado] Reusing the venv for these requirements ("), lines
    assert lines[1:] == [FIRST_LINE, "its second line"], lines


def test_the_stop_note_comes_between_what_the_program_said_before_and_after_it(e2e):
    e2e.start_worker()
    job = e2e.create_job(command=["python", "-c", TRAPS])
    e2e.wait_log(job, "ready", timeout=60)
    with transaction.atomic():
        job_services.request_stop(Actor(e2e.world.member), e2e.job(job))
    e2e.assert_ended_once(e2e.wait_ended(job, timeout=30), "canceled")
    lines = [line for line in job_log(job) if "venv" not in line]
    assert lines == ["ready", "[mado] Stop requested: sending SIGTERM; SIGKILL follows after 3 s.",
                     "got SIGTERM: saving a checkpoint"], lines
