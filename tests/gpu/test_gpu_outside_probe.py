"""What the worker says about processes outside Mado (worker_agent.gpu_remote), from the real probe run
against the stand-in nvidia-smi (tests/gpu/stand_in.py) on this machine's own processes: the count that a
running job's samples carry (`…/outside_processes`, only while there are some, then one 0), the names of
a cluster job's replicas' metrics, and a waiting reason that always fits the heartbeat."""
from __future__ import annotations

import getpass

from tests.gpu.stand_in import gpu, write_state
from tests.gpu.test_gpu_remote import local, sleeper, smi  # noqa: F401  (fixtures)
from worker_agent import gpu_remote

STAMP = "2026-12-04T00:00:00+00:00"


def test_a_running_jobs_samples_count_processes_outside_mado_while_there_are_some(smi, sleeper):  # noqa: F811
    outsider, ours = sleeper(), sleeper(MMT_JOB_ID="42")
    write_state(smi, [gpu(0), gpu(1), gpu(2)], [{"gpu": 0, "pid": ours.pid}])
    connection = local(smi)

    def sample():
        return gpu_remote.sample_once(connection, "/usr/bin/python3")

    points, before = gpu_remote.outside_points(sample(), ["0", "1"], set(), 1, STAMP)
    assert (points, before) == ([], set()), "the job's own process (MMT_JOB_ID) is no outsider: nothing to say"

    write_state(smi, [gpu(0), gpu(1), gpu(2)], [{"gpu": 0, "pid": ours.pid}, {"gpu": 1, "pid": outsider.pid},
                                               {"gpu": 1, "pid": outsider.pid + 100000},
                                               {"gpu": 2, "pid": outsider.pid}])
    points, before = gpu_remote.outside_points(sample(), ["0", "1"], before, 2, STAMP, prefix="system/sub1/")
    assert [(p["name"], p["value"], p["step"]) for p in points] == [("system/sub1/gpu/1/outside_processes", 2.0, 2)]
    assert before == {"1"}, "GPU 2 is not the job's"

    write_state(smi, [gpu(0), gpu(1), gpu(2)], [])
    points, before = gpu_remote.outside_points(sample(), ["0", "1"], before, 3, STAMP)
    assert [(p["name"], p["value"]) for p in points] == [("system/gpu/1/outside_processes", 0.0)], "one 0 once gone"
    assert gpu_remote.outside_points(sample(), ["0", "1"], before, 4, STAMP) == ([], set()), "then nothing"

    write_state(smi, [])  # nvidia-smi fails: nothing read is not "none outside"
    failed = sample()
    assert failed.error and gpu_remote.outside_points(failed, ["1"], {"1"}, 5, STAMP) == ([], {"1"})


def test_a_replicas_metrics_are_named_after_it():
    assert gpu_remote.replica_prefix(None) == "system/" and gpu_remote.replica_prefix("sub2") == "system/sub2/"
    sample = gpu_remote.parse_line('{"gpus": "0, GPU-a, 10, 20, 80, 30, 40\\n", "apps": ""}')
    names = [p["name"] for p in gpu_remote.metric_points(sample, ["0"], 1, STAMP, prefix="system/main1/")]
    assert names == [f"system/main1/gpu/0/{n}" for n in ("utilization", "memory", "temperature", "power")]
    group = gpu_remote.Group(time=10.0, ticks=200, hz=100, rss=5, processes=1)
    before = gpu_remote.Group(time=9.0, ticks=100, hz=100, rss=5, processes=1)
    assert {p["name"] for p in gpu_remote.host_points(group, before, 1, STAMP, prefix="system/sub1/")} == {
        "system/sub1/memory/rss_bytes", "system/sub1/cpu/utilization"}


def test_a_waiting_reason_names_the_replica_and_always_fits_the_heartbeat(smi, sleeper):  # noqa: F811
    outsider = sleeper()
    write_state(smi, [gpu(0)], [{"gpu": 0, "pid": outsider.pid}])
    foreign = gpu_remote.sample_once(local(smi), "/usr/bin/python3").foreign(["0"])
    user = getpass.getuser()
    assert gpu_remote.busy_reason(foreign, replica="sub1", computer="node b") == \
        f"GPU 0 of sub1 on node b is in use by a process outside Mado (pid {outsider.pid}, user {user})"

    many = gpu_remote.busy_reason(foreign * 40)
    assert len(many) <= gpu_remote.MAX_REASON and many.endswith(" more")
    shown = many.count("is in use by")
    assert many.endswith(f"; and {40 - shown} more") and shown >= 4, "whole sentences, and how many are left out"
    assert gpu_remote.join_reason(["x" * 600]) == "x" * gpu_remote.MAX_REASON
    assert gpu_remote.busy_reason(foreign * 2) == "; ".join(gpu_remote.busy_clauses(foreign) * 2), "short: all of it"
