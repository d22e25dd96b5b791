"""A real Slurm (Debian 12's 22.05) with one node on this machine, for tests (recipe:
shared/peers/README.md, "Slurm"): munged (reused when one already answers), then slurmctld and
slurmd in the foreground with the recipe's slurm-1node.conf, its ${PEER_DIR} a temporary directory
and free ports instead of 6817/6818 so two test runs do not collide. Stopped by PID.

Debian packages: slurm-wlm munge."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.peers.sshd import free_port

# shared/peers/slurm-1node.conf, with the ports made parameters.
CONFIG = """\
ClusterName=mado
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={peer}/slurm/state
SlurmdSpoolDir={peer}/slurm/spool/%n
SlurmctldPidFile={peer}/slurm/slurmctld.pid
SlurmdPidFile={peer}/slurm/slurmd-%n.pid
SlurmctldLogFile={peer}/slurm/log/slurmctld.log
SlurmdLogFile={peer}/slurm/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={peer}/slurm/log/jobcomp.txt
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=5
NodeName=localhost CPUs={cpus} RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class Slurm:
    peer_dir: Path
    conf: Path
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """The environment for sbatch, squeue, scontrol and scancel against this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=30, check=check)

    def queue(self, job_id: str) -> list[tuple[str, str]]:
        """(task id, state) of every task of the job that squeue still lists; arrays one line per task."""
        result = self.run("squeue", "-h", "-r", "-j", job_id, "-o", "%i %T", check=False)
        if result.returncode != 0:  # a job that left the queue may be "Invalid job id"
            return []
        return [tuple(line.split()) for line in result.stdout.splitlines() if line.strip()]

    def show(self, job_id: str) -> str:
        return self.run("scontrol", "show", "job", job_id).stdout

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self.peer_dir, ignore_errors=True)


def munge_answers() -> bool:
    try:
        encoded = subprocess.run(["munge", "-n"], capture_output=True, timeout=5, check=False)
        return encoded.returncode == 0 and subprocess.run(["unmunge"], input=encoded.stdout, capture_output=True,
                                                           timeout=5, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def start_munge() -> subprocess.Popen | None:
    """munged for Slurm's authentication, or None when one already runs (then it is not ours to stop)."""
    if munge_answers():
        return None
    subprocess.run(["install", "-d", "-o", "munge", "-g", "munge", "-m", "0755", "/run/munge"], check=True)
    # setpriv execs munged itself, so the PID we hold is munged's (runuser would sit in between).
    process = subprocess.Popen(["setpriv", "--reuid=munge", "--regid=munge", "--init-groups", "/usr/sbin/munged",
                                "--foreground"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not munge_answers():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("munged did not start: is the munge package installed with /etc/munge/munge.key?")
        time.sleep(0.05)
    return process


def start_slurm() -> Slurm:
    if not shutil.which("slurmctld") or not shutil.which("slurmd"):
        raise RuntimeError("Slurm is not installed: apt-get install -y --no-install-recommends slurm-wlm munge")
    peer = Path(tempfile.mkdtemp(prefix="mado-slurm-"))
    peer.chmod(0o755)  # batch jobs of users other than root read their scripts under it
    for sub in ("slurm/state", "slurm/spool", "slurm/log"):
        (peer / sub).mkdir(parents=True)
    conf = peer / "slurm" / "slurm.conf"
    conf.write_text(CONFIG.format(peer=peer, ctld_port=free_port(), slurmd_port=free_port(),
                                  cpus=max(2, os.cpu_count() or 2)))
    slurm = Slurm(peer_dir=peer, conf=conf)
    munged = start_munge()
    if munged is not None:
        slurm.processes.append(munged)
    try:
        for argv in (["slurmctld", "-D", "-f", str(conf)], ["slurmd", "-D", "-N", "localhost", "-f", str(conf)]):
            with open(peer / "slurm" / "log" / f"{argv[0]}.out", "wb") as log:  # the child keeps its copy
                slurm.processes.append(subprocess.Popen(argv, env=slurm.env, stdin=subprocess.DEVNULL, stdout=log,
                                                        stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 20
        while True:  # the node comes up idle within about a second
            state = slurm.run("sinfo", "-h", "-o", "%T", check=False).stdout.strip()
            if state == "idle":
                return slurm
            if time.monotonic() > deadline or any(p.poll() is not None for p in slurm.processes):
                logs = "\n".join(p.read_text()[-2000:] for p in (peer / "slurm" / "log").glob("*"))
                raise RuntimeError(f"Slurm did not become idle (sinfo: {state!r}):\n{logs}")
            time.sleep(0.1)
    except BaseException:
        slurm.stop()
        raise


@pytest.fixture(scope="session")
def slurm():
    cluster = start_slurm()
    yield cluster
    cluster.stop()
