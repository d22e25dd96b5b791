"""GPUs of an SSH computer (issue 22) end to end: a real worker, the real sshd target with the stand-in
nvidia-smi (tests/gpu/stand_in.py) first on the PATH of the computer's Python, and the live server.

- the job's reserved GPU is sampled with one long-lived command on the target, and its page shows the
  charts `system/gpu/<id>/…`;
- a process outside Mado on the job's GPU keeps the job claimed, with the reason in the worker's log and on
  the job's page,
  until it ends; then the job starts; past the computer's wait (gpu_busy_wait_seconds, sent in the claim)
  the worker gives the claim back: the job is queued again with the reason, and that worker takes it
  again only after a while;
- a job without GPUs that spins in a child process and holds 200 MiB shows CPU and memory charts (its
  process group read in /proc on the target by the same kind of probe)."""
from __future__ import annotations

import getpass
import os
import subprocess

import pytest
from django.test import Client
from django.urls import reverse

from jobs import services as job_services
from jobs.models import GpuReservation, Job, JobEvent, Metric
from tests.agent_e2e_jobs.conftest import wait_until
from tests.gpu.stand_in import gpu, install, write_state

PROBE_MARK = b"gpu_uuid,pid,used_memory"  # in the probe's command line (worker_agent.gpu_remote.QUERY_APPS)
# Seconds between samples for this file's workers (MMT_WORKER_TELEMETRY_SECONDS; the product's is 10), so a
# test waiting for a second sample does not wait 20 s. It is on the probe's command line too.
INTERVAL = 2


def stand_in(e2e, apps=None):
    """The stand-in on the target with two GPUs; the computer's Python finds it first on the PATH."""
    directory = e2e.working_dir / "nvidia"
    gpus = [gpu(0, utilization=12), gpu(1, utilization=81, memory_used=40000)]
    python = install(directory, gpus, apps, owner=(e2e.uid, e2e.gid))
    e2e.computer.python_path = str(python)
    e2e.computer.save(update_fields=["python_path"])
    return directory, gpus


def probes() -> list[int]:
    """PIDs of telemetry probes (of this file's INTERVAL) running on this machine, which is also the target."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except (OSError, ValueError):
            continue
        if PROBE_MARK in argv and str(INTERVAL).encode() in argv:
            found.append(int(name))
    return found


def described(pids) -> list[str]:
    """ps's view of lingering probes: parent, age, state, for a failure message."""
    if not pids:
        return []
    ps = subprocess.run(["ps", "-o", "pid,ppid,pgid,etimes,stat,user,args", "-p", ",".join(map(str, pids))],
                        capture_output=True, text=True)
    return [line[:200] for line in ps.stdout.splitlines()]


def gpu_metrics(job) -> list[tuple[str, float, int]]:
    return list(Metric.objects.filter(job_id=job.pk, name__startswith="system/gpu/")
                .order_by("step", "name").values_list("name", "value", "step"))


def test_an_ssh_jobs_page_shows_charts_of_its_gpus_sampled_by_one_command(e2e):
    stand_in(e2e)
    e2e.start_worker(MMT_WORKER_TELEMETRY_SECONDS=INTERVAL)
    # A probe of an earlier test's job whose worker was killed may still be alive (it ends with its job's
    # processes, or at its next write to the closed channel): only this job's count.
    earlier = set(probes())
    # The job holds before its second line until the test has seen what it checks, however long that takes.
    job = e2e.counter_job("gpus", 3, 0.1, hold_at=1, gpu_ids=["1"])
    e2e.wait_status(job, "running", timeout=90)
    seen = set()

    def two_samples():
        seen.update(set(probes()) - earlier)
        return {step for _, _, step in gpu_metrics(job)} >= {1, 2}

    wait_until(two_samples, timeout=60, what=f"two GPU samples of job {job.pk} ({e2e.worker_output()[-2000:]})")
    assert len(seen) == 1, (f"one long-lived probe served every sample, not one command per sample: {seen} "
                            f"({e2e.worker_output()[-3000:]})")
    metrics = gpu_metrics(job)
    assert ("system/gpu/1/utilization", 81.0, 1) in metrics and ("system/gpu/1/memory", 40000.0, 1) in metrics
    assert ("system/gpu/1/temperature", 45.0, 2) in metrics and ("system/gpu/1/power", 71.23, 2) in metrics
    assert not [m for m in metrics if m[0].startswith("system/gpu/0/")], "only the job's reserved GPU"

    client = Client()
    client.force_login(e2e.world.member)
    page = client.get(reverse("job-detail", args=[e2e.world.project.slug, job.pk])).content.decode()
    for name in ("utilization", "memory", "temperature", "power"):
        assert f'data-metric="system/gpu/1/{name}"' in page, f"no {name} chart on the job page"

    assert e2e.job(job).status == "running", "the samples were taken while the job ran"
    e2e.release("gpus")
    e2e.wait_ended(job, timeout=90)
    e2e.assert_ended_once(job, "finished")
    wait_until(lambda: not set(probes()) - earlier, timeout=30, what="the GPU probe to end with the job")


@pytest.fixture
def outsider():
    """A real process, not of any Mado job, that the stand-in lists on a GPU."""
    process = subprocess.Popen(["sleep", "600"])
    yield process
    process.kill()
    process.wait()


def test_a_process_outside_mado_on_its_gpu_holds_the_job_claimed_until_it_ends(e2e, outsider):
    directory, gpus = stand_in(e2e, apps=[{"gpu": 1, "pid": outsider.pid, "used_memory": 2048}])
    worker = e2e.start_worker()
    job = e2e.counter_job("busy", 3, 0.1, gpu_ids=["1"])
    reason = f"GPU 1 is in use by a process outside Mado (pid {outsider.pid}, user {getpass.getuser()})"
    wait_until(lambda: reason in worker.output(), timeout=60, what=f"the reason in the log: {worker.output()[-2000:]}")
    client = Client()
    client.force_login(e2e.world.member)
    page = reverse("job-detail", args=[job.project.slug, job.pk])
    wait_until(lambda: f'Waiting for its GPUs</span><span class="event-detail muted">{reason}</span>'
               in client.get(page).content.decode(), timeout=30, what="the reason on the job's page")
    assert e2e.job(job).status == "claimed" and e2e.starts("busy") == [], "the job did not start"

    outsider.kill()
    write_state(directory, gpus, [])
    e2e.wait_ended(job, timeout=60)
    e2e.assert_ended_once(job, "finished")
    assert len(e2e.starts("busy")) == 1
    assert "its GPUs are free of processes outside Mado now; starting it" in worker.output()


def test_a_gpu_busy_past_the_wait_gives_the_claim_back_with_the_reason(e2e, outsider):
    directory, gpus = stand_in(e2e, apps=[{"gpu": 0, "pid": outsider.pid, "used_memory": 2048}])
    e2e.computer.gpu_busy_wait_seconds = 1
    e2e.computer.save(update_fields=["gpu_busy_wait_seconds"])
    # The computer's setting, not the worker's: a worker setting of 10 minutes would keep it waiting.
    worker = e2e.start_worker(MMT_WORKER_GPU_BUSY_WAIT=600)
    job = e2e.counter_job("late", 3, 0.1, gpu_ids=["0"])
    reason = f"GPU 0 is in use by a process outside Mado (pid {outsider.pid}, user {getpass.getuser()})"

    def given_back():
        return JobEvent.objects.filter(job_id=job.pk, kind="requeued").values_list("message", flat=True).first()

    line = wait_until(given_back, timeout=60, what=f"the job given back ({worker.output()[-2000:]})")
    assert line.startswith("Back in the queue: worker ")
    assert line.endswith(f" gave it back: {reason}; it waited 1 s (the computer's setting)")
    after = e2e.job(job)
    assert (after.status, after.end_reason, after.error) == ("queued", "", ""), "back in the queue, not failed"
    assert not GpuReservation.objects.filter(job_id=job.pk).exists() and e2e.starts("late") == []
    wait_until(lambda: str(job.pk) not in " ".join(e2e.journal()), timeout=30, what="the worker to forget the job")
    assert "gave its claim back to the queue" in worker.output()
    assert e2e.job(job).status == "queued", "the worker that gave it back does not take it again at once"

    # Once the GPU is free and the while has passed, the same worker takes it again and runs it.
    outsider.kill()
    write_state(directory, gpus, [])
    Job.objects.filter(pk=job.pk).update(released_at=after.released_at - job_services.RELEASE_BACKOFF)
    job_services.wake_claims(job.project_id)
    e2e.wait_ended(job, timeout=90)
    e2e.assert_ended_once(job, "finished")
    assert len(e2e.starts("late")) == 1


BURNER = r'''
import multiprocessing, os, sys, time
def spin(stop):
    while not os.path.exists(stop):
        pass
if __name__ == "__main__":
    stop = sys.argv[1]
    held = bytearray(200 * 2**20)  # resident: every page written
    for i in range(0, len(held), 4096):
        held[i] = 1
    child = multiprocessing.Process(target=spin, args=(stop,))  # the tree, not only the job's own process
    child.start()
    print("burning", flush=True)
    child.join()
    print("done", len(held), flush=True)
'''


def host_metrics(job) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    for name, value in (Metric.objects.filter(job_id=job.pk, name__in=["system/cpu/utilization",
                                                                      "system/memory/rss_bytes"])
                        .order_by("step").values_list("name", "value")):
        found.setdefault(name, []).append(value)
    return found


def test_a_job_without_gpus_shows_charts_of_its_process_trees_cpu_and_memory(e2e):
    """One probe per job reads the job's process group in /proc on the target (the supervisor's state.json
    names it): CPU in percent of one core, resident memory in bytes."""
    script = e2e.script("burner.py", BURNER)
    stop = e2e.working_dir / "burner.stop"
    earlier = set(probes())  # an earlier test's, whose worker was killed, may still be ending
    e2e.start_worker(MMT_WORKER_TELEMETRY_SECONDS=INTERVAL)
    job = e2e.create_job(command=["python", str(script), str(stop)])
    e2e.wait_status(job, "running", timeout=90)
    e2e.wait_log(job, "burning", timeout=60)

    def busy_and_big():
        found = host_metrics(job)
        return (any(v >= 25 for v in found.get("system/cpu/utilization", []))
                and any(v >= 200 * 2**20 for v in found.get("system/memory/rss_bytes", [])))

    wait_until(busy_and_big, timeout=90,
               what=f"CPU and memory samples of job {job.pk}: {host_metrics(job)} ({e2e.worker_output()[-2000:]})")
    assert not Metric.objects.filter(job_id=job.pk, name__startswith="system/gpu/").exists()

    client = Client()
    client.force_login(e2e.world.member)
    page = client.get(reverse("job-detail", args=[e2e.world.project.slug, job.pk])).content.decode()
    assert 'data-metric="system/cpu/utilization"' in page, "no CPU chart on the job page"
    assert 'data-metric="system/memory/rss_bytes"' in page, "no memory chart on the job page"

    stop.write_text("")
    e2e.wait_ended(job, timeout=90)
    e2e.assert_ended_once(job, "finished")
    wait_until(lambda: not set(probes()) - earlier, timeout=30,
               what=lambda: f"the probe to end with the job: still running {described(set(probes()) - earlier)}; "
                            f"worker: {e2e.worker_output()[-3000:]}")
