"""The launcher end to end with a real Slurm: live server, the real sshd as the login node, the
built-in Slurm job shell. The login node's environment: the tests' Slurm listens on free ports, so
sbatch needs SLURM_CONF; the site's job shell sets it from a site variable (MMT_VAR_SLURM_CONF) the
way an owner adds `module load slurm` to a job shell, rather than changing the shared sshd. The
configuration is copied where the login user can read it. Run under flock /tmp/mado-schedulers.lock."""
from __future__ import annotations

import os
import shutil

from jobs.models import Job
from sites import shells
from sites.models import LauncherKey, Submission
from tests.sites.conftest import slurm  # noqa: F401  (session fixture)
from tests.site_agent.conftest import authorize
from tests.site_agent.site_world import launcher_for, make_site, queue, registered, server  # noqa: F401
from tests.support import wait_for


def slurm_job_shell() -> str:
    content = shells.builtin_template("slurm")
    return 'export SLURM_CONF="$MMT_VAR_SLURM_CONF"  # this cluster\'s configuration\n' + content


def test_the_launcher_submits_a_waiting_job_to_slurm_and_its_runner_starts(server, registered, world, sshd, slurm,
                                                                          remote_dir, tmp_path):
    # Jobs here run as the login user, not root: slurmd execs the batch script from its spool under
    # the fixture's directory, which mkdtemp made 700 (tests/peers/slurm.py); let others traverse it.
    slurm.peer_dir.chmod(0o755)
    remote_dir.mkdir(mode=0o755)
    conf = remote_dir / "slurm.conf"
    shutil.copy(slurm.conf, conf)
    conf.chmod(0o644)
    os.chown(remote_dir, sshd.home.stat().st_uid, sshd.home.stat().st_gid)
    work = remote_dir / "work"
    target = make_site(world, registered[0], sshd, work, server, job_shell=slurm_job_shell(),
                       variables=f"SLURM_CONF={conf}\nPARTITION=debug")
    os.mkdir(tmp_path / "state", 0o700)
    agent = launcher_for(server, registered[1], tmp_path / "state")
    agent.round(wait=0)
    authorize(sshd, LauncherKey.objects.get(target=target).public_key)

    job, = queue(target, world.project_admin, world.project, walltime_seconds=600)
    agent.round(wait=0)
    row = Submission.objects.get(job=job)
    assert row.status == "submitted", row.error
    assert row.scheduler_job_id.isdigit()
    try:
        details = slurm.show(row.scheduler_job_id)
        assert f"JobName=mmt-{job.pk}" in details and "Partition=debug" in details
        assert f"UserId={sshd.user}(" in details
        job.refresh_from_db()
        assert job.status in ("submitted", "waiting_resources", "running", "failed", "finished"), job.status
        # The runner the spec directory holds starts on the compute node and reports with the job token.
        try:
            wait_for(lambda: Submission.objects.get(job=job).runner_started_at, timeout=60,
                     what="the runner to start from the spec directory written over SSH")
        except AssertionError:
            outputs = {p.name: p.read_text()[-2000:] for p in (work / ".mmt-submissions" / str(job.pk)).glob("*.out")}
            raise AssertionError(f"{slurm.queue(row.scheduler_job_id)} {slurm.show(row.scheduler_job_id)} {outputs}")
        assert Submission.objects.get(job=job).scheduler_job_id == row.scheduler_job_id
    finally:
        slurm.run("scancel", row.scheduler_job_id, check=False)
        wait_for(lambda: slurm.queue(row.scheduler_job_id) == [], timeout=30, what="the job to leave the queue")
        # The runner reports its end (SIGTERM from scancel) before the live server goes away.
        wait_for(lambda: Job.objects.get(pk=job.pk).status in ("failed", "finished", "canceled"), timeout=30,
                 what="the runner's last report")
