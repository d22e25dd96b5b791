"""The launcher against the live server, with the real sshd as the site's login node: keys made and
only their public half published, Jobs claimed, spec directories written over SSH, the job shell run,
reports (submitted with the scheduler id, failed with the masked stderr tail, not tried after a failed
login), connection checks, cancellations, and reports kept on disk while the server is unreachable."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys

from jobs import services as job_services
from jobs.models import Job
from mado import longpoll
from mado.services import Actor
from sites import checks, submissions
from sites.models import LauncherKey, SiteCheck, Submission
from tests.peers.sshd import free_port
from tests.site_agent.conftest import authorize
from tests.site_agent.site_world import FAILING, launcher_for, make_site, queue, registered, server  # noqa: F401
from tests.support import database_now, other_sessions, wait_for
from worker_agent.site.launcher import SiteApi


def ready_launcher(server, registered, world, sshd, remote_dir, tmp_path, **site_overrides):
    """A site and a launcher whose published key the owner registered on the login node."""
    launcher_row, token = registered
    target = make_site(world, launcher_row, sshd, remote_dir, server, **site_overrides)
    agent = launcher_for(server, token, tmp_path / "state")
    os.mkdir(tmp_path / "state", 0o700)
    agent.round(wait=0)
    authorize(sshd, LauncherKey.objects.get(launcher=launcher_row, target=target).public_key)
    return target, agent


def test_the_first_round_makes_a_key_and_publishes_only_its_public_half(server, registered, world, sshd, remote_dir,
                                                                        tmp_path):
    launcher_row, token = registered
    target = make_site(world, launcher_row, sshd, remote_dir, server)
    state = tmp_path / "state"
    os.mkdir(state, 0o700)
    agent = launcher_for(server, token, state)
    sent = []
    real = agent.api.request

    def recording(method, path, body=None, **kwargs):
        sent.append((method, path, json.dumps(body)))
        return real(method, path, body, **kwargs)

    agent.api.request = recording
    agent.round(wait=0)

    private = state / "keys" / f"{target.pk}-shared"
    assert stat.S_IMODE(os.lstat(state / "keys").st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(private).st_mode) == 0o600
    assert private.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    stored = LauncherKey.objects.get(launcher=launcher_row, target=target, user=None)
    public = (state / "keys" / f"{target.pk}-shared.pub").read_text().strip()
    assert stored.public_key.split()[:2] == public.split()[:2]
    assert [p for _, p, _ in sent if p == "launcher/keys"] == ["launcher/keys"]
    assert not any("PRIVATE" in body or private.read_text().splitlines()[1] in body for _, _, body in sent)

    sent.clear()
    agent.round(wait=0)
    assert not any(p == "launcher/keys" for _, p, _ in sent), "the server lists the fingerprint: nothing to publish"


def test_a_waiting_job_is_claimed_written_over_ssh_submitted_and_reported_with_its_id(server, registered, world,
                                                                                      sshd, remote_dir, tmp_path):
    target, agent = ready_launcher(server, registered, world, sshd, remote_dir, tmp_path)
    job, = queue(target, world.project_admin, world.project)
    agent.round(wait=0)

    job.refresh_from_db()
    row = Submission.objects.get(job=job)
    assert (job.status, row.status, row.scheduler_job_id) == ("submitted", "submitted", f"77{job.pk}")
    spec_dir = remote_dir / ".mmt-submissions" / str(job.pk)
    assert os.lstat(spec_dir).st_uid == sshd.home.stat().st_uid
    assert stat.S_IMODE(os.lstat(spec_dir / "job.json").st_mode) == 0o600
    payload = json.loads((spec_dir / "job.json").read_text())
    assert payload["format"] == 1 and payload["api_url"] == server and payload["token"].startswith("mado_mtj_")
    assert payload["job"]["id"] == job.pk


def test_a_failed_login_fails_the_first_submission_and_reports_the_rest_as_not_tried(server, registered, world, sshd,
                                                                                     remote_dir, tmp_path):
    launcher_row, token = registered
    target = make_site(world, launcher_row, sshd, remote_dir, server)
    first, = queue(target, world.project_admin, world.project, walltime_seconds=600)
    second, = queue(target, world.project_admin, world.project, walltime_seconds=1200)  # another array
    os.mkdir(tmp_path / "state", 0o700)
    launcher_for(server, token, tmp_path / "state").round(wait=0)  # its key is not registered on the site

    first.refresh_from_db()
    second.refresh_from_db()
    failed, not_tried = sorted([first, second], key=lambda j: Submission.objects.get(job=j).status)
    assert Submission.objects.get(job=failed).status == "failed"
    assert Submission.objects.get(job=not_tried).status == "not_tried"
    assert failed.status == not_tried.status == "failed"
    # A refused key is what the owner fixes: the Jobs' errors say so (issue 14: nothing about the network).
    assert failed.error.startswith("Not submitted: the login node mmt@127.0.0.1:")
    assert "refused the launcher's key: add the public key" in failed.error
    assert not_tried.error == failed.error
    assert Submission.objects.get(job=not_tried).error.startswith("Not tried: logging in to 127.0.0.1 failed first: ")
    assert "refused the launcher's key" in Submission.objects.get(job=not_tried).error


def test_a_failing_job_shell_reports_its_stderr_tail_with_the_job_token_masked(server, registered, world, sshd,
                                                                             remote_dir, tmp_path):
    target, agent = ready_launcher(server, registered, world, sshd, remote_dir, tmp_path, job_shell=FAILING)
    job, = queue(target, world.project_admin, world.project)
    agent.round(wait=0)

    job.refresh_from_db()
    assert (job.status, job.end_reason) == ("failed", "submit_failed")
    # The scheduler's message, token masked, is the submission's (its owner and global administrators
    # read it on the Job's page); the Job's error says who can (issue 14).
    row = Submission.objects.get(job=job)
    assert row.error.endswith("sbatch: error: Batch job submission failed: Invalid account")
    assert '"token": "****"' in row.error and "mado_mtj_" not in row.error
    assert "Invalid account" not in job.error and "refused the Job" in job.error
    assert submissions.failure_detail(target.owner, job) == row.error


def test_a_connection_check_logs_in_fresh_and_reports_ok_or_the_reason(server, registered, world, sshd, remote_dir,
                                                                       tmp_path):
    target, agent = ready_launcher(server, registered, world, sshd, remote_dir, tmp_path)
    check = checks.request_site_check(Actor(world.project_admin), target, mine=False)
    agent.round(wait=0)
    check.refresh_from_db()
    assert check.status == "succeeded", check.result

    # The key removed from the login node: the next check fails with the reason.
    lines = (sshd.server_dir / "authorized_keys").read_text().splitlines()
    public = LauncherKey.objects.get(target=target).public_key.split()[1]
    (sshd.server_dir / "authorized_keys").write_text("".join(f"{l}\n" for l in lines if public not in l))
    check = checks.request_site_check(Actor(world.project_admin), target, mine=False)
    agent.round(wait=0)
    check.refresh_from_db()
    assert check.status == "failed" and "refused the launcher's key" in check.result["items"][0]["detail"]
    assert SiteCheck.objects.filter(status="claimed").count() == 0


def test_stopping_a_submitted_job_runs_the_cancel_script_over_ssh(server, registered, world, sshd, remote_dir,
                                                                 tmp_path):
    target, agent = ready_launcher(server, registered, world, sshd, remote_dir, tmp_path)
    job, = queue(target, world.project_admin, world.project)
    agent.round(wait=0)
    job_services.request_stop(Actor(world.project_admin), Job.objects.get(pk=job.pk))
    agent.round(wait=0)

    assert (remote_dir / "canceled").read_text() == f"77{job.pk}\n"
    job.refresh_from_db()
    assert job.status == "canceled"


def test_a_report_the_server_cannot_take_is_kept_on_disk_and_sent_first_next_round(server, registered, world, sshd,
                                                                                   remote_dir, tmp_path):
    target, agent = ready_launcher(server, registered, world, sshd, remote_dir, tmp_path)
    job, = queue(target, world.project_admin, world.project)
    item, = agent.api.claim(target.pk, 5)
    unreachable = SiteApi(f"http://127.0.0.1:{free_port()}", registered[1], attempts=1)
    body = {"job_ids": item["job_ids"], "outcome": "submitted", "scheduler_job_id": "4242"}
    assert agent.pending.deliver(unreachable, "launcher/submissions/report", body) is None
    kept = list((tmp_path / "state" / "pending").glob("*.json"))
    assert len(kept) == 1 and stat.S_IMODE(os.lstat(kept[0]).st_mode) == 0o600
    assert registered[1] not in kept[0].read_text()

    agent.round(wait=0)
    job.refresh_from_db()
    assert (job.status, job.submission.scheduler_job_id) == ("submitted", "4242")
    assert list((tmp_path / "state" / "pending").glob("*.json")) == []


def launcher_process(server, token, tmp_path, *args):
    token_file = tmp_path / "launcher-token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MMT_")}, "MMT_API_URL": server,
           "MMT_API_TOKEN_FILE": str(token_file), "MMT_LAUNCHER_STATE_DIR": str(tmp_path / "cli-state")}
    return subprocess.Popen([sys.executable, "-c", "from worker_agent.site.cli import main; main()", "run", *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_run_once_as_a_command_submits_and_logs_no_token_or_key(server, registered, world, sshd, remote_dir,
                                                                tmp_path):
    target, _ = ready_launcher(server, registered, world, sshd, remote_dir, tmp_path)
    # The command has its own state directory: its own key, which the owner registers as well.
    process = launcher_process(server, registered[1], tmp_path, "--once")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert stat.S_IMODE(os.lstat(tmp_path / "cli-state").st_mode) == 0o700
    authorize(sshd, (tmp_path / "cli-state" / "keys" / f"{target.pk}-shared.pub").read_text())
    job, = queue(target, world.project_admin, world.project)
    process = launcher_process(server, registered[1], tmp_path, "--once")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    job.refresh_from_db()
    assert job.status == "submitted"
    assert f"submitted Jobs [{job.pk}] as scheduler job 77{job.pk}" in err
    private = (tmp_path / "cli-state" / "keys" / f"{target.pk}-shared").read_text()
    assert registered[1] not in out + err and "mado_mtj_" not in out + err
    assert private.splitlines()[1] not in out + err and "PRIVATE KEY" not in out + err


def idle_config_polls() -> int:
    """Launcher config polls asleep in the live server's long-poll (it runs in this process)."""
    return longpoll.hub().parked(submissions.SITES_CHANNEL)[0]


def test_sigterm_ends_the_long_poll_at_once(server, registered, world, tmp_path):
    since = database_now()
    process = launcher_process(server, registered[1], tmp_path, "--long-poll", "8")
    wait_for(idle_config_polls, timeout=60,
             what=lambda: f"the launcher's idle config poll to park (exit code {process.poll()})")
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    assert idle_config_polls(), "it exited while the server still held its poll: it did not wait for the answer"
    assert "SIGTERM: stopping after the current step" in err
    # The server holds the abandoned poll until its 8 s are over, then answers no one: its request thread's
    # database session and the long-poll listener's must be gone before the test database is flushed.
    wait_for(lambda: not idle_config_polls() and not other_sessions(since), timeout=30, interval=0.1,
             what=lambda: f"the abandoned poll to end: {idle_config_polls()} parked, sessions {other_sessions(since)}")


def test_a_revoked_launcher_token_stops_the_launcher_with_what_to_do(server, registered, world, tmp_path):
    from sites import launchers

    launchers.revoke(Actor(world.global_admin), registered[0])
    process = launcher_process(server, registered[1], tmp_path, "--once")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "rejected the launcher token (401)" in err and "Global administration → Launchers" in err
    assert registered[1] not in err
