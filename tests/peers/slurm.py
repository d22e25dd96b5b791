"""A real Slurm (Debian 12's 22.05) with one node on this machine, for tests (recipe:
shared/peers/README.md, "Slurm"): munged (reused when one already answers), then slurmctld and
slurmd in the foreground with the recipe's slurm-1node.conf, its ${PEER_DIR} a temporary directory
and free ports instead of 6817/6818 so two test runs do not collide. Stopped by PID.

`slurm_two_nodes` is the recipe's two nodes on one host (slurm-2node-dbd.conf without accounting):
nodes n1 and n2, both 127.0.0.1, each with its own slurmd (`slurmd -D -N n1`, `-N n2`) on its own free
port, so `sbatch --nodes=2` and `srun` run one task on each. Started only by the tests that ask for it.

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
{nodes}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
ONE_NODE = "NodeName=localhost CPUs={cpus} RealMemory=2000 State=UNKNOWN\n"
# shared/peers/slurm-2node-dbd.conf's nodes, with free ports.
TWO_NODES = ("NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port={n1_port} CPUs=2 RealMemory=1000 "
             "State=UNKNOWN\n"
             "NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port={n2_port} CPUs=2 RealMemory=1000 "
             "State=UNKNOWN\n")


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


def start_slurm(node_names: tuple[str, ...] = ("localhost",)) -> Slurm:
    """slurmctld and one slurmd per node: ("localhost",) is the one-node recipe, ("n1", "n2") the two."""
    if not shutil.which("slurmctld") or not shutil.which("slurmd"):
        raise RuntimeError("Slurm is not installed: apt-get install -y --no-install-recommends slurm-wlm munge")
    peer = Path(tempfile.mkdtemp(prefix="mado-slurm-"))
    peer.chmod(0o755)  # batch jobs of users other than root read their scripts under it
    for sub in ("slurm/state", "slurm/spool", "slurm/log"):
        (peer / sub).mkdir(parents=True)
    conf = peer / "slurm" / "slurm.conf"
    nodes = (ONE_NODE.format(cpus=max(2, os.cpu_count() or 2)) if node_names == ("localhost",)
             else TWO_NODES.format(n1_port=free_port(), n2_port=free_port()))
    conf.write_text(CONFIG.format(peer=peer, ctld_port=free_port(), slurmd_port=free_port(), nodes=nodes))
    slurm = Slurm(peer_dir=peer, conf=conf)
    munged = start_munge()
    if munged is not None:
        slurm.processes.append(munged)
    try:
        daemons = [["slurmctld", "-D", "-f", str(conf)]]
        daemons += [["slurmd", "-D", "-N", node, "-f", str(conf)] for node in node_names]
        for argv in daemons:
            name = argv[0] if argv[0] == "slurmctld" else f"slurmd-{argv[3]}"
            with open(peer / "slurm" / "log" / f"{name}.out", "wb") as log:  # the child keeps its copy
                slurm.processes.append(subprocess.Popen(argv, env=slurm.env, stdin=subprocess.DEVNULL, stdout=log,
                                                        stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 20
        while True:  # the nodes come up idle within a few seconds
            states = slurm.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout.split()
            state = " ".join(states)
            if states and sorted(states[0::2]) == sorted(node_names) and set(states[1::2]) == {"idle"}:
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


@pytest.fixture(scope="session")
def slurm_two_nodes():
    """Two nodes, n1 and n2, on this host: for cluster jobs (one replica per node)."""
    cluster = start_slurm(("n1", "n2"))
    yield cluster
    cluster.stop()
