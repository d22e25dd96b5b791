"""Multi-node cluster jobs on three "hosts" in separate network namespaces, each with its own real
sshd (tests/cluster_e2e/conftest.py `hosts`): the replicas find each other through the cluster
environment the worker gives them, and a failing sub ends the job."""
from __future__ import annotations

import glob
import os
import shutil
import time

from computers.models import ComputeTarget
from jobs.models import GpuReservation, JobEvent, JobReplica
from tests.agent_e2e_jobs.conftest import TARGET_PYTHON
from tests.support import processes_under
from tests.cluster_e2e.conftest import RENDEZVOUS, replica_env
from worker_agent import supervisor

# Every replica says it is up (with the time) and leaves a mark in MARKS; sub1 gives up once main1 and
# sub2 have said so, or after GIVE_UP seconds: its failure never depends on how fast the others start.
SLEEPER = '''\
import os, sys, time
name, marks = os.environ["MMT_CLUSTER_HOST"], os.environ.get("MARKS")
print(f"{name} up {time.time():.3f}", flush=True)
if marks:
    open(os.path.join(marks, name), "w").close()
if name == "sub1":
    deadline = time.monotonic() + float(os.environ.get("GIVE_UP", "60"))
    while marks and time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(marks, other)) for other in ("main1", "sub2")):
        time.sleep(0.05)
    print("sub1 gives up", flush=True)
    sys.exit(3)
time.sleep(300)
'''


def node_group(cluster, hosts):
    computers = [cluster.computer(f"node-{h.name}", host=h.address, port=h.port, key_path=h.key_path,
                                  known_hosts_path=h.known_hosts_path) for h in hosts]
    return computers, cluster.group(computers)


def test_three_replicas_on_three_hosts_meet_at_main1s_master_port(cluster, hosts):
    computers, group = node_group(cluster, hosts)
    script = cluster.script("rendezvous.py", RENDEZVOUS)
    worker = cluster.start_worker(hosts[0].key_path.parent)
    job = cluster.create_job(compute_group=group.pk, cluster_size=3, cluster_mode="multi-node",
                             command=["python", str(script)])

    ended = cluster.wait_ended(job)
    assert ended.status == "finished", (ended.status, ended.end_reason, ended.error, cluster.worker_output()[-6000:])
    assert ended.end_replica == "main1"
    placed = {r.name: r.target_id for r in JobReplica.objects.filter(job=job)}
    assert sorted(placed.values()) == sorted(c.pk for c in computers), "one replica on each host"
    address = {c.pk: c.host for c in computers}

    outs = {name: cluster.stream(job, name) for name in ("main1", "sub1", "sub2")}
    envs = {name: replica_env(text) for name, text in outs.items()}
    port = envs["main1"]["MASTER_PORT"]
    main_addr = address[placed["main1"]]
    for index, name in enumerate(("main1", "sub1", "sub2")):
        env = envs[name]
        assert env["MMT_CLUSTER_HOST"] == name
        assert env["MMT_CLUSTER_IDX"] == ("1" if name == "main1" else str(index))
        assert env["MMT_CLUSTER_HOSTS"] == "main1,sub1,sub2"
        assert (env["MMT_CLUSTER_SIZE"], env["WORLD_SIZE"], env["MMT_CLUSTER_MODE"]) == ("3", "3", "multi-node")
        assert env["MMT_CLUSTER_ROLE"] == ("main" if name == "main1" else "sub")
        assert (env["RANK"], env["NODE_RANK"], env["LOCAL_RANK"]) == (str(index), str(index), "0")
        assert env["MASTER_PORT"] == port and env["MMT_JOB_ID"] == str(job.pk)
        expected_main = "127.0.0.1" if name == "main1" else main_addr
        assert env["MMT_CLUSTER_MAIN_ADDR"] == env["MASTER_ADDR"] == expected_main
        # The hosts file maps every replica to its computer's address (loopback for itself).
        hosts_line = next(line for line in outs[name].splitlines() if line.startswith("hosts file: "))
        mapping = dict(item.split("@") for item in hosts_line.removeprefix("hosts file: ").split())
        assert mapping == {other: "127.0.0.1" if other == name else address[placed[other]]
                           for other in ("main1", "sub1", "sub2")}
    main_lines = outs["main1"].splitlines()
    assert "all 2 connected" in main_lines
    connected = sorted(line.split()[1] for line in main_lines if line.startswith("connected: "))
    assert connected == ["sub1", "sub2"]
    assert {line.split()[-1] for line in main_lines if line.startswith("connected: ")} == {
        address[placed["sub1"]], address[placed["sub2"]]}, "each sub came from its own host"
    for name in ("sub1", "sub2"):
        assert outs[name].splitlines()[-1] == "main1 says welcome"
        assert "connected:" not in outs[name] and "main1 says" not in outs["main1"], "logs stay per replica"
    assert not GpuReservation.objects.filter(job=job).exists()
    assert "MASTER_PORT" in worker.output() and "sub2 started on node-" in worker.output()


def marks_dir(cluster):
    marks = cluster.directory(f"cluster-e2e-{cluster.tag}-marks")
    cluster.working_dirs.append(marks)
    return marks


def up_lines(text: str) -> list[str]:
    return [" ".join(line.split()[:2]) if line.endswith(tuple("0123456789")) else line for line in text.splitlines()]


def test_a_failing_sub_stops_the_others_and_fails_the_job_naming_it(cluster, hosts):
    _, group = node_group(cluster, hosts)
    script = cluster.script("sleeper.py", SLEEPER)
    cluster.start_worker(hosts[0].key_path.parent)
    job = cluster.create_job(compute_group=group.pk, cluster_size=3, cluster_mode="multi-node",
                             command=["python", str(script)], env={"MARKS": str(marks_dir(cluster))})
    for name in ("main1", "sub2"):
        cluster.wait_log(job, name, f"{name} up")
    failed_at = time.monotonic()

    ended = cluster.wait_ended(job, timeout=60)
    assert time.monotonic() - failed_at < 30, "main1's sleep 300 was cut short"
    assert (ended.status, ended.end_reason, ended.end_replica, ended.exit_code) == ("failed", "replica_failed",
                                                                                     "sub1", 3)
    assert "sub1 exited with code 3" in ended.error
    assert up_lines(cluster.stream(job, "sub1")) == ["sub1 up", "sub1 gives up"]
    for name in ("main1", "sub2"):
        assert "[mado] Stop requested: sending SIGTERM" in cluster.stream(job, name, "stderr")
    for directory in cluster.working_dirs[1:]:
        for name in ("main1", "sub1", "sub2"):
            assert not processes_under(supervisor.workspace(str(directory), f"{job.pk}-{name}"))
    assert list(JobEvent.objects.filter(job=job, kind__in=("finished", "failed", "canceled"))
                .values_list("kind", flat=True)) == ["failed"]


def test_replicas_start_together_when_one_takes_longer_to_prepare(cluster, hosts):
    """Issue 14: the venv is built by each replica's supervisor. Before the start barrier, a replica
    whose venv was ready first ran alone: sub1 failed (here after GIVE_UP s, as a quick failure does)
    while sub2 still built its venv, so sub2 was stopped before its process existed and `sub2 up` was
    never written. Now every supervisor prepares and holds, and all are released together."""
    computers, group = node_group(cluster, hosts)
    slow = cluster.script("slow-venv-python", "#!/bin/sh\n"  # node-c: the venv is ready 15 s later
                          f'if [ "$1 $2" = "-m venv" ]; then {TARGET_PYTHON} "$@"; rc=$?; sleep 15; exit $rc; fi\n'
                          f'exec {TARGET_PYTHON} "$@"\n')
    slow.chmod(0o755)
    ComputeTarget.objects.filter(pk=computers[2].pk).update(python_path=str(slow))
    script = cluster.script("sleeper.py", SLEEPER)
    worker = cluster.start_worker(hosts[0].key_path.parent)
    job = cluster.create_job(compute_group=group.pk, cluster_size=3, cluster_mode="multi-node",
                             command=["python", str(script)], env={"MARKS": str(marks_dir(cluster)), "GIVE_UP": "5"})

    ended = cluster.wait_ended(job, timeout=150)
    assert (ended.status, ended.end_reason, ended.end_replica, ended.exit_code) == ("failed", "replica_failed",
                                                                                     "sub1", 3), ended.error
    firsts = {name: (cluster.stream(job, name).splitlines() or [""])[0] for name in ("main1", "sub1", "sub2")}
    assert all(line.startswith(f"{name} up ") for name, line in firsts.items()), (firsts,
                                                                                  cluster.worker_output()[-4000:])
    placed = {r.name: next(c for c in computers if c.pk == r.target_id) for r in JobReplica.objects.filter(job=job)}
    assert placed["sub2"].pk == computers[2].pk, "sub2 is the replica on the slow computer"
    ready = {name: os.stat(path).st_mtime for name, computer in placed.items()
             for path in glob.glob(f"{computer.working_dir}/.mmt-cache/venvs/*/.mmt-ready")}
    assert set(ready) == {"main1", "sub1", "sub2"}
    for name, line in firsts.items():
        assert float(line.split()[-1]) >= max(ready.values()), f"{name} ran before every replica was prepared"
    for name in firsts:
        assert "[mado] Prepared; waiting until every replica of the job is prepared." in cluster.stream(
            job, name, "stderr")
    assert up_lines(cluster.stream(job, "sub1")) == ["sub1 up", "sub1 gives up"]
    assert "waiting for sub2 to be prepared" in worker.output()
    for name in ("main1", "sub2"):
        assert "[mado] Stop requested: sending SIGTERM" in cluster.stream(job, name, "stderr")


def test_a_replica_that_cannot_start_stops_those_started_and_fails_the_job_naming_it(cluster, hosts):
    computers, group = node_group(cluster, hosts)
    script = cluster.script("sleeper.py", SLEEPER)
    # Replicas go to the computers in name order when each has room for one: sub2 lands on node-c,
    # whose working directory is gone, so main1 and sub1 have started when sub2's start is refused.
    shutil.rmtree(computers[2].working_dir)
    cluster.start_worker(hosts[0].key_path.parent)
    job = cluster.create_job(compute_group=group.pk, cluster_size=3, cluster_mode="multi-node",
                             command=["python", str(script)])

    ended = cluster.wait_ended(job, timeout=60)
    assert (ended.status, ended.end_reason, ended.end_replica) == ("failed", "start_failed", "sub2"), ended.error
    assert ended.error.startswith("sub2: ") and "does not exist" in ended.error
    assert JobReplica.objects.get(job=job, name="sub2").target_id == computers[2].pk
    output = cluster.worker_output()
    assert "main1 started on" in output and "sub1 started on" in output
    assert "main1 stopped" in output and "sub1 stopped" in output
    for replica in JobReplica.objects.filter(job=job):
        directory = next(c for c in computers if c.pk == replica.target_id).working_dir
        assert not processes_under(supervisor.workspace(directory, f"{job.pk}-{replica.name}"))
    assert not GpuReservation.objects.filter(job=job).exists()
