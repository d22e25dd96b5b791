"""Adoption against the real Slurm and Grid Engine (fixtures in tests/peers): a submission is made, its
answer is taken as lost, and the same submission rendered with adopt=True is run as the launcher's
next try would run it. It must print the id of the job already queued and leave exactly one job of
that name in the queue; with nothing submitted before, it submits. The payload runner of
tests/sites/shell_kit.py stands in for the Mado runner."""
from __future__ import annotations

from tests.sites.shell_kit import prepare, ran, run, wait_for
from tests.sites.test_real_schedulers import submitted_id

GRID_ENV = {"SGE_ROOT": "/var/lib/gridengine", "SGE_CELL": "default"}


# Slurm ------------------------------------------------------------------------------------------

def slurm_jobs_named(slurm, name: str) -> list[str]:
    """The array (or job) id of every job of that name squeue lists, one per job or array task."""
    out = slurm.run("squeue", "--noheader", f"--name={name}", "--format=%F").stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def end_slurm_job(slurm, rendered, job_id: str) -> None:
    for spec in rendered.spec_dirs:
        (spec / "release").write_text("")
    slurm.run("scancel", job_id, check=False)
    wait_for(lambda: slurm.queue(job_id) == [], what="the job to leave the queue")


def test_slurm_adopts_the_queued_job_instead_of_submitting_it_again(slurm, tmp_path):
    rendered = prepare(tmp_path, "slurm", job_ids=[901])
    env = {"SLURM_CONF": str(slurm.conf)}
    job_id = submitted_id(run(rendered.script, env=env))

    adopted = run(rendered.adopting(), env=env)
    assert submitted_id(adopted) == job_id
    assert "not submitting it again" in adopted.stderr
    assert slurm_jobs_named(slurm, "mmt-901") == [job_id]
    end_slurm_job(slurm, rendered, job_id)


def test_slurm_adopting_with_nothing_submitted_before_submits(slurm, tmp_path):
    rendered = prepare(tmp_path, "slurm", job_ids=[911])
    env = {"SLURM_CONF": str(slurm.conf)}
    job_id = submitted_id(run(rendered.adopting(), env=env))
    assert slurm_jobs_named(slurm, "mmt-911") == [job_id]
    assert ran(rendered.spec_dir)["job"] == "911"
    end_slurm_job(slurm, rendered, job_id)


def test_a_slurm_array_of_three_is_adopted_by_its_array_id_once_its_tasks_run(slurm, tmp_path):
    rendered = prepare(tmp_path, "slurm", job_ids=[921, 922, 923], walltime_seconds=600)
    env = {"SLURM_CONF": str(slurm.conf)}
    job_id = submitted_id(run(rendered.script, env=env))
    # Running tasks get job ids of their own (squeue's %A); the adopted id must be the array's.
    wait_for(lambda: any(state == "RUNNING" for _, state in slurm.queue(job_id)), what="a running array task")

    adopted = run(rendered.adopting(), env=env)
    assert submitted_id(adopted) == job_id
    assert "more than once" not in adopted.stderr  # the tasks' own ids were not taken for other jobs
    tasks = slurm_jobs_named(slurm, "mmt-921")
    assert set(tasks) == {job_id} and len(slurm.queue(job_id)) == 3
    end_slurm_job(slurm, rendered, job_id)


# Grid Engine ------------------------------------------------------------------------------------

def grid_jobs_named(gridengine, name: str) -> list[str]:
    out = gridengine.run("qstat", "-u", "*", "-r").stdout
    jobs, current = [], None
    for line in out.splitlines():
        fields = line.split()
        if fields and fields[0].isdigit():
            current = fields[0]
        elif fields[:2] == ["Full", "jobname:"] and fields[2:] == [name]:
            jobs.append(current)
    return jobs


def end_grid_job(gridengine, rendered, job_id: str) -> None:
    (rendered.spec_dir / "release").write_text("")
    gridengine.run("qdel", job_id, check=False)
    wait_for(lambda: gridengine.state(job_id) is None, timeout=30, what="the job to leave the queue")


def test_grid_engine_adopts_the_queued_job_instead_of_submitting_it_again(gridengine, tmp_path):
    rendered = prepare(tmp_path, "gridengine", job_ids=[123456789])  # a name qstat cuts to mmt-123456
    job_id = submitted_id(run(rendered.script, env=GRID_ENV))

    adopted = run(rendered.adopting(), env=GRID_ENV)
    assert submitted_id(adopted) == job_id
    assert "not submitting it again" in adopted.stderr
    assert grid_jobs_named(gridengine, "mmt-123456789") == [job_id]
    end_grid_job(gridengine, rendered, job_id)


def test_grid_engine_adopting_with_nothing_submitted_before_submits(gridengine, tmp_path):
    rendered = prepare(tmp_path, "gridengine", job_ids=[941])
    job_id = submitted_id(run(rendered.adopting(), env=GRID_ENV))
    assert grid_jobs_named(gridengine, "mmt-941") == [job_id]
    assert ran(rendered.spec_dir, timeout=30)["job"] == "941"
    end_grid_job(gridengine, rendered, job_id)
