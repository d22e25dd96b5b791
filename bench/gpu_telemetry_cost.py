"""The worker's cost of GPU telemetry from an SSH target (issue 22): 8 GPUs sampled every 10 s.

A real sshd on loopback (tests/peers/sshd.py; run as root, as the tests do) and the stand-in nvidia-smi
(tests/gpu/stand_in.py) reporting 8 GPUs with 8 processes. The worker side is measured as the worker
runs it: worker_agent.gpu_remote's probe as one long-lived command over a paramiko connection, each line
parsed and turned into the metric points of a job holding all 8 GPUs, and the JSON body of the metrics
POST built. To measure many samples in little time the probe prints every `--interval` (default 0.05 s)
instead of 10 s; the worker's CPU per sample does not depend on the pause between samples, so
CPU per hour = CPU per sample × 360.

Baseline: one exec of the probe per sample (`Connection.run`, a new SSH channel and process each time),
what the long-lived command avoids.

Prints `name: value unit` lines; asserts nothing."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.gpu.stand_in import gpu, install  # noqa: E402
from tests.peers.sshd import start_sshd  # noqa: E402
from worker_agent import gpu_remote  # noqa: E402
from worker_agent.ssh import ConnectionPool, Target  # noqa: E402

GPUS = 8
SAMPLES_PER_HOUR = 3600 // 10


def cpu() -> float:
    times = os.times()
    return times.user + times.system  # this process, all threads (paramiko's transport thread included)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--execs", type=int, default=50, help="samples of the one-exec-per-sample baseline")
    args = parser.parse_args()

    sshd = start_sshd()
    directory = Path(tempfile.mkdtemp(prefix="mado-gpu-bench-", dir=sshd.home))
    try:
        uid, gid = os.stat(sshd.home).st_uid, os.stat(sshd.home).st_gid
        gpus = [gpu(i, utilization=10 * i, memory_used=1000 * i) for i in range(GPUS)]
        apps = [{"gpu": i, "pid": 100000 + i, "used_memory": 1000 * i} for i in range(GPUS)]
        python = install(directory, gpus, apps, owner=(uid, gid))
        target = Target.from_api(sshd.connection())
        pool = ConnectionPool()
        connection = pool.get(target)
        gpu_ids = [str(i) for i in range(GPUS)]

        # The long-lived command, as JobManager.sample_remote runs it.
        line_bytes = post_bytes = 0
        count = 0
        started_cpu, started = cpu(), time.monotonic()
        with gpu_remote.probe_stream(connection, str(python), args.interval, timeout=60) as stream:
            for line in gpu_remote.read_lines(stream, lambda: count >= args.samples):
                sample = gpu_remote.parse_line(line)
                assert sample.error is None and len(sample.gpus) == GPUS, sample.error
                points = gpu_remote.metric_points(sample, gpu_ids, count + 1, "2026-12-04T00:00:00+00:00")
                body = json.dumps({"lease_id": "00000000-0000-0000-0000-000000000000", "worker_id": "w",
                                   "metrics": points}).encode()
                line_bytes += len(line) + 1
                post_bytes += len(body)
                count += 1
        stream_cpu = cpu() - started_cpu
        stream_wall = time.monotonic() - started
        per_sample = stream_cpu / count

        # Baseline: one exec per sample.
        started_cpu = cpu()
        for _ in range(args.execs):
            sample = gpu_remote.sample_once(connection, str(python))
            assert sample.error is None
        exec_per_sample = (cpu() - started_cpu) / args.execs
        pool.close_all()

        print(f"gpus: {GPUS} (8 processes on them)")
        print(f"samples: {count} in {stream_wall:.1f} s (probe interval {args.interval} s)")
        print(f"worker cpu per sample, long-lived command: {per_sample * 1000:.2f} ms")
        print(f"worker cpu per hour at one sample per 10 s: {per_sample * SAMPLES_PER_HOUR:.2f} s")
        print(f"bytes per sample over SSH (probe line): {line_bytes / count:.0f} B")
        print(f"bytes per sample to the server (metrics POST body, {len(points)} points): {post_bytes / count:.0f} B")
        print(f"baseline worker cpu per sample, one exec per sample: {exec_per_sample * 1000:.2f} ms")
        print(f"baseline worker cpu per hour, one exec per sample: {exec_per_sample * SAMPLES_PER_HOUR:.2f} s")
    finally:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)
        sshd.stop()


if __name__ == "__main__":
    main()
