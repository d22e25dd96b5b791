"""The Slurm and Grid Engine job shells against the real schedulers (fixtures in tests/peers): the
rendered script is run as the launcher would run it on a login node, with a trivial payload in place
of the Mado runner (tests/sites/shell_kit.py RUNNER), which records what it was given."""
from __future__ import annotations

import re

from sites import shells
from tests.sites.shell_kit import prepare, ran, run, wait_for

THIRTY_HOURS = 30 * 3600


def submitted_id(result) -> str:
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and re.fullmatch(r"[0-9]+", lines[0]), result.stdout
    assert shells.parse_scheduler_id(result.stdout) == lines[0]
    return lines[0]


def cancel_script(tmp_path, template: str, scheduler_id: str):
    script = tmp_path / "cancel.sh"
    script.write_text(shells.render_cancel(shells.builtin_template(template), scheduler_job_id=scheduler_id,
                                           target_id=7))
    return script


# Slurm ------------------------------------------------------------------------------------------

def test_slurm_accepts_the_rendered_job_shell_and_runs_the_runner_of_the_job(slurm, tmp_path):
    rendered = prepare(tmp_path, "slurm", job_ids=[11], walltime_seconds=THIRTY_HOURS,
                       variables={"PARTITION": "debug"})
    job_id = submitted_id(run(rendered.script, env={"SLURM_CONF": str(slurm.conf)}))

    wait_for(lambda: slurm.queue(job_id) == [(job_id, "RUNNING")], what="the job RUNNING in squeue")
    assert ran(rendered.spec_dir) == {"spec": str(rendered.spec_dir), "job": "11", "index": "0", "ids": "11"}
    details = slurm.show(job_id)
    for expected in ("JobName=mmt-11", "TimeLimit=1-06:00:00", "Requeue=0", "Partition=debug", "NumNodes=1",
                     "NumTasks=1", f"WorkDir={rendered.spec_dir}", f"StdOut={rendered.spec_dir}/slurm-{job_id}.out"):
        assert expected in details, details

    (rendered.spec_dir / "release").write_text("")
    wait_for(lambda: slurm.queue(job_id) == [], what="the job to leave the queue")
    assert "JobState=COMPLETED" in slurm.show(job_id)


def test_a_slurm_array_of_three_shows_three_tasks_and_the_cancel_script_removes_them(slurm, tmp_path):
    rendered = prepare(tmp_path, "slurm", job_ids=[21, 22, 23], walltime_seconds=600)
    job_id = submitted_id(run(rendered.script, env={"SLURM_CONF": str(slurm.conf)}))

    tasks = wait_for(lambda: slurm.queue(job_id) if len(slurm.queue(job_id)) == 3 else None,
                     what="three array tasks in squeue")
    assert sorted(task for task, _ in tasks) == [f"{job_id}_0", f"{job_id}_1", f"{job_id}_2"]
    assert ran(rendered.spec_dirs[0]) == {"spec": str(rendered.spec_dirs[0]), "job": "21", "index": "0",
                                          "ids": "21,22,23"}

    result = run(cancel_script(tmp_path, "slurm", job_id), env={"SLURM_CONF": str(slurm.conf)})
    assert result.returncode == 0, result.stderr
    wait_for(lambda: slurm.queue(job_id) == [], what="scancel to empty the queue")
    assert "JobState=CANCELLED" in slurm.show(f"{job_id}_2")
    # The batch script exec'd the runner, so the scheduler's SIGTERM reached the runner itself.
    assert (rendered.spec_dirs[0] / "signals").read_text() == "TERM\n"


# Grid Engine ------------------------------------------------------------------------------------

def test_grid_engine_runs_the_rendered_job_shell_and_qdel_cancels_it(gridengine, tmp_path):
    rendered = prepare(tmp_path, "gridengine", job_ids=[31], walltime_seconds=THIRTY_HOURS)
    job_id = submitted_id(run(rendered.script, env={"SGE_ROOT": "/var/lib/gridengine", "SGE_CELL": "default"}))

    wait_for(lambda: gridengine.state(job_id) == "r", timeout=30, what="the job running in qstat")
    assert ran(rendered.spec_dir, timeout=30) == {"spec": str(rendered.spec_dir), "job": "31", "index": "0",
                                                  "ids": "31"}
    details = gridengine.run("qstat", "-j", job_id).stdout
    assert re.search(r"^job_name:\s+mmt-31$", details, re.MULTILINE), details
    assert re.search(r"^hard resource_list:\s+h_rt=108000$", details, re.MULTILINE), details
    assert len(list(rendered.spec_dir.glob(f"sge-{job_id}.*.out"))) == 1  # -o with $JOB_ID.$TASK_ID

    result = run(cancel_script(tmp_path, "gridengine", job_id),
                 env={"SGE_ROOT": "/var/lib/gridengine", "SGE_CELL": "default"})
    assert result.returncode == 0, result.stderr
    wait_for(lambda: gridengine.state(job_id) is None, timeout=30, what="qdel to remove the job")
