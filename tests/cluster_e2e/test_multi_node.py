"""Multi-node cluster jobs on three "hosts" in separate network namespaces, each with its own real
sshd (tests/cluster_e2e/conftest.py `hosts`): the replicas find each other through the cluster
environment the worker gives them, and a failing sub ends the job."""
from __future__ import annotations

import shutil
import time

from jobs.models import GpuReservation, JobEvent, JobReplica
from tests.support import processes_under
from tests.cluster_e2e.conftest import RENDEZVOUS, replica_env
from worker_agent import supervisor

SLEEPER = '''\
import os, sys, time
print(f"{os.environ['MMT_CLUSTER_HOST']} up", flush=True)
if os.environ["MMT_CLUSTER_HOST"] == "sub1":
    time.sleep(1)
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


def test_a_failing_sub_stops_the_others_and_fails_the_job_naming_it(cluster, hosts):
    _, group = node_group(cluster, hosts)
    script = cluster.script("sleeper.py", SLEEPER)
    cluster.start_worker(hosts[0].key_path.parent)
    job = cluster.create_job(compute_group=group.pk, cluster_size=3, cluster_mode="multi-node",
                             command=["python", str(script)])
    for name in ("main1", "sub2"):
        cluster.wait_log(job, name, f"{name} up")
    failed_at = time.monotonic()

    ended = cluster.wait_ended(job, timeout=60)
    assert time.monotonic() - failed_at < 30, "main1's sleep 300 was cut short"
    assert (ended.status, ended.end_reason, ended.end_replica, ended.exit_code) == ("failed", "replica_failed",
                                                                                     "sub1", 3)
    assert "sub1 exited with code 3" in ended.error
    assert cluster.stream(job, "sub1").splitlines() == ["sub1 up", "sub1 gives up"]
    for name in ("main1", "sub2"):
        assert "[mado] Stop requested: sending SIGTERM" in cluster.stream(job, name, "stderr")
    for directory in cluster.working_dirs[1:]:
        for name in ("main1", "sub1", "sub2"):
            assert not processes_under(supervisor.workspace(str(directory), f"{job.pk}-{name}"))
    assert list(JobEvent.objects.filter(job=job, kind__in=("finished", "failed", "canceled"))
                .values_list("kind", flat=True)) == ["failed"]


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
