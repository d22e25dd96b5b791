"""The GPU probe (worker_agent.gpu_remote) run for real against the stand-in nvidia-smi (tests/gpu/stand_in.py)
on this machine's own processes: what a sample holds, which processes count as outside Mado, how it
fails when nvidia-smi finds no GPU or is missing, and that telemetry is one long-lived command."""
from __future__ import annotations

import getpass
import json
import os
import subprocess

import pytest

from tests.gpu.stand_in import calls, gpu, install, write_state
from worker_agent import gpu_remote
from worker_agent.ssh import LocalConnection


@pytest.fixture
def smi(tmp_path):
    directory = tmp_path / "gpu"
    install(directory, [gpu(0), gpu(1, utilization=81, memory_used=40000, power="[N/A]")])
    return directory


def local(directory, with_smi=True) -> LocalConnection:
    path = os.environ["PATH"]
    return LocalConnection(env={**os.environ, "PATH": f"{directory}:{path}" if with_smi else "/usr/bin:/bin"})


@pytest.fixture
def sleeper():
    processes = []

    def start(**env):
        process = subprocess.Popen(["sleep", "120"], env={**os.environ, **env})
        processes.append(process)
        return process

    yield start
    for process in processes:
        process.kill()
        process.wait()


def test_a_sample_reads_every_gpu_and_leaves_out_what_a_gpu_cannot_measure(smi):
    sample = gpu_remote.sample_once(local(smi), "/usr/bin/python3")
    assert sample.error is None
    assert [(g.index, g.utilization, g.memory_used, g.memory_total, g.temperature) for g in sample.gpus] == \
        [("0", 37.0, 1536.0, 81559.0, 45.0), ("1", 81.0, 40000.0, 81559.0, 45.0)]
    assert sample.gpus[0].power == 71.23 and sample.gpus[1].power is None, "[N/A] is no number"
    points = gpu_remote.metric_points(sample, ["1"], 3, "2026-12-04T00:00:00+00:00")
    assert {(p["name"], p["value"], p["step"]) for p in points} == {
        ("system/gpu/1/utilization", 81.0, 3), ("system/gpu/1/memory", 40000.0, 3),
        ("system/gpu/1/temperature", 45.0, 3)}, "only the job's GPU, and no power where the GPU has none"
    uuid = sample.gpus[1].uuid
    assert gpu_remote.metric_points(sample, [uuid], 1, "2026-12-04T00:00:00+00:00")[0]["name"] == \
        f"system/gpu/{uuid}/utilization", "a GPU registered by its UUID is found too"


def test_a_process_outside_mado_is_named_with_its_pid_and_user_and_a_jobs_own_is_not(smi, sleeper):
    outsider = sleeper()
    ours = sleeper(MMT_JOB_ID="42")
    write_state(smi, [gpu(0), gpu(1)], [{"gpu": 1, "pid": outsider.pid, "used_memory": 2048},
                                         {"gpu": 0, "pid": ours.pid, "used_memory": 1024}])
    sample = gpu_remote.sample_once(local(smi), "/usr/bin/python3")
    assert [(p.pid, p.job_id) for p in sample.processes] == [(outsider.pid, None), (ours.pid, "42")]
    assert sample.foreign(["0"]) == [], "a Mado job's process does not hold the GPU against Mado"
    foreign = sample.foreign(["0", "1"])
    assert gpu_remote.busy_reason(foreign) == \
        f"GPU 1 is in use by a process outside Mado (pid {outsider.pid}, user {getpass.getuser()})"


def test_no_gpus_and_no_nvidia_smi_are_reasons_not_readings(smi):
    write_state(smi, [])
    sample = gpu_remote.sample_once(local(smi), "/usr/bin/python3")
    assert sample.gpus == [] and sample.error == "No devices were found"
    missing = gpu_remote.sample_once(local(smi, with_smi=False), "/usr/bin/python3")
    assert missing.error == "nvidia-smi is not on the PATH of the computer's login shell"
    assert gpu_remote.sample_once(local(smi), "/nowhere/python3").error.startswith("The GPU probe failed")


def test_telemetry_is_one_long_lived_command_printing_a_line_per_interval(smi):
    lines = []
    with gpu_remote.probe_stream(local(smi), "/usr/bin/python3", 0.05, timeout=30) as stream:
        for line in gpu_remote.read_lines(stream, lambda: len(lines) >= 4):
            lines.append(gpu_remote.parse_line(line))
        pid = stream.proc.pid
    assert [len(s.gpus) for s in lines] == [2, 2, 2, 2] and all(s.size > 0 for s in lines)
    assert calls(smi)[:8] == ["query-gpu", "query-compute-apps"] * 4
    assert pid > 0, "one process served every sample"


@pytest.mark.parametrize("value, seconds", [("", 600.0), ("0", 0.0), ("30", 30.0), ("soon", 600.0), ("-1", 600.0)])
def test_the_busy_wait_setting(value, seconds):
    assert gpu_remote.busy_wait_seconds({gpu_remote.BUSY_WAIT_SETTING: value}) == seconds


BURN = "import os, sys, time\nheld = bytearray(64 * 2**20)\nfor i in range(0, len(held), 4096):\n    held[i] = 1\n" \
       "print('ready', flush=True)\nwhile True:\n    pass\n"


def test_the_probe_reads_cpu_and_memory_of_the_jobs_process_group_and_goes_on_without_nvidia_smi(tmp_path):
    """A job's process group (its pgid in the supervisor's state.json) that spins and holds 64 MiB; the
    computer has no nvidia-smi: the error is said once and the CPU and memory samples go on."""
    job = subprocess.Popen(["/usr/bin/python3", "-c", BURN], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert job.stdout.readline() == b"ready\n"
        state = tmp_path / "state.json"
        state.write_text(f'{{"status": "running", "pid": {job.pid}, "pgid": {job.pid}}}')
        samples = []
        with gpu_remote.probe_stream(local(tmp_path, with_smi=False), "/usr/bin/python3", 0.3, gpus=True,
                                     state_path=str(state), timeout=30) as stream:
            for line in gpu_remote.read_lines(stream, lambda: len(samples) >= 4):
                samples.append(gpu_remote.parse_line(line))
    finally:
        job.kill()
        job.wait()
    assert samples[0].error == "nvidia-smi is not on the PATH of the computer's login shell"
    assert [s.error for s in samples[1:]] == [None, None, None] and not any(s.gpus for s in samples)
    assert all(s.group.processes == 1 and s.group.rss >= 64 * 2**20 for s in samples)
    points = gpu_remote.host_points(samples[-1].group, samples[0].group, 3, "2026-12-04T00:00:00Z")
    values = {p["name"]: p["value"] for p in points}
    assert values["system/memory/rss_bytes"] >= 64 * 2**20
    assert values["system/cpu/utilization"] > 10, "a spinning process keeps a good part of a core busy"


def test_cpu_is_percent_of_one_core_from_two_samples_and_never_negative():
    before = gpu_remote.Group(time=100.0, ticks=1000, hz=100, rss=5, processes=2)
    two_cores = gpu_remote.Group(time=110.0, ticks=3000, hz=100, rss=7, processes=2)
    a_child_ended = gpu_remote.Group(time=120.0, ticks=2500, hz=100, rss=7, processes=1)
    stamp = "2026-12-04T00:00:00Z"
    assert [p["name"] for p in gpu_remote.host_points(before, None, 1, stamp)] == ["system/memory/rss_bytes"]
    assert {p["name"]: p["value"] for p in gpu_remote.host_points(two_cores, before, 2, stamp)} == {
        "system/memory/rss_bytes": 7.0, "system/cpu/utilization": 200.0}
    assert gpu_remote.host_points(a_child_ended, two_cores, 3, stamp)[1]["value"] == 0.0
    assert gpu_remote.host_points(None, before, 4, stamp) == []


def test_a_docker_jobs_group_is_the_docker_clients_and_is_not_reported_as_the_jobs(tmp_path):
    """A Docker Job's process group is the `docker run` client's, not the container's (its processes are the
    daemon's children): sampling it would show the client's few MiB as the job's memory. The probe reports
    no group for it (docs/gpus.md), while the same group as a Python Job's is read."""
    client = subprocess.Popen(["/usr/bin/python3", "-c", BURN], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert client.stdout.readline() == b"ready\n"
        groups = {}
        for runtime in ("docker", "python"):
            state = tmp_path / f"{runtime}.json"
            state.write_text(json.dumps({"status": "running", "runtime": runtime, "pid": client.pid,
                                         "pgid": client.pid}))
            samples = []
            with gpu_remote.probe_stream(local(tmp_path, with_smi=False), "/usr/bin/python3", 0.3, gpus=False,
                                         state_path=str(state), timeout=30) as stream:
                for line in gpu_remote.read_lines(stream, lambda: len(samples) >= 2):
                    samples.append(gpu_remote.parse_line(line))
            groups[runtime] = [s.group for s in samples]
    finally:
        client.kill()
        client.wait()
    assert groups["docker"] == [None, None]
    assert all(group.processes == 1 and group.rss >= 64 * 2**20 for group in groups["python"])
