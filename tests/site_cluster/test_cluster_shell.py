"""The job shells and cluster jobs, without a scheduler: the rendered Slurm script of a cluster job
passes bash -n and shellcheck and calls sbatch with exactly these arguments (a stand-in sbatch on
PATH records them), its batch script starts one runner per node with exactly this srun (a stand-in
srun records it), and every other template refuses a cluster job before submitting anything. The
real two-node Slurm runs the same script in test_slurm_two_nodes.py."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from mado.errors import ServiceError
from sites import shells
from sites.choices import Template
from tests.sites.shell_kit import calls, run, shellcheck, standin

# The runner program in the spec directory: `--free-port` answers a port, as the real one does.
RUNNER = """\
#!/bin/bash
if [ "${1-}" = --free-port ]; then echo 45678; exit 0; fi
exit 9
"""

# srun records its arguments and what the runners would get from the batch script.
SRUN = """\
#!/bin/bash
printf '%s\\n' "$@" > "$STANDIN_LOG/srun.argv"
printf 'port=%s job=%s size=%s nodes=%s index=%s\\n' "${MMT_MASTER_PORT-}" "${MMT_JOB_ID-}" \\
    "${MMT_CLUSTER_SIZE-}" "${MMT_NODES-}" "${MMT_ARRAY_INDEX-}" > "$STANDIN_LOG/srun.env"
"""


def render(tmp_path: Path, template: str = "slurm", *, size: int = 2, gpus: int = 1, content: str | None = None):
    spec = tmp_path / "work" / ".mmt-submissions" / "101"
    spec.mkdir(parents=True, mode=0o700)
    runner = spec / "mmt-runner"
    runner.write_text(RUNNER)
    runner.chmod(0o700)
    values = shells.ShellValues(spec_dir=str(spec), runner=str(runner), job_ids=[101], project_id=3, target_id=7,
                                gpu_count=gpus, walltime_seconds=3600, variables={"PARTITION": "gpu", "CPUS": "4"},
                                cluster_size=size)
    script = tmp_path / "submit.sh"
    script.write_text(shells.render_submit(content or shells.builtin_template(template), values,
                                           title=f"test {template}"))
    return script, spec, runner


def test_the_slurm_script_of_a_cluster_job_passes_bash_n_and_shellcheck(tmp_path):
    script, _, _ = render(tmp_path, size=3)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, check=False).returncode == 0
    result = shellcheck(script)
    assert result.returncode == 0, result.stdout
    exports = [line for line in script.read_text().splitlines() if line.startswith("export MMT_")]
    assert "export MMT_CLUSTER_SIZE=3" in exports and "export MMT_NODES=3" in exports


def test_sbatch_asks_for_one_node_per_replica_and_the_batch_script_starts_one_runner_per_node_with_srun(tmp_path):
    script, spec, runner = render(tmp_path, size=2, gpus=1)
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "sbatch", stdout="4242\n")
    result = run(script, bin_dir)
    assert (result.returncode, result.stdout) == (0, "4242\n"), result.stderr
    [sbatch] = calls(bin_dir, "sbatch")
    assert sbatch["argv"] == [
        "--parsable", "--job-name=mmt-101", "--partition=gpu", "--nodes=2", "--ntasks-per-node=1",
        "--cpus-per-task=4", "--time=01:00:00", "--signal=B:TERM@120", "--no-requeue", "--export=ALL",
        f"--chdir={spec}", "--gres=gpu:1", f"--output={spec}/slurm-%j.out", f"{spec}/batch.sh"]

    # The batch script as Slurm runs it on the first node (main1's): it picks the master port there
    # and hands every runner the same spec directory through srun.
    batch = bin_dir / "log" / "sbatch.batch"
    assert subprocess.run(["bash", "-n", str(batch)], check=False).returncode == 0
    assert shellcheck(batch).returncode == 0, shellcheck(batch).stdout
    srun = bin_dir / "srun"
    srun.write_text(SRUN)
    srun.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "STANDIN_LOG": str(bin_dir / "log"), "SLURM_JOB_ID": "4242",
           "SLURM_CPUS_PER_TASK": "4"}
    ran = subprocess.run(["bash", str(batch)], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert ran.returncode == 0, ran.stderr
    assert (bin_dir / "log" / "srun.argv").read_text().splitlines() == [
        "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--cpus-per-task=4",
        str(runner), str(spec)]
    assert (bin_dir / "log" / "srun.env").read_text() == "port=45678 job=101 size=2 nodes=2 index=0\n"


def test_an_ordinary_job_keeps_one_node_and_one_task(tmp_path):
    script, _, _ = render(tmp_path, size=1, gpus=0)
    assert "MMT_CLUSTER_SIZE" not in script.read_text().split("# ---- job shell ----")[0]
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "sbatch", stdout="4242\n")
    assert run(script, bin_dir).returncode == 0
    argv = calls(bin_dir, "sbatch")[0]["argv"]
    assert "--nodes=1" in argv and "--ntasks=1" in argv and "--ntasks-per-node=1" not in argv
    assert "srun" not in (bin_dir / "log" / "sbatch.batch").read_text()


@pytest.mark.parametrize("template", [t for t in Template.values if t != Template.SLURM])
def test_every_other_template_refuses_a_cluster_job_before_submitting_anything(tmp_path, template):
    assert not shells.supports_clusters(shells.builtin_template(template))
    script, _, _ = render(tmp_path, template, size=2, gpus=0)
    bin_dir = tmp_path / "bin"
    for name in ("qsub", "pjsub", "docker", "apptainer", "setsid", "sbatch"):
        standin(bin_dir, name, stdout="1\n")
    result = run(script, bin_dir)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "This job shell does not run cluster jobs (it defines no mmt_supports_clusters)" in result.stderr
    assert not any(calls(bin_dir, name) for name in ("qsub", "pjsub", "docker", "apptainer", "setsid", "sbatch"))


def test_the_slurm_template_declares_clusters_and_an_owners_shell_may_too():
    assert shells.supports_clusters(shells.builtin_template("slurm"))
    own = "mmt_submit() { :; }\nmmt_cancel() { :; }\n"
    assert not shells.supports_clusters(own)
    assert shells.supports_clusters(own + "function mmt_supports_clusters { return 0; }\n")


def test_a_cluster_job_is_never_part_of_an_array_and_has_1_to_64_replicas():
    base = {"spec_dir": "/w/.mmt-submissions/1", "runner": "/w/.mmt-submissions/1/mmt-runner", "project_id": 1,
            "target_id": 1}
    with pytest.raises(ServiceError) as refused:
        shells.ShellValues(job_ids=[1, 2], cluster_size=2, **base).environment()
    assert refused.value.fields["cluster_size"] == ["A cluster job is submitted alone, never in an array."]
    with pytest.raises(ServiceError):
        shells.ShellValues(job_ids=[1], cluster_size=65, **base).environment()
    env = shells.ShellValues(job_ids=[1], cluster_size=4, **base).environment()
    assert (env["MMT_CLUSTER_SIZE"], env["MMT_NODES"], env["MMT_ARRAY_SIZE"]) == ("4", "4", "1")
    assert "MMT_CLUSTER_SIZE" not in shells.ShellValues(job_ids=[1, 2], **base).environment()
