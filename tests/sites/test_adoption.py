"""Adoption of a submission whose answer was lost (REFERENCE §5, DESIGN §8): the script rendered with
adopt=True runs the job shell's mmt_find first and prints the id of the job an earlier try submitted
(named mmt-<first Job id>) instead of submitting again.

There is no PBS server or Fujitsu TCS here: `qselect`, `pjstat`, `qsub` and `pjsub` are stand-ins on
PATH (tests/sites/shell_kit.py) that record their exact argv and print what the real commands print,
so these tests pin the arguments and the reading of the answer. The Slurm and Grid Engine stand-ins
below cover what the real schedulers cannot be made to do on demand (a failing query, a job listed
twice, a job being deleted, names cut to 10 characters); test_adoption_real_schedulers.py adopts real
jobs. The Docker and Apptainer hosts run their real runners (the payload) with `setsid`/`timeout`."""
from __future__ import annotations

import os
import pwd
import subprocess
import time

import pytest

from tests.sites.shell_kit import calls, prepare, ran, run, standin, wait_for

USER = pwd.getpwuid(os.geteuid()).pw_name


# PBS --------------------------------------------------------------------------------------------

def test_pbs_adopts_the_array_that_qselect_finds_by_name_and_user_and_does_not_qsub(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "qselect", stdout="12346[].pbs01\n")
    standin(bin_dir, "qsub", stdout="99999.pbs01\n")
    rendered = prepare(tmp_path, "pbs", job_ids=[301, 302, 303])
    result = run(rendered.adopting(), bin_dir)
    assert (result.returncode, result.stdout) == (0, "12346[].pbs01\n"), result.stderr
    assert [c["argv"] for c in calls(bin_dir, "qselect")] == [["-N", "mmt-301", "-u", USER]]
    assert calls(bin_dir, "qsub") == []
    assert "mmt-301 was submitted by an earlier try as 12346[].pbs01; not submitting it again." in result.stderr


def test_pbs_submits_when_qselect_finds_nothing(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "qselect")
    standin(bin_dir, "qsub", stdout="12350.pbs01\n")
    rendered = prepare(tmp_path, "pbs")
    result = run(rendered.adopting(), bin_dir)
    assert (result.returncode, result.stdout) == (0, "12350.pbs01\n"), result.stderr
    assert len(calls(bin_dir, "qsub")) == 1


def test_pbs_does_not_submit_when_qselect_cannot_answer(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "qselect", stderr="qselect: cannot connect to server pbs01 (errno=111)\n", code=1)
    standin(bin_dir, "qsub", stdout="12351.pbs01\n")
    result = run(prepare(tmp_path, "pbs").adopting(), bin_dir)
    assert (result.returncode, result.stdout) == (2, "")
    assert "cannot connect to server pbs01" in result.stderr
    assert "whether mmt-101 was submitted is unknown" in result.stderr
    assert ("mmt_find could not tell whether mmt-101 was already submitted (status 2); not submitting it again."
            in result.stderr)
    assert calls(bin_dir, "qsub") == []


# Fujitsu TCS ------------------------------------------------------------------------------------

def test_tcs_adopts_the_job_pjstat_lists_under_exactly_its_name(tmp_path):
    bin_dir = tmp_path / "bin"
    # mmt-1010 is another submission: a name filter that matched more than the exact name is not trusted.
    standin(bin_dir, "pjstat", stdout="JOB_ID     JOB_NAME\n5677       mmt-1010\n5679       mmt-101\n")
    standin(bin_dir, "pjsub", stdout="[INFO] PJM 0000 pjsub Job 6000 submitted.\n")
    rendered = prepare(tmp_path, "tcs", job_ids=[101, 102])
    result = run(rendered.adopting(), bin_dir)
    assert (result.returncode, result.stdout) == (0, "5679\n"), result.stderr
    assert [c["argv"] for c in calls(bin_dir, "pjstat")] == [
        ["--filter", "jnam=mmt-101", "--filter", f"usr={USER}", "--choose", "jid,jnam"]]
    assert calls(bin_dir, "pjsub") == []


def test_tcs_submits_when_pjstat_lists_only_its_header_or_other_names(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "pjstat", stdout="JOB_ID     JOB_NAME\n5677       mmt-1010\n")
    standin(bin_dir, "pjsub", stdout="[INFO] PJM 0000 pjsub Job 6001 submitted.\n")
    result = run(prepare(tmp_path, "tcs").adopting(), bin_dir)
    assert (result.returncode, result.stdout) == (0, "6001\n"), result.stderr
    assert len(calls(bin_dir, "pjsub")) == 1


# Slurm and Grid Engine, what the real ones cannot be made to do --------------------------------

def test_slurm_does_not_submit_when_squeue_cannot_reach_the_controller(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "squeue", stderr="squeue: error: Unable to contact slurm controller (connect failure)\n",
            code=1)
    standin(bin_dir, "sbatch", stdout="4300\n")
    result = run(prepare(tmp_path, "slurm").adopting(), bin_dir)
    assert (result.returncode, result.stdout) == (2, "")
    assert "Unable to contact slurm controller" in result.stderr
    assert calls(bin_dir, "sbatch") == []
    assert calls(bin_dir, "squeue")[0]["argv"] == ["--noheader", f"--user={USER}", "--name=mmt-101", "--format=%F"]


def test_a_name_submitted_twice_adopts_the_first_and_says_so(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "squeue", stdout="4310\n4302\n4302\n4302\n")  # two submissions, one an array of three
    standin(bin_dir, "sbatch", stdout="4400\n")
    result = run(prepare(tmp_path, "slurm").adopting(), bin_dir)
    assert (result.returncode, result.stdout) == (0, "4302\n"), result.stderr
    assert "mmt-101 is in the queue more than once (4302 4310); keeping 4302." in result.stderr
    assert calls(bin_dir, "sbatch") == []


# qstat -u <user> -r as Grid Engine 8.1.9 prints it: names cut to 10 characters, the full one below.
QSTAT = """\
job-ID  prior   name       user         state submit/start at     queue                          slots ja-task-ID
-----------------------------------------------------------------------------------------------------------------
     40 0.50000 mmt-123456 {user}         dr    11/29/2026 23:41:45 all.q@vm                           1
       Full jobname:     mmt-123456789
       Master Queue:     all.q@vm
       Hard Resources:   h_rt=3600 (0.000000)
     41 0.50000 mmt-123456 {user}         r     11/29/2026 23:41:45 all.q@vm                           1
       Full jobname:     mmt-1234567
       Master Queue:     all.q@vm
     42 0.50000 mmt-123456 {user}         r     11/29/2026 23:41:45 all.q@vm                           1 1
       Full jobname:     mmt-123456789
       Master Queue:     all.q@vm
     42 0.50000 mmt-123456 {user}         qw    11/29/2026 23:41:45                                    1 2-3:1
       Full jobname:     mmt-123456789
"""


def test_grid_engine_reads_the_full_job_name_and_skips_a_job_being_deleted(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "qstat", stdout=QSTAT.format(user=USER))
    standin(bin_dir, "qsub", stdout="50\n")
    rendered = prepare(tmp_path, "gridengine", job_ids=[123456789, 123456790, 123456791])
    result = run(rendered.adopting(), bin_dir)
    assert (result.returncode, result.stdout) == (0, "42\n"), result.stderr
    assert calls(bin_dir, "qstat")[0]["argv"] == ["-u", USER, "-r"]
    assert calls(bin_dir, "qsub") == []
    other = prepare(tmp_path / "other", "gridengine", job_ids=[1234568])  # mmt-1234568: listed, cut, not its own
    assert run(other.adopting(), bin_dir).stdout == "50\n"


# Hosts without a scheduler ----------------------------------------------------------------------

HELP = ("Usage: apptainer exec [exec options...] <container> <command>\n  -e, --cleanenv\n  -C, --containall\n"
        "      --no-eval\n      --no-home\n      --no-mount strings\n      --pwd string\n      --nv\n")
HOSTS = pytest.mark.parametrize("template, command, answer", [
    ("docker_host", "docker", "24.0.7\n"),
    ("apptainer_host", "apptainer", HELP),
])


def runner_running(spec, index: int) -> bool:
    pid = (spec / f"runner-{index}.pid").read_text().strip()
    args = subprocess.run(["ps", "-ww", "-o", "args=", "-p", pid], capture_output=True, text=True, check=False)
    return args.returncode == 0 and "<defunct>" not in args.stdout and args.stdout.strip() != ""


def release(rendered) -> None:
    for spec in rendered.spec_dirs:
        (spec / "release").write_text("")


@HOSTS
def test_a_host_adopts_runners_still_running_and_does_not_start_them_again(tmp_path, template, command, answer):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, command, stdout=answer)
    rendered = prepare(tmp_path, template, job_ids=[701, 702])
    assert run(rendered.script, bin_dir).returncode == 0
    for spec in rendered.spec_dirs:
        ran(spec)
        (spec / "ran").unlink()  # a runner started again would write it anew
    pids = [(rendered.spec_dir / f"runner-{i}.pid").read_text() for i in range(2)]

    result = run(rendered.adopting(), bin_dir)
    assert (result.returncode, result.stdout) == (0, ""), result.stderr
    assert "the runners of mmt-701 started by an earlier try are running" in result.stderr
    time.sleep(0.5)
    assert not any((spec / "ran").exists() for spec in rendered.spec_dirs)
    assert len(calls(bin_dir, command)) == 1  # the adopting try did not even check the runtime
    assert [(rendered.spec_dir / f"runner-{i}.pid").read_text() for i in range(2)] == pids
    release(rendered)


@HOSTS
def test_a_host_starts_the_runners_when_none_or_not_all_of_an_earlier_try_are_running(tmp_path, template, command,
                                                                                       answer):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, command, stdout=answer)
    rendered = prepare(tmp_path, template, job_ids=[711, 712])
    result = run(rendered.adopting(), bin_dir)  # nothing submitted before: it starts them
    assert (result.returncode, result.stdout) == (0, ""), result.stderr
    for spec in rendered.spec_dirs:
        ran(spec)
        (spec / "ran").unlink()

    (rendered.spec_dirs[1] / "release").write_text("")  # the second Job's runner ends
    wait_for(lambda: not runner_running(rendered.spec_dir, 1), what="the second runner to end")
    (rendered.spec_dirs[1] / "release").unlink()
    assert run(rendered.adopting(), bin_dir).returncode == 0
    for spec in rendered.spec_dirs:
        ran(spec)  # both started again; Mado refuses the one whose Job already has a runner
    assert len(calls(bin_dir, command)) == 2
    release(rendered)


def test_a_pid_file_naming_another_program_is_not_taken_for_a_runner(tmp_path):
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "docker", stdout="24.0.7\n")
    rendered = prepare(tmp_path, "docker_host")
    (rendered.spec_dir / "runner-0.pid").write_text(f"{os.getpid()}\n")  # alive, but this test, not a runner
    result = run(rendered.adopting(), bin_dir)
    assert (result.returncode, result.stdout) == (0, ""), result.stderr
    ran(rendered.spec_dir)
    assert (rendered.spec_dir / "runner-0.pid").read_text() != f"{os.getpid()}\n"
    release(rendered)
