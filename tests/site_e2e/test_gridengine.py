"""A site's Job through a real Grid Engine (Son of Grid Engine 8.1.9 with the recipe's five fixes,
tests/peers/gridengine.py) end to end: the launcher logs in to the real sshd as the login user, writes
the spec directory and runs the built-in Grid Engine job shell (qsub -terse, with SGE_ROOT and SGE_CELL
exported from site variables); the execd runs the batch script, which execs the runner under its
`timeout` from the spec directory, and the runner reports with the job token. See conftest.py."""
from __future__ import annotations

import re
import socket

from jobs.models import JobEvent, Metric
from tests.site_e2e.conftest import TICKER, expected_lines, numbered, ticks
from tests.support import wait_for


def test_a_job_goes_through_grid_engine_and_finishes_with_its_logs_and_qsub_id(gridengine_site, gridengine, sshd):
    site = gridengine_site
    job = site.job(numbered(100), walltime_seconds=600)
    site.round()
    row = site.submission(job)
    assert row.status == "submitted", row.error
    sge_id = row.scheduler_job_id
    assert re.fullmatch(r"[0-9]+", sge_id), sge_id
    assert gridengine.state(sge_id) in ("qw", "t", "r"), gridengine.state(sge_id)
    details = gridengine.run("qstat", "-j", sge_id, check=False).stdout
    if details:  # unless it already ended
        assert re.search(rf"^job_name:\s+mmt-{job.pk}$", details, re.MULTILINE), details
        assert re.search(rf"^owner:\s+{sshd.user}$", details, re.MULTILINE), details
        assert re.search(r"^hard resource_list:\s+h_rt=600$", details, re.MULTILINE), details

    job = site.wait_status(job, "finished", "failed", "canceled")
    assert (job.status, job.exit_code, job.end_reason) == ("finished", 0, "exit_code"), job.error
    assert site.log(job) == expected_lines(job, 100)
    assert [(m.name, m.value) for m in Metric.objects.filter(job=job)] == [("loss", 0.25)]
    row = site.submission(job)
    assert (row.scheduler_job_id, row.runner_hostname) == (sge_id, socket.gethostname())
    kinds = list(JobEvent.objects.filter(job=job).order_by("id").values_list("kind", flat=True))
    assert kinds.index("submitted") < kinds.index("runner_started") < kinds.index("started") < \
        kinds.index("finished"), kinds
    wait_for(lambda: gridengine.state(sge_id) is None, timeout=30, what="the job to leave the queue")
    assert len(list(site.spec_dir(job).glob(f"sge-{sge_id}.*.out"))) == 1


def test_a_walltime_shorter_than_the_job_ends_it_timed_out_under_grid_engine(gridengine_site, gridengine):
    """h_rt ends a job with SIGKILL, so the job shell's batch script runs the runner under `timeout`,
    which sends SIGTERM half of a short limit early (mmt_lead_seconds): 10 s into a 20 s limit."""
    site = gridengine_site
    job = site.job(TICKER, walltime_seconds=20)
    site.round()
    sge_id = site.submission(job).scheduler_job_id
    details = gridengine.run("qstat", "-j", sge_id, check=False).stdout
    assert re.search(r"^hard resource_list:\s+h_rt=20$", details, re.MULTILINE), details

    job = site.wait_status(job, "failed", "finished", "canceled", timeout=60)
    assert (job.status, job.end_reason) == ("failed", "timed_out"), job.error
    got = ticks(site.log(job))
    assert got and got == list(range(len(got))) and len(got) < 60, got[-3:]
    wait_for(lambda: gridengine.state(sge_id) is None, timeout=30, what="the job to leave the queue")
