"""Cluster jobs through a real two-node Slurm (n1 and n2 on this host, tests/peers/slurm.py) end to
end: the in-process launcher logs in to the real sshd, writes the spec directory and runs the built-in
Slurm job shell (sbatch --nodes=2 --ntasks-per-node=1); the batch script starts one runner per node
with srun; each runner learns its replica from SLURM_PROCID, runs the code with the cluster variables
and reports its own logs with the Job's token; main1's runner waits for sub1's end before its finish
ends the Job, so every line of both replicas is stored. Run under flock /tmp/mado-schedulers.lock."""
from __future__ import annotations

import re

from jobs.models import Job, LogChunk
from sites import submissions
from tests.support import wait_for

# Every replica prints its cluster variables and hosts file; main1 listens on MASTER_PORT and each
# sub connects to MASTER_ADDR:MASTER_PORT and says its name (a rendezvous without any ML library).
# main1 ends as soon as it heard the sub (after `{linger}` s); the sub writes its last lines a second
# after that: they are stored because main1's runner waits for the sub's end before ending the Job.
RENDEZVOUS = '''\
import os, socket, sys, time
names = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "NODE_RANK", "LOCAL_RANK")
for key in sorted(k for k in os.environ if k.startswith("MMT_CLUSTER_") or k in names):
    print(f"{key}={os.environ[key]}", flush=True)
print("hosts:" + open(os.environ["MMT_CLUSTER_HOSTS_FILE"]).read().replace("\\n", ";"), flush=True)
port = int(os.environ["MASTER_PORT"])
if os.environ["MMT_CLUSTER_ROLE"] == "main":
    server = socket.create_server(("", port))
    server.settimeout(120)
    conn, _ = server.accept()
    print("main1 heard " + conn.recv(64).decode(), flush=True)
    conn.close()
    time.sleep({linger})
else:
    for _ in range(600):
        try:
            sock = socket.create_connection((os.environ["MASTER_ADDR"], port), timeout=5)
            break
        except OSError:
            time.sleep(0.2)
    sock.sendall(os.environ["MMT_CLUSTER_HOST"].encode())
    sock.close()
    print(os.environ["MMT_CLUSTER_HOST"] + " connected", flush=True)
    if {sub_exit}:
        sys.exit({sub_exit})
    time.sleep(1)
    for i in range(20):
        print(f"{os.environ['MMT_CLUSTER_HOST']} last line {i:02d}", flush=True)
'''


def rendezvous(*, sub_exit: int = 0, linger: float = 0) -> str:
    return RENDEZVOUS.replace("{linger}", str(linger)).replace("{sub_exit}", str(sub_exit))


def replica_log(job: Job, replica: str, stream: str = "stdout") -> str:
    """One replica's stored stream, checked to be contiguous from byte 0."""
    text, at = [], 0
    for chunk in LogChunk.objects.filter(job_id=job.pk, replica=replica, stream=stream).order_by("offset"):
        assert chunk.offset == at, f"{replica} {stream} chunk at byte {chunk.offset}, expected {at}"
        text.append(chunk.data)
        at += len(chunk.data.encode())
    return "".join(text)


def variables(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if re.match(r"^[A-Z_]+=", line))


def test_a_two_node_cluster_job_runs_one_runner_per_node_and_both_report(two_node_site, slurm_two_nodes):
    site, slurm = two_node_site, slurm_two_nodes
    job = site.cluster_job(rendezvous(), size=2, walltime_seconds=600)
    site.round()
    row = site.submission(job)
    assert row.status == "submitted", row.error
    slurm_id = row.scheduler_job_id
    details = slurm.show(slurm_id)
    for expected in (f"JobName=mmt-{job.pk}", "NumNodes=2", "NumTasks=2", "Partition=debug"):
        assert expected in details, details

    job = site.wait_status(job, "finished", "failed", "canceled", timeout=180)
    assert (job.status, job.exit_code, job.end_replica) == ("finished", 0, "main1"), (job.error,
                                                                                     site.scheduler_logs(job))
    main, sub = replica_log(job, "main1"), replica_log(job, "sub1")
    seen = {"main1": variables(main), "sub1": variables(sub)}
    for index, name in enumerate(("main1", "sub1")):
        env = seen[name]
        assert (env["MMT_CLUSTER_HOST"], env["RANK"], env["NODE_RANK"]) == (name, str(index), str(index)), env
        assert (env["MMT_CLUSTER_SIZE"], env["MMT_CLUSTER_HOSTS"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == (
            "2", "main1,sub1", "2", "0"), env
        assert env["MMT_CLUSTER_ROLE"] == ("main" if index == 0 else "sub")
        assert env["MMT_CLUSTER_IDX"] == "1"
    # Both nodes' NodeAddr is 127.0.0.1: main1's address, the same for both, as is the port.
    assert seen["main1"]["MASTER_ADDR"] == seen["sub1"]["MASTER_ADDR"] == "127.0.0.1"
    assert seen["main1"]["MMT_CLUSTER_MAIN_ADDR"] == seen["sub1"]["MMT_CLUSTER_MAIN_ADDR"] == "127.0.0.1"
    assert seen["main1"]["MASTER_PORT"] == seen["sub1"]["MASTER_PORT"]
    assert 1024 <= int(seen["main1"]["MASTER_PORT"]) <= 65535
    assert "hosts:127.0.0.1 main1;127.0.0.1 sub1;" in main and "hosts:127.0.0.1 main1;127.0.0.1 sub1;" in sub
    assert main.endswith("main1 heard sub1\n")
    assert sub.endswith("sub1 connected\n" + "".join(f"sub1 last line {i:02d}\n" for i in range(20))), sub

    summary = submissions.submission_summary(job)
    assert [r["replica"] for r in summary["replica_runners"] if r["started_at"]] == ["main1", "sub1"]
    wait_for(lambda: not slurm.queue(slurm_id), timeout=60, what="the batch job to leave the queue")
    assert "JobState=COMPLETED" in slurm.show(slurm_id)


def test_a_failing_sub_fails_the_job_naming_it_and_main1_is_stopped(two_node_site, slurm_two_nodes):
    site, slurm = two_node_site, slurm_two_nodes
    job = site.cluster_job(rendezvous(sub_exit=3, linger=300), size=2, walltime_seconds=600)
    site.round()
    slurm_id = site.submission(job).scheduler_job_id
    job = site.wait_status(job, "finished", "failed", "canceled", timeout=180)
    assert (job.status, job.end_reason, job.end_replica, job.exit_code) == ("failed", "replica_failed", "sub1", 3), \
        (job.error, site.scheduler_logs(job))
    assert job.error == "sub1 exited with code 3"
    assert replica_log(job, "sub1").endswith("sub1 connected\n")
    # main1's runner meets the ended Job at its next heartbeat, stops its code and leaves: the
    # allocation ends long before main1's five minutes.
    wait_for(lambda: not slurm.queue(slurm_id), timeout=60, what="main1 to be stopped and the batch job to end")
