"""A multi-node cluster job's GPUs (issue 22 for replicas) end to end: two "hosts" in their own network
namespaces, each with its own real sshd (tests/cluster_e2e/conftest.py `hosts`) and its own stand-in
nvidia-smi (tests/gpu/stand_in.py, its own readings) first on the PATH of its computer's Python; a real
`mado-tracking-worker run` and the live server.

- before the start, a process outside Mado on the GPU reserved for the replica on the second host keeps the
  whole job claimed, with the replica and the process named on its timeline and on the GPU board, until
  it ends; then every replica starts;
- while it runs, each replica's computer is sampled by its own probe over that host's SSH connection:
  `system/<replica>/gpu/<id>/…` carry that host's readings, `system/<replica>/memory/rss_bytes` that
  replica's process group, and the job page charts them;
- a process outside Mado that appears on a replica's GPU while the job runs is counted
  (`system/<replica>/gpu/<id>/outside_processes`) and the board shows the GPU busy outside the app."""
from __future__ import annotations

import getpass
import subprocess

import pytest
from django.test import Client
from django.urls import reverse

from jobs.models import JobEvent, JobReplica, Metric
from tests.agent_e2e_jobs.conftest import wait_until
from tests.cluster_e2e.conftest import cluster, hosts, sshd  # noqa: F401  (fixtures)
from tests.gpu.stand_in import gpu, install, write_state
from tests.gpu.test_gpu_board import row

BUSY = "Busy outside the app"

# Every replica says it is up, then waits for the stop file (shared by every "host": one filesystem).
UNTIL_STOPPED = '''\
import os, sys, time
name = os.environ["MMT_CLUSTER_HOST"]
print(f"{name} up on GPU {os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
print(f"{name} done", flush=True)
'''


@pytest.fixture
def outsiders():
    """Real processes, of no Mado job, that a stand-in lists on a GPU."""
    started = []

    def start():
        process = subprocess.Popen(["sleep", "600"])
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()


def test_a_cluster_jobs_replicas_are_busy_checked_and_sampled_on_their_own_hosts(cluster, hosts, outsiders):
    readings = {"a": (11, 1111), "b": (77, 7777)}  # (utilisation %, MiB used) of both GPUs of each host
    computers, smi, gpus = {}, {}, {}
    for host in hosts[:2]:
        computer = cluster.computer(f"node-{host.name}", host=host.address, port=host.port, key_path=host.key_path,
                                    known_hosts_path=host.known_hosts_path, gpu_ids=["0", "1"])
        utilization, memory = readings[host.name]
        gpus[host.name] = [gpu(i, utilization=utilization, memory_used=memory) for i in (0, 1)]
        smi[host.name] = cluster.directory(f"cluster-e2e-{cluster.tag}-smi-{host.name}")
        cluster.working_dirs.append(smi[host.name])
        computer.python_path = str(install(smi[host.name], gpus[host.name], owner=(cluster.uid, cluster.gid)))
        computer.save(update_fields=["python_path"])
        computers[host.name] = computer
    busy = outsiders()
    write_state(smi["b"], gpus["b"], [{"gpu": i, "pid": busy.pid, "used_memory": 2048} for i in (0, 1)])
    group = cluster.group(computers.values())
    stop = cluster.shared / "stop"
    script = cluster.script("until_stopped.py", UNTIL_STOPPED)
    worker = cluster.start_worker(hosts[0].key_path.parent)
    job = cluster.create_job(compute_group=group.pk, cluster_size=2, cluster_mode="multi-node", gpus_per_replica=1,
                             command=["python", str(script), str(stop)])

    # Claimed: the replica on host b waits for its GPU, and with it the whole job.
    wait_until(lambda: JobReplica.objects.filter(job=job).count() == 2, timeout=60, what="the claim")
    placed = {r.target_id: r for r in JobReplica.objects.filter(job=job)}
    on = {name: placed[computers[name].pk] for name in ("a", "b")}
    gpu_b = on["b"].gpu_ids[0]
    reason = (f"GPU {gpu_b} of {on['b'].name} on {computers['b'].name} is in use by a process outside Mado "
              f"(pid {busy.pid}, user {getpass.getuser()})")
    wait_until(lambda: JobEvent.objects.filter(job=job, kind="waiting", message=f"Waiting for its GPUs: {reason}")
               .exists(), timeout=90, what=f"the replica's reason on the timeline ({worker.output()[-3000:]})")
    assert f"waits (claimed): {reason}" in worker.output()
    assert cluster.job(job).status == "claimed" and not job.log_chunks.exists(), "no replica started"
    client = Client()
    client.force_login(cluster.world.member)
    board = client.get(reverse("gpu-board")).content.decode()
    waiting = row(board, computers["b"].name, gpu_b)
    assert BUSY in waiting and f"pid {busy.pid}, user {getpass.getuser()}" in waiting and f"#{job.pk}" in waiting
    assert BUSY not in row(board, computers["a"].name, on["a"].gpu_ids[0]), "host a's GPU is free of outsiders"

    busy.kill()
    write_state(smi["b"], gpus["b"], [])
    for name in ("main1", "sub1"):
        cluster.wait_log(job, name, f"{name} up on GPU ")
    assert "its GPUs are free of processes outside Mado now; starting it" in worker.output()

    # Running: each replica's own host, through its own probe.
    def series(replica) -> dict[str, float]:
        points = Metric.objects.filter(job=job, name__startswith=f"system/{replica.name}/").order_by("step")
        return {name: value for name, value in points.values_list("name", "value")}

    def sampled():
        return all(f"system/{r.name}/gpu/{r.gpu_ids[0]}/utilization" in series(r)
                   and f"system/{r.name}/memory/rss_bytes" in series(r) for r in on.values())

    wait_until(sampled, timeout=90, what=f"samples of both replicas ({worker.output()[-3000:]})")
    for host, replica in on.items():
        got = series(replica)
        utilization, memory = readings[host]
        gpu_id = replica.gpu_ids[0]
        assert got[f"system/{replica.name}/gpu/{gpu_id}/utilization"] == utilization, f"{replica.name}: its own host"
        assert got[f"system/{replica.name}/gpu/{gpu_id}/memory"] == memory
        assert got[f"system/{replica.name}/memory/rss_bytes"] > 0
        other = str(1 - int(gpu_id))
        assert not any(f"/gpu/{other}/" in name for name in got), "only the replica's reserved GPU"
    assert not Metric.objects.filter(job=job, name__startswith="system/gpu/").exists(), "every name has its replica"

    # A process outside Mado joins host b's GPU while the job runs.
    late = outsiders()
    write_state(smi["b"], gpus["b"], [{"gpu": int(gpu_b), "pid": late.pid, "used_memory": 512}])
    outside = f"system/{on['b'].name}/gpu/{gpu_b}/outside_processes"
    wait_until(lambda: series(on["b"]).get(outside) == 1.0, timeout=60,
               what=f"{outside} ({worker.output()[-3000:]})")
    assert not any(name.endswith("outside_processes") for name in series(on["a"]))
    shared = row(client.get(reverse("gpu-board")).content.decode(), computers["b"].name, gpu_b)
    assert BUSY in shared and "1 process beside the Job" in shared
    page = client.get(reverse("job-detail", args=[cluster.world.project.slug, job.pk])).content.decode()
    for replica in on.values():
        assert f'data-metric="system/{replica.name}/gpu/{replica.gpu_ids[0]}/utilization"' in page
    assert f'data-metric="{outside}"' in page

    stop.write_text("")
    ended = cluster.wait_ended(job)
    assert ended.status == "finished", (ended.status, ended.error, worker.output()[-4000:])
