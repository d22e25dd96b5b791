"""SSH between the replicas of a cluster job, and an MPI run over it (docs/cluster-jobs.md, "SSH between
replicas", "Hostfiles"; seed 004: "connect to the sub containers only from the main container … just by
running `ssh sub1`"), on three network-namespace hosts with their own sshd (conftest `hosts`).

Each host's sshd runs in a UTS namespace of its own, so `hostname` over SSH answers that host's name
(`mado-a`, `mado-b`, `mado-c`), as on separate machines. Like any standard sshd,
these read the login user's `~/.ssh/authorized_keys` (the `hosts` fixture's own file stays the worker's).
The MPI program is a small C all-reduce compiled here with Debian's mpicc: the job's venv does not see
Debian's mpi4py."""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone

from jobs import services as job_services
from jobs.models import Job, JobReplica
from mado.services import Actor
from tests.agent_e2e_jobs.conftest import wait_until
from tests.cluster_e2e.test_multi_node import node_group
from tests.peers.sshd import LOGIN_USER

# Open MPI (mpicc, mpirun) comes from Debian through `make peers`, as every peer of the suite does.

# Each rank adds rank+1 over MPI_COMM_WORLD and says where it ran (its host's IPv4 address).
ALLREDUCE = r'''
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    int rank, size, mine, sum = 0;
    char where[INET_ADDRSTRLEN] = "?";
    struct ifaddrs *all, *i;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    mine = rank + 1;
    MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (getifaddrs(&all) == 0) {
        for (i = all; i; i = i->ifa_next)
            if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && strcmp(i->ifa_name, "lo") != 0)
                inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, where, sizeof where);
        freeifaddrs(all);
    }
    printf("rank %d of %d on %s: sum %d\n", rank, size, where, sum);
    MPI_Finalize();
    return 0;
}
'''

# main1 reaches every replica by name, then runs one MPI rank per replica from the hostfile; the subs
# wait to be stopped when main1 ends.
JOB = '''\
import os, subprocess, sys, time
env = os.environ
for variable in ("MMT_CLUSTER_HOSTFILE", "MMT_CLUSTER_NODEFILE"):
    with open(env[variable]) as f:
        print(variable + ": " + f.read().replace("\\n", ";"), flush=True)
print("ranks: " + " ".join(env[k] for k in ("RANK", "NODE_RANK", "MMT_CLUSTER_IDX", "WORLD_SIZE")), flush=True)
if env["MMT_CLUSTER_ROLE"] != "main":
    time.sleep(600)
for name in ("sub1", "sub2", "main1"):
    ran = subprocess.run(["ssh", name, "hostname"], capture_output=True, text=True, timeout=60)
    print(f"ssh {name}: {ran.stdout.strip()} (exit {ran.returncode}) {ran.stderr.strip()}", flush=True)
ran = subprocess.run(["mpirun", "--hostfile", env["MMT_CLUSTER_HOSTFILE"], "--map-by", "node",
                      "-np", env["WORLD_SIZE"], sys.argv[1]], capture_output=True, text=True, timeout=240)
print(ran.stdout, flush=True)
print(ran.stderr, file=sys.stderr, flush=True)
sys.exit(ran.returncode)
'''

# Somebody's keys, the last line without an end of line: they must come back byte for byte.
THEIRS = b"# keys of the lab\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOZ7 alice@laptop\r\nssh-rsa AAAAB3Nza bob"


@pytest.fixture(scope="module")
def home_keys(hosts):
    """The hosts' sshds also read `~/.ssh/authorized_keys` of the login user (sshd's default), which
    holds THEIRS (mode 640) during the tests; the file or its absence is restored afterwards."""
    user = pwd.getpwnam(LOGIN_USER)
    ssh_dir = Path(user.pw_dir) / ".ssh"
    keys = ssh_dir / "authorized_keys"
    had_dir = ssh_dir.exists()
    before = (keys.read_bytes(), keys.stat().st_mode & 0o777) if keys.exists() else None
    for host in hosts:
        config = Path(host.process.args[-1])
        log = config.parent / "sshd.log"
        text = config.read_text()
        if ".ssh/authorized_keys" not in text:
            config.write_text(text.replace("AuthorizedKeysFile ", "AuthorizedKeysFile .ssh/authorized_keys ", 1))
            listening = log.read_text().count("Server listening on")
            host.process.send_signal(signal.SIGHUP)  # sshd re-executes itself and reads its config again
            wait_until(lambda: log.read_text().count("Server listening on") > listening, timeout=20,
                       what=f"sshd on {host.address} to read its config again")
            wait_until(host.reachable, timeout=10, what=f"sshd on {host.address}")
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    os.chown(ssh_dir, user.pw_uid, user.pw_gid)
    keys.write_bytes(THEIRS)
    os.chown(keys, user.pw_uid, user.pw_gid)
    keys.chmod(0o640)
    yield keys
    if not had_dir:
        shutil.rmtree(ssh_dir, ignore_errors=True)
    elif before is None:
        keys.unlink(missing_ok=True)
    else:
        keys.write_bytes(before[0])
        keys.chmod(before[1])


def job_key(cluster, job, placed_main) -> Path:
    """The job's private key as main1's workspace holds it."""
    return Path(placed_main.working_dir) / ".mmt" / "jobs" / f"{job.pk}-main1" / "ssh" / "id_ed25519"


def login(host, key: Path) -> subprocess.CompletedProcess:
    """`ssh HOST hostname -I` with `key` only, checking the host key against the test's known_hosts."""
    return subprocess.run(["ssh", "-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                           "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={host.known_hosts_path}",
                           "-o", "ConnectTimeout=10", f"{host.user}@{host.address}", "hostname", "-I"],
                          capture_output=True, text=True, timeout=60)


def test_main1_reaches_every_replica_by_name_and_runs_mpi_across_them_then_the_key_is_gone(cluster, hosts,
                                                                                             home_keys):
    computers, group = node_group(cluster, hosts)
    source = cluster.script("allreduce.c", ALLREDUCE)
    program = cluster.shared / "allreduce"
    subprocess.run(["mpicc", "-o", str(program), str(source)], check=True, capture_output=True, timeout=120)
    os.chmod(program, 0o755)
    script = cluster.script("replica_ssh.py", JOB)
    worker = cluster.start_worker(hosts[0].key_path.parent)
    job = cluster.create_job(compute_group=group.pk, cluster_size=3, cluster_mode="multi-node",
                             command=["python", str(script), str(program)])

    ended = cluster.wait_ended(job, timeout=240)
    main = cluster.stream(job, "main1")
    assert ended.status == "finished", (ended.error, main, cluster.stream(job, "main1", "stderr")[-3000:],
                                        cluster.worker_output()[-4000:])
    placed = {r.name: next(c for c in computers if c.pk == r.target_id) for r in JobReplica.objects.filter(job=job)}
    address = {name: computer.host for name, computer in placed.items()}
    assert len(set(address.values())) == 3, "one replica on each host"

    # `ssh NAME hostname` from main1 answers that replica's host.
    host_name = {host.address: f"mado-{host.name}" for host in hosts}
    for name in ("sub1", "sub2", "main1"):
        assert f"ssh {name}: {host_name[address[name]]} (exit 0) " in main, main

    # One MPI rank per replica, in hostfile order, and the all-reduce of 1+2+3 everywhere.
    ranks = sorted(line for line in main.splitlines() if line.startswith("rank "))
    assert ranks == [f"rank {i} of 3 on {address[name]}: sum 6" for i, name in enumerate(("main1", "sub1", "sub2"))]

    # The launchers' files, the same for every replica; RANK/NODE_RANK give the hostfile line.
    for index, name in enumerate(("main1", "sub1", "sub2")):
        text = cluster.stream(job, name)
        assert "MMT_CLUSTER_HOSTFILE: main1 slots=1;sub1 slots=1;sub2 slots=1;" in text
        assert "MMT_CLUSTER_NODEFILE: main1;sub1;sub2;" in text
        assert f"ranks: {index} {index} {1 if name == 'main1' else index} 3" in text

    # After the job, the job's key logs in nowhere and no line of it is left; the other lines are as
    # they were, mode included. The worker's own key still logs in (the check itself works).
    key = job_key(cluster, job, placed["main1"])
    assert key.exists()
    for host in hosts:
        refused = login(host, key)
        assert refused.returncode == 255 and "Permission denied" in refused.stderr, refused
        assert login(host, host.key_path).stdout.split() == [host.address]
    assert home_keys.read_bytes() == THEIRS
    assert oct(home_keys.stat().st_mode & 0o777) == oct(0o640)
    output = worker.output()
    assert "the job's SSH key is authorized on node-" in output and "expiring 20" in output
    assert output.count("the job's SSH key is removed from node-") == 3


WAITS = '''\
import os, time
print(os.environ["MMT_CLUSTER_HOST"] + " up", flush=True)
time.sleep(600)
'''


def test_a_job_that_ended_while_its_worker_was_gone_loses_its_key_when_the_worker_comes_back(cluster, hosts,
                                                                                              home_keys):
    computers, group = node_group(cluster, hosts)
    script = cluster.script("waits.py", WAITS)
    first = cluster.start_worker(hosts[0].key_path.parent)
    job = cluster.create_job(compute_group=group.pk, cluster_size=3, cluster_mode="multi-node",
                             command=["python", str(script)])
    for name in ("main1", "sub1", "sub2"):
        cluster.wait_log(job, name, f"{name} up")
    main_computer = next(c for c in computers if c.pk == JobReplica.objects.get(job=job, name="main1").target_id)
    key = job_key(cluster, job, main_computer)
    # While the job runs its key logs in (the three hosts share one home, so one line serves them all).
    assert home_keys.read_text().count(f" mado-job-{job.pk}@") == 1
    assert login(hosts[1], key).stdout.split() == [hosts[1].address]

    first.stop()  # SIGTERM: the worker leaves the job running
    Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=90))
    with transaction.atomic():  # a project admin gives the silent job up: it ends without its worker
        job_services.mark_lost(Actor(cluster.world.project_admin), cluster.job(job))
    second = cluster.start_worker(hosts[0].key_path.parent)

    wait_until(lambda: f"mado-job-{job.pk}@" not in home_keys.read_text(), timeout=90,
               what="the job's authorized_keys line to be removed by the returning worker")
    assert home_keys.read_bytes() == THEIRS
    for host in hosts:
        refused = login(host, key)
        assert refused.returncode == 255 and "Permission denied" in refused.stderr, refused
    assert f"job {job.pk} is no longer held by this worker" in second.output()
