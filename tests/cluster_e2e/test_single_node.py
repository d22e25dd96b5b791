"""Single-node cluster jobs on one computer (a real loopback sshd): disjoint GPU sets per replica, a
stop request that stops every replica, and a worker killed mid-job that re-attaches to every replica.
No GPU exists here: the replicas print the CUDA_VISIBLE_DEVICES they were given."""
from __future__ import annotations

from django.db import transaction

from jobs import services as job_services
from mado.services import Actor
from tests.support import processes_under
from tests.cluster_e2e.conftest import RENDEZVOUS, replica_env
from worker_agent import supervisor

WAITS = '''\
import os, sys, time
name = os.environ["MMT_CLUSTER_HOST"]
with open(os.path.join(os.environ["MARKS"], name), "a") as f:
    f.write(f"{os.getpid()}\\n")
print(f"{name} ready", flush=True)
for i in range(int(sys.argv[1])):
    print(f"{name} line {i}", flush=True)
    time.sleep(float(sys.argv[2]))
if name == "main1":
    time.sleep(3)  # the subs end first: the job ends with main1 and stops what is left
print(f"{name} done", flush=True)
'''


def box(cluster, sshd, concurrency=3):
    return cluster.computer("box", host="127.0.0.1", port=sshd.port, key_path=sshd.key_path,
                            known_hosts_path=sshd.known_hosts_path, gpu_ids=["0", "1", "2", "3"],
                            concurrency=concurrency)


def workspaces(cluster, job, names) -> list[str]:
    return [supervisor.workspace(str(cluster.working_dirs[-1]), f"{job.pk}-{name}") for name in names]


def test_two_replicas_on_one_computer_get_disjoint_gpus(cluster, sshd):
    computer = box(cluster, sshd, concurrency=2)
    script = cluster.script("rendezvous.py", RENDEZVOUS)
    cluster.start_worker(sshd.client_dir)
    job = cluster.create_job(computer=computer.pk, cluster_size=2, gpus_per_replica=2, command=["python", str(script)])

    ended = cluster.wait_ended(job)
    assert ended.status == "finished", (ended.status, ended.end_reason, ended.error, cluster.worker_output()[-5000:])
    envs = {name: replica_env(cluster.stream(job, name)) for name in ("main1", "sub1")}
    gpus = {name: set(env["CUDA_VISIBLE_DEVICES"].split(",")) for name, env in envs.items()}
    assert all(len(ids) == 2 for ids in gpus.values()) and not gpus["main1"] & gpus["sub1"], gpus
    assert gpus["main1"] | gpus["sub1"] == {"0", "1", "2", "3"}
    reserved = {r.name: set(r.gpu_ids) for r in job.replicas.all()}
    assert reserved == gpus, "each replica sees exactly the GPUs the server reserved for it"
    for env in envs.values():
        assert (env["MMT_CLUSTER_MODE"], env["MMT_CLUSTER_MAIN_ADDR"], env["MASTER_ADDR"]) == (
            "single-node", "127.0.0.1", "127.0.0.1")
    assert "all 1 connected" in cluster.stream(job, "main1")
    assert cluster.stream(job, "sub1").splitlines()[-1] == "main1 says welcome"


def test_a_stop_request_stops_every_replica(cluster, sshd):
    computer = box(cluster, sshd)
    script = cluster.script("waits.py", WAITS)
    marks = cluster.directory(f"cluster-e2e-{cluster.tag}-marks")
    cluster.working_dirs.append(marks)
    worker = cluster.start_worker(sshd.client_dir)
    job = cluster.create_job(computer=computer.pk, cluster_size=3, command=["python", str(script), "3000", "0.1"],
                             env={"MARKS": str(marks)})
    for name in ("main1", "sub1", "sub2"):
        cluster.wait_log(job, name, f"{name} ready")
    with transaction.atomic():
        job_services.request_stop(Actor(cluster.world.member), cluster.job(job))

    ended = cluster.wait_ended(job, timeout=60)
    assert (ended.status, ended.end_reason, ended.end_replica) == ("canceled", "canceled", ""), ended.error
    for name, directory in zip(("main1", "sub1", "sub2"), workspaces(cluster, job, ("main1", "sub1", "sub2")),
                               strict=True):
        assert "[mado] Stop requested: sending SIGTERM" in cluster.stream(job, name, "stderr")
        assert f"{name} done" not in cluster.stream(job, name)
        assert not processes_under(directory), f"{name} still runs"
    assert "stop requested; SIGTERM now" in worker.output()


def test_a_worker_killed_mid_job_reattaches_to_every_replica(cluster, sshd):
    computer = box(cluster, sshd)
    script = cluster.script("waits.py", WAITS)
    marks = cluster.directory(f"cluster-e2e-{cluster.tag}-marks")
    cluster.working_dirs.append(marks)
    first = cluster.start_worker(sshd.client_dir)
    job = cluster.create_job(computer=computer.pk, cluster_size=3, command=["python", str(script), "60", "0.1"],
                             env={"MARKS": str(marks)})
    for name in ("main1", "sub1", "sub2"):
        cluster.wait_log(job, name, f"{name} line 5")
    first.kill()
    second = cluster.start_worker(sshd.client_dir)

    ended = cluster.wait_ended(job)
    assert ended.status == "finished", (ended.status, ended.error, cluster.worker_output()[-5000:])
    for name in ("main1", "sub1", "sub2"):
        lines = cluster.stream(job, name).splitlines()  # contiguous: no byte twice, none missing
        assert lines == [f"{name} ready", *(f"{name} line {i}" for i in range(60)), f"{name} done"]
        assert len((marks / name).read_text().split()) == 1, f"{name} was started twice"
    assert "main1 re-attached" in second.output() and "sub2 re-attached" in second.output()
