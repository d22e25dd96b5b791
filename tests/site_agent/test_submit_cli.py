"""`mado-tracking submit` against the live server: a manual site's waiting Jobs submitted with the
job shell run locally, the reports, the errors and their exit codes (0 ok, 1 a submission failed, 2
configuration or API error, 130 interrupted), and reports kept from an earlier run sent first."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys

import pytest
from click.testing import CliRunner

from jobs.models import Job
from sites import submissions
from tests.conftest import bearer
from tests.peers.sshd import free_port
from tests.site_agent.site_world import FAILING, make_site, queue, registered, server  # noqa: F401
from tests.support import wait_for
from worker_agent.researcher import main
from worker_agent.site.launcher import PendingReports
from worker_agent.site.submit import state_dir


@pytest.fixture
def manual_site(server, registered, world, sshd, tmp_path):
    def make(**overrides):
        return make_site(world, registered[0], sshd, tmp_path / "site-work", server, submission="manual",
                         **overrides)

    return make


def submit(*args, token=None, url=None, env=None):
    environment = {"MMT_API_URL": url, "MMT_API_TOKEN": token, **(env or {})}
    return CliRunner().invoke(main, ["submit", *map(str, args)], env=environment)


def test_submit_runs_the_job_shell_here_for_my_waiting_jobs_and_reports_them(manual_site, world, server, tmp_path,
                                                                            isolated_home):
    target = manual_site()
    mine = queue(target, world.project_admin, world.project, n=2, status="waiting_manual")
    others, = queue(target, world.member, world.project, status="waiting_manual")
    work = tmp_path / "elsewhere"
    result = submit("--site", target.pk, "--work-dir", work, "--var", f"OUT={work}",
                    token=world.member_token(world.project_admin), url=server)
    assert result.exit_code == 0, result.output
    first = min(j.pk for j in mine)
    assert f"Jobs {mine[0].pk}, {mine[1].pk}: submitted as scheduler job 77{first}." in result.stdout
    for job in mine:
        job.refresh_from_db()
        assert (job.status, job.submission.scheduler_job_id) == ("submitted", f"77{first}")
        spec_dir = work / ".mmt-submissions" / str(job.pk)
        assert stat.S_IMODE(os.lstat(spec_dir).st_mode) == 0o700
        assert stat.S_IMODE(os.lstat(spec_dir / "job.json").st_mode) == 0o600
    others.refresh_from_db()
    assert others.status == "waiting_manual"
    assert "mado_mtj_" not in result.output


def test_a_failing_job_shell_exits_1_and_the_job_fails_with_the_masked_stderr(manual_site, world, server,
                                                                             isolated_home):
    target = manual_site(job_shell=FAILING)
    job, = queue(target, world.project_admin, world.project, status="waiting_manual")
    result = submit("--site", target.pk, token=world.member_token(world.project_admin), url=server)
    assert result.exit_code == 1, result.output
    assert f"Job {job.pk}: submission failed:" in result.stderr and "Invalid account" in result.stderr
    job.refresh_from_db()
    assert (job.status, job.end_reason) == ("failed", "submit_failed")
    assert "mado_mtj_" not in job.error + result.output
    # The Job's error names who ran it; the message itself is theirs (and the owner's) to read (issue 14).
    assert f"failed when {world.project_admin.username} ran mado-tracking submit" in job.error
    assert "Invalid account" not in job.error
    assert "Invalid account" in submissions.failure_detail(world.project_admin, job)
    assert submissions.failure_detail(world.member, job) == ""


def test_dry_run_shows_the_waiting_count_and_the_settings_and_claims_nothing(manual_site, world, server,
                                                                            isolated_home):
    target = manual_site()
    queue(target, world.project_admin, world.project, n=3, status="waiting_manual")
    result = submit("--site", target.pk, "--dry-run", "--all", token=world.member_token(world.project_admin),
                    url=server)
    assert result.exit_code == 0, result.output
    assert f"Computer {target.pk} (hpc-cluster): 3 of your Jobs wait for manual submission; 3 in the project " \
           "with --all." in result.stdout
    assert "Job shell version: 1" in result.stdout and "Nothing was submitted (--dry-run)." in result.stdout
    assert Job.objects.filter(target=target, status="waiting_manual").count() == 3


def test_all_by_someone_who_does_not_own_the_computer_is_explained_and_exits_2(manual_site, world, server,
                                                                              isolated_home):
    target = manual_site()
    result = submit("--site", target.pk, "--all", token=world.member_token(world.member), url=server)
    assert result.exit_code == 2
    assert "only the computer's owner may use it (403 site_owner_required)" in result.stderr
    assert "Run it without --all" in result.stderr


def test_configuration_and_api_errors_exit_2_with_what_to_do(manual_site, world, server, isolated_home):
    target = manual_site()
    token = world.member_token(world.project_admin)
    no_token = submit("--site", target.pk, url=server)
    assert no_token.exit_code == 2 and "Set MMT_API_TOKEN" in no_token.stderr
    no_url = submit("--site", target.pk, token=token)
    assert no_url.exit_code == 2 and "Set MMT_API_URL" in no_url.stderr
    wrong_url = submit("--site", target.pk, token=token, url=f"http://127.0.0.1:{free_port()}")
    assert wrong_url.exit_code == 2 and "Cannot reach the API server" in wrong_url.stderr
    job_token = submit("--site", target.pk, token="mado_mtj_" + "x" * 40, url=server)
    assert job_token.exit_code == 2 and "job token" in job_token.stderr
    unknown = submit("--site", 999999, token=token, url=server)
    assert unknown.exit_code == 2 and "Check --site 999999" in unknown.stderr
    both = submit("--site", target.pk, "--dry-run", "--watch", token=token, url=server)
    assert both.exit_code == 2 and "Choose --dry-run or --watch" in both.stderr
    bad_var = submit("--site", target.pk, "--var", "1X=y", token=token, url=server)
    assert bad_var.exit_code == 2 and "--var '1X=y'" in bad_var.stderr
    for result in (no_token, no_url, wrong_url, unknown, both, bad_var):
        assert token not in result.output


def test_a_report_kept_from_an_earlier_run_is_sent_first(manual_site, world, server, isolated_home):
    target = manual_site()
    job, = queue(target, world.project_admin, world.project, status="waiting_manual")
    token = world.member_token(world.project_admin)
    claimed = bearer(token).post(f"/api/sites/{target.pk}/submissions/claim", {}, format="json").json()["items"]
    pending = PendingReports(state_dir(target.pk) / "pending")
    pending.save(f"sites/{target.pk}/submissions/report",
                 {"job_ids": claimed[0]["job_ids"], "outcome": "submitted", "scheduler_job_id": "555"})
    assert str(pending.dir).startswith(str(isolated_home / ".local" / "state" / "mado-tracking" / "submit"))

    result = submit("--site", target.pk, token=token, url=server)
    assert result.exit_code == 0, result.output
    assert "Sent 1 report(s) kept from an earlier run." in result.stdout
    job.refresh_from_db()
    assert (job.status, job.submission.scheduler_job_id) == ("submitted", "555")
    assert pending.files() == []


def test_watch_stops_with_130_on_ctrl_c(manual_site, world, server, tmp_path, isolated_home, monkeypatch):
    target = manual_site()
    claims = []  # the Jobs each of the watch's claims got, noted as the live server (this process) answers it
    real_claim = submissions.manual_claim

    def noting(*args, **kwargs):
        items = real_claim(*args, **kwargs)
        claims.append(len(items))
        return items

    monkeypatch.setattr(submissions, "manual_claim", noting)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MMT_")}, "MMT_API_URL": server,
           "MMT_API_TOKEN": world.member_token(world.project_admin), "HOME": str(isolated_home)}
    process = subprocess.Popen([sys.executable, "-c", "from worker_agent.researcher import main; main()", "submit",
                                "--site", str(target.pk), "--watch", "--interval", "1"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # A round that found nothing has been answered: the Job queued now is found by a later round of the watch.
    wait_for(lambda: claims, timeout=60, what=lambda: f"the watch's first claim (exit code {process.poll()})")
    job, = queue(target, world.project_admin, world.project, status="waiting_manual", name="later")
    wait_for(lambda: Job.objects.get(pk=job.pk).status != "waiting_manual", timeout=20, interval=0.1,
             what=lambda: f"a later round to claim Job {job.pk} (claims so far: {claims})")
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=20)
    assert process.returncode == 130, err
    assert f"Job {job.pk}: submitted as scheduler job 77{job.pk}." in out
    assert claims[0] == 0 and 1 in claims, f"a later round than the first claimed the Job: {claims}"
    assert "finishing this round" in err
    assert json.dumps(env["MMT_API_TOKEN"])[1:-1] not in out + err
