"""On a site too, the job's log shows the supervisor's `[mado]` lines and the code's own lines in the
order they happened (issue 15, item 15): the real runner on this machine (tests/site_runner) reports a
python-runtime job whose venv is reused; the log read as the job page shows it."""
from __future__ import annotations

from jobs.models import LogChunk
from tests.site_runner.conftest import site, site_work_dir  # noqa: F401  (fixtures)
from tests.sites.conftest import host_keys, launcher, site_fields  # noqa: F401  (fixtures)

FIRST_LINE = "the code's first line"
PROGRAM = f"print({FIRST_LINE!r}, flush=True)\nprint('its second line', flush=True)\n"


def job_log(job) -> list[str]:
    """The lines of the job page's log (jobs/views.py: every chunk in the order it was stored)."""
    return "".join(LogChunk.objects.filter(job_id=job.pk).order_by("id").values_list("data", flat=True)).splitlines()


def run(site, command: list[str]):  # noqa: F811
    job = site.job(command)
    spec_dir, _ = site.submit(job)
    runner = site.start_runner(spec_dir)
    assert runner.wait() == 0, runner.output()
    job.refresh_from_db()
    assert job.status == "finished", job.error
    return job


def test_the_venv_line_comes_before_the_codes_first_line(site):  # noqa: F811
    run(site, ["python", "-c", "print('builds the venv, or finds it built')"])
    lines = job_log(run(site, ["python", "-c", PROGRAM]))
    assert lines[0].startswith("[mado] Reusing the venv for these requirements ("), lines
    assert lines[1:] == [FIRST_LINE, "its second line"], lines
