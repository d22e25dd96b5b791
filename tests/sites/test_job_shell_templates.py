"""The built-in job shells (REFERENCE §5), rendered and run with stand-in scheduler commands.

There is no PBS server, Fujitsu TCS, Apptainer or Docker daemon on these machines: `qsub`, `pjsub`,
`qdel`, `pjdel`, `apptainer` and `docker` here are stand-ins on PATH that record their exact argv and
print what the real commands print (`12345.server`, `[INFO] PJM 0000 pjsub Job 5678 submitted.`, a
help text, a server version). `sbatch`/`scancel` and Grid Engine's `qsub` stand-ins pin the exact
arguments as well; the real Slurm and Grid Engine run the same scripts in test_real_schedulers.py.
`setsid` and `timeout` are the real ones. The batch script each job shell hands its scheduler is then
run here with the scheduler's task variables to check it starts the right Job's runner."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from sites import shells
from sites.choices import Template
from tests.sites.shell_kit import calls, prepare, ran, run, shellcheck, standin, wait_for

EXPORTED = "MMT_SPEC_DIR,MMT_RUNNER,MMT_JOB_IDS,MMT_ARRAY_SIZE,MMT_WALLTIME_SECONDS,MMT_GPU_COUNT,MMT_PROJECT_ID,MMT_TARGET_ID"
THIRTY_HOURS = 30 * 3600


def run_batch(copy, env: dict, timeout: float = 30) -> subprocess.CompletedProcess:
    """The batch script as the scheduler would run it: a clean environment plus its task variables."""
    clean = {"PATH": os.environ["PATH"], "HOME": "/root", **env}
    return subprocess.run(["bash", str(copy)], capture_output=True, text=True, env=clean, timeout=timeout,
                          check=False)


def release(rendered) -> None:
    for spec in rendered.spec_dirs:
        (spec / "release").write_text("")


# Every template ----------------------------------------------------------------------------------

@pytest.mark.parametrize("template", Template.values)
@pytest.mark.parametrize("array", [1, 3])
def test_every_rendered_template_passes_bash_n_and_shellcheck(tmp_path, template, array):
    rendered = prepare(tmp_path, template, job_ids=range(101, 101 + array), gpu_count=array - 1,
                       variables={"PARTITION": "gpu", "GROUP": "gp42"})
    cancel = tmp_path / "cancel.sh"
    cancel.write_text(shells.render_cancel(shells.builtin_template(template), scheduler_job_id="4242",
                                           target_id=7, variables={"GROUP": "gp42"}))
    for script in (rendered.script, rendered.adopting(), cancel):
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True, check=False).returncode == 0
        result = shellcheck(script)
        assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("template", Template.values)
def test_the_rendered_script_sets_eu_umask_077_and_exports_every_variable_before_the_job_shell(tmp_path, template):
    rendered = prepare(tmp_path, template, job_ids=[101, 102], gpu_count=1, walltime_seconds=THIRTY_HOURS + 1,
                       variables={"PARTITION": "gpu"})
    text = rendered.script.read_text()
    head = text.split("# ---- job shell ----")[0]
    spec, runner = rendered.values.spec_dir, rendered.values.runner
    assert head.splitlines()[:4] == ["#!/bin/bash", f"# test {template}", "set -eu", "umask 077"]
    assert [line for line in head.splitlines() if line.startswith("export ")] == [
        f"export MMT_SPEC_DIR={spec}", f"export MMT_RUNNER={runner}", "export MMT_JOB_IDS=101,102",
        "export MMT_ARRAY_SIZE=2", "export MMT_GPU_COUNT=1", "export MMT_WALLTIME_SECONDS=108001",
        "export MMT_WALLTIME=30:00:01", "export MMT_PROJECT_ID=3", "export MMT_TARGET_ID=7",
        "export MMT_VAR_PARTITION=gpu"]
    assert text.rstrip().endswith("# ---- end of job shell ----\n\nmmt_submit")


@pytest.mark.parametrize("template", Template.values)
def test_every_template_defines_mmt_find_and_adopting_calls_it_before_mmt_submit(tmp_path, template):
    assert shells.defines(shells.builtin_template(template), "mmt_find")
    text = prepare(tmp_path, template).adopting().read_text()
    tail = text.split("# ---- end of job shell ----")[1]
    assert tail.startswith("\n\nmmt_find_status=0\nmmt_found=$(mmt_find) || mmt_find_status=$?\n")
    assert "1) mmt_submit ;;" in tail


def test_an_owners_job_shell_without_mmt_find_is_valid_and_adopting_submits_again(tmp_path):
    content = "mmt_submit() { echo 99; }\nmmt_cancel() { :; }\n"
    shells.validate_content(content)  # mmt_find is optional
    rendered = prepare(tmp_path, "slurm", content=content)
    text = rendered.adopting().read_text()
    assert "mmt_find" not in text.replace("defines no mmt_find", "")
    assert text.rstrip().endswith("submitting again.\nmmt_submit")
    assert run(rendered.adopting()).stdout == "99\n"


def test_walltime_is_hh_mm_ss_with_hours_past_24():
    assert shells.walltime_hms(59) == "00:00:59"
    assert shells.walltime_hms(3600) == "01:00:00"
    assert shells.walltime_hms(THIRTY_HOURS) == "30:00:00"
    assert shells.walltime_hms(100 * 3600 + 61) == "100:01:01"


# Slurm ------------------------------------------------------------------------------------------

def test_slurm_submits_with_the_exact_sbatch_arguments_and_prints_only_the_job_id(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "sbatch", stdout="4242;mado\n")
    rendered = prepare(tmp_path, "slurm", gpu_count=2, walltime_seconds=THIRTY_HOURS,
                       variables={"PARTITION": "gpu", "CPUS": "4", "ACCOUNT": "proj1"})
    result = run(rendered.script, bin_dir)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "4242\n"  # ";cluster" stripped; nothing else on stdout
    spec = rendered.values.spec_dir
    [call] = calls(bin_dir, "sbatch")
    assert call["argv"] == [
        "--parsable", "--job-name=mmt-101", "--partition=gpu", "--nodes=1", "--ntasks=1", "--cpus-per-task=4",
        "--time=30:00:00", "--signal=B:TERM@120", "--no-requeue", "--export=ALL", f"--chdir={spec}",
        "--gres=gpu:2", "--account=proj1", f"--output={spec}/slurm-%j.out", f"{spec}/batch.sh"]


def test_slurm_arrays_ask_for_0_to_n_minus_1_and_each_task_runs_its_own_jobs_runner(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "sbatch", stdout="4243\n")
    rendered = prepare(tmp_path, "slurm", job_ids=[201, 202, 203], walltime_seconds=200,
                       variables={"GROUP": "gp42", "GPU_TYPE": "a100"}, gpu_count=1)
    result = run(rendered.script, bin_dir)
    assert result.stdout == "4243\n"
    argv = calls(bin_dir, "sbatch")[0]["argv"]
    spec = rendered.values.spec_dir
    assert "--partition" not in " ".join(argv)  # no PARTITION: the site's default partition
    assert argv[1:] == [
        "--job-name=mmt-201", "--nodes=1", "--ntasks=1", "--cpus-per-task=1", "--time=00:03:20",
        "--signal=B:TERM@100", "--no-requeue", "--export=ALL", f"--chdir={spec}", "--gres=gpu:a100:1",
        "--account=gp42", "--array=0-2", f"--output={spec}/slurm-%A_%a.out", f"{spec}/batch.sh"]
    release(rendered)
    batch = bin_dir / "log" / "sbatch.batch"
    assert run_batch(batch, {"SLURM_ARRAY_TASK_ID": "2"}).returncode == 0
    assert ran(rendered.spec_dirs[2]) == {"spec": str(rendered.spec_dirs[2]), "job": "203", "index": "2",
                                          "ids": "201,202,203"}
    assert not (rendered.spec_dirs[0] / "ran").exists()


def test_slurm_cancel_runs_scancel_with_the_scheduler_job_id(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "scancel")
    script = tmp_path / "cancel.sh"
    script.write_text(shells.render_cancel(shells.builtin_template("slurm"), scheduler_job_id="4242", target_id=7))
    result = run(script, bin_dir)
    assert result.returncode == 0 and result.stdout == ""
    assert calls(bin_dir, "scancel")[0]["argv"] == ["4242"]


def test_a_failing_sbatch_fails_the_job_shell_with_its_message_on_stderr(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "sbatch", stderr="sbatch: error: invalid partition specified: nope\n", code=1)
    rendered = prepare(tmp_path, "slurm", variables={"PARTITION": "nope"})
    result = run(rendered.script, bin_dir)
    assert result.returncode == 1 and result.stdout == ""
    assert "invalid partition specified: nope" in result.stderr


def test_an_answer_that_is_not_a_job_id_fails_the_job_shell(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "sbatch", stdout="Submitted batch job 12\n")
    result = run(prepare(tmp_path, "slurm").script, bin_dir)
    assert result.returncode == 2 and result.stdout == ""
    assert "sbatch did not print a job id: Submitted batch job 12" in result.stderr


# PBS --------------------------------------------------------------------------------------------

def test_pbs_submits_with_the_exact_qsub_arguments_from_the_spec_directory(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "qsub", stdout="12345.pbs01\n")
    rendered = prepare(tmp_path, "pbs", gpu_count=2, walltime_seconds=THIRTY_HOURS,
                       variables={"QUEUE": "gpuq", "CPUS": "8", "GROUP": "gp42"})
    result = run(rendered.script, bin_dir)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "12345.pbs01\n"
    [call] = calls(bin_dir, "qsub")
    spec = rendered.values.spec_dir
    assert call["cwd"] == spec  # PBS writes mmt-101.o12345 where qsub ran
    assert call["argv"] == ["-N", "mmt-101", "-q", "gpuq", "-l", "select=1:ncpus=8:ngpus=2",
                            "-l", "walltime=30:00:00", "-r", "n", "-j", "oe", "-S", "/bin/bash", "-v", EXPORTED,
                            "-A", "gp42", f"{spec}/batch.sh"]


def test_pbs_arrays_use_j_0_to_n_minus_1_and_pbs_array_index(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "qsub", stdout="12346[].pbs01\n")
    rendered = prepare(tmp_path, "pbs", job_ids=[301, 302, 303])
    result = run(rendered.script, bin_dir)
    assert result.stdout == "12346[].pbs01\n"
    spec = rendered.values.spec_dir
    assert calls(bin_dir, "qsub")[0]["argv"] == [
        "-N", "mmt-301", "-l", "select=1", "-l", "walltime=01:00:00", "-r", "n", "-j", "oe", "-S", "/bin/bash",
        "-v", EXPORTED, "-J", "0-2", f"{spec}/batch.sh"]
    release(rendered)
    assert run_batch(bin_dir / "log" / "qsub.batch", {"PBS_ARRAY_INDEX": "1"}).returncode == 0
    assert ran(rendered.spec_dirs[1])["job"] == "302"


def test_the_pbs_batch_execs_the_runner_so_sigterm_at_the_limit_reaches_it(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "qsub", stdout="12347.pbs01\n")
    rendered = prepare(tmp_path, "pbs")
    run(rendered.script, bin_dir)
    batch = subprocess.Popen(["bash", str(bin_dir / "log" / "qsub.batch")], env={"PATH": os.environ["PATH"]})
    ran(rendered.spec_dir)
    batch.send_signal(signal.SIGTERM)  # what PBS sends the job at its walltime
    assert batch.wait(timeout=10) == 143
    assert (rendered.spec_dir / "signals").read_text() == "TERM\n"


def test_pbs_cancel_runs_qdel_with_the_full_id(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "qdel")
    script = tmp_path / "cancel.sh"
    script.write_text(shells.render_cancel(shells.builtin_template("pbs"), scheduler_job_id="12346[].pbs01",
                                           target_id=7))
    assert run(script, bin_dir).returncode == 0
    assert calls(bin_dir, "qdel")[0]["argv"] == ["12346[].pbs01"]


# Grid Engine ------------------------------------------------------------------------------------

def test_grid_engine_arrays_use_t_1_to_n_and_the_id_loses_its_task_range(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "qsub", stdout="777.1-3:1\n")
    rendered = prepare(tmp_path, "gridengine", job_ids=[401, 402, 403], gpu_count=1, walltime_seconds=THIRTY_HOURS,
                       variables={"QUEUE": "gpu.q", "ACCOUNT": "proj1"})
    result = run(rendered.script, bin_dir)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "777\n"
    spec = rendered.values.spec_dir
    assert calls(bin_dir, "qsub")[0]["argv"] == [
        "-terse", "-N", "mmt-401", "-l", "h_rt=30:00:00", "-r", "n", "-j", "y", "-S", "/bin/bash",
        "-o", f"{spec}/sge-$JOB_ID.$TASK_ID.out", "-v", EXPORTED, "-q", "gpu.q", "-l", "gpu=1", "-A", "proj1",
        "-t", "1-3", f"{spec}/batch.sh"]
    release(rendered)
    batch = bin_dir / "log" / "qsub.batch"
    assert run_batch(batch, {"SGE_TASK_ID": "3"}).returncode == 0
    assert ran(rendered.spec_dirs[2])["index"] == "2"


def test_the_grid_engine_timer_sends_the_runner_sigterm_before_h_rt(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "qsub", stdout="778\n")
    rendered = prepare(tmp_path, "gridengine", walltime_seconds=4)  # short limit: SIGTERM at half, 2 s
    run(rendered.script, bin_dir)
    started = time.monotonic()
    result = run_batch(bin_dir / "log" / "qsub.batch", {"SGE_TASK_ID": "undefined"})
    elapsed = time.monotonic() - started
    assert ran(rendered.spec_dir)["index"] == "0"  # not an array: SGE_TASK_ID is "undefined"
    assert (rendered.spec_dir / "signals").read_text() == "TERM\n"
    # The timer is set to half the limit (2 s of 4: h_rt's SIGKILL would come at 4 s) and fired: timeout's
    # status. How long it took is only bounded below, since a busy machine only makes it later.
    assert "mmt_term_after=2\n" in (bin_dir / "log" / "qsub.batch").read_text()
    assert elapsed > 1.5 and result.returncode == 124


# Fujitsu TCS ------------------------------------------------------------------------------------

def test_tcs_submits_with_the_exact_pjsub_arguments_and_reads_the_id_from_its_message(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "pjsub", stdout="[INFO] PJM 0000 pjsub Job 5678 submitted.\n")
    rendered = prepare(tmp_path, "tcs", walltime_seconds=THIRTY_HOURS, variables={"RSCGRP": "small", "GROUP": "gp42"})
    result = run(rendered.script, bin_dir)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "5678\n"
    spec = rendered.values.spec_dir
    assert calls(bin_dir, "pjsub")[0]["argv"] == [
        "-N", "mmt-101", "-L", "rscgrp=small", "-L", "node=1", "-L", "elapse=30:00:00", "--norestart", "-j",
        "-o", f"{spec}/pjm-%j.out", "-X", "-g", "gp42", f"{spec}/batch.sh"]


def test_tcs_bulk_jobs_use_bulk_sparam_and_pjm_bulknum(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "pjsub", stdout="[INFO] PJM 0000 pjsub Job 5679 submitted.\n")
    rendered = prepare(tmp_path, "tcs", job_ids=[501, 502])
    assert run(rendered.script, bin_dir).stdout == "5679\n"
    argv = calls(bin_dir, "pjsub")[0]["argv"]
    assert argv[-4:-1] == ["--bulk", "--sparam", "0-1"]
    release(rendered)
    assert run_batch(bin_dir / "log" / "pjsub.batch", {"PJM_BULKNUM": "1"}).returncode == 0
    assert ran(rendered.spec_dirs[1])["job"] == "502"


def test_the_tcs_batch_turns_sigxcpu_at_the_elapse_limit_into_sigterm_for_the_runner(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "pjsub", stdout="[INFO] PJM 0000 pjsub Job 5680 submitted.\n")
    rendered = prepare(tmp_path, "tcs")
    run(rendered.script, bin_dir)
    batch = subprocess.Popen(["bash", str(bin_dir / "log" / "pjsub.batch")], env={"PATH": os.environ["PATH"]})
    ran(rendered.spec_dir)
    batch.send_signal(signal.SIGXCPU)
    assert batch.wait(timeout=10) == 143  # the runner's status after SIGTERM
    assert (rendered.spec_dir / "signals").read_text() == "TERM\n"


def test_tcs_refuses_gpu_jobs_until_the_owner_adds_the_sites_gpu_option(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "pjsub", stdout="[INFO] PJM 0000 pjsub Job 1 submitted.\n")
    result = run(prepare(tmp_path, "tcs", gpu_count=1).script, bin_dir)
    assert result.returncode == 2 and result.stdout == "" and "GPU" in result.stderr
    assert calls(bin_dir, "pjsub") == []


def test_tcs_cancel_runs_pjdel(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "pjdel")
    script = tmp_path / "cancel.sh"
    script.write_text(shells.render_cancel(shells.builtin_template("tcs"), scheduler_job_id="5678", target_id=7))
    assert run(script, bin_dir).returncode == 0
    assert calls(bin_dir, "pjdel")[0]["argv"] == ["5678"]


# Docker and Apptainer hosts ---------------------------------------------------------------------

HELP = ("Usage: apptainer exec [exec options...] <container> <command>\n  -e, --cleanenv  clean environment\n"
        "  -C, --containall  contain everything\n      --no-eval  do not evaluate\n      --no-home  no home\n"
        "      --no-mount strings  disable mounts\n      --pwd string  initial directory\n"
        "      --nv  enable Nvidia support\n")


@pytest.mark.parametrize("template, command, answer", [
    ("docker_host", "docker", "24.0.7\n"),
    ("apptainer_host", "apptainer", HELP),
])
def test_a_host_without_a_scheduler_starts_one_runner_per_job_and_prints_nothing(tmp_path, template, command, answer):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, command, stdout=answer)
    rendered = prepare(tmp_path, template, job_ids=[601, 602, 603], gpu_count=1)
    result = run(rendered.script, bin_dir)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""  # no scheduler job id
    expected = ["version", "--format", "{{.Server.Version}}"] if command == "docker" else ["exec", "--help"]
    assert [c["argv"] for c in calls(bin_dir, command)] == [expected]
    for index, spec in enumerate(rendered.spec_dirs):
        assert ran(spec) == {"spec": str(spec), "job": str(601 + index), "index": str(index), "ids": "601,602,603"}
    release(rendered)


def test_host_runners_survive_in_their_own_session_and_get_sigterm_at_the_walltime(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "docker", stdout="24.0.7\n")
    rendered = prepare(tmp_path, "docker_host", walltime_seconds=2)
    assert run(rendered.script, bin_dir).returncode == 0  # the job shell returned; the runner keeps going
    ran(rendered.spec_dir)
    wait_for(lambda: (rendered.spec_dir / "signals").exists(), timeout=10, what="SIGTERM from timeout")
    assert (rendered.spec_dir / "signals").read_text() == "TERM\n"


def test_an_unreachable_docker_daemon_fails_the_docker_host_job_shell_before_any_runner(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "docker", stderr="Cannot connect to the Docker daemon at unix:///var/run/docker.sock.\n",
            code=1)
    rendered = prepare(tmp_path, "docker_host")
    result = run(rendered.script, bin_dir)
    assert result.returncode == 2 and result.stdout == ""
    assert "cannot reach the Docker daemon" in result.stderr
    time.sleep(0.3)
    assert not (rendered.spec_dir / "ran").exists()


@pytest.mark.parametrize("gpus, missing", [(0, "--no-eval"), (0, "--containall"), (1, "--nv")])
def test_an_apptainer_without_the_isolation_flags_is_refused(tmp_path, gpus, missing):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "apptainer", stdout=HELP.replace(missing, "--x"))
    rendered = prepare(tmp_path, "apptainer_host", gpu_count=gpus)
    result = run(rendered.script, bin_dir)
    assert result.returncode == 2 and f"lacks {missing}" in result.stderr
    time.sleep(0.3)
    assert not (rendered.spec_dir / "ran").exists()


def test_singularity_is_used_when_apptainer_is_absent(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "singularity", stdout=HELP)
    rendered = prepare(tmp_path, "apptainer_host")
    assert run(rendered.script, bin_dir).returncode == 0
    assert calls(bin_dir, "singularity")[0]["argv"] == ["exec", "--help"]
    ran(rendered.spec_dir)
    release(rendered)


@pytest.mark.parametrize("template", ["docker_host", "apptainer_host"])
def test_cancel_on_a_host_without_a_scheduler_does_nothing_the_runner_stops_itself(tmp_path, template):
    script = tmp_path / "cancel.sh"
    script.write_text(shells.render_cancel(shells.builtin_template(template), scheduler_job_id="none",
                                           target_id=7))
    result = run(script, tmp_path / "bin")
    assert (result.returncode, result.stdout) == (0, "")
