"""One short check against a real NVIDIA GPU (issue 22 "Done when": run the telemetry and busy checks once
against the real nvidia-smi): not a pytest test, run by hand on a GPU machine with
`python3 tests/gpu/device_check.py` from the repository root. Standard library only (plus torch, when
installed, to put a real process on GPU 0). Prints what the probe read."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.getcwd())
from worker_agent import gpu_remote  # noqa: E402

GPU_LOAD = ("import torch, time\nx = torch.randn(8192, 8192, device='cuda')\nprint('ready', flush=True)\n"
            "end = time.time() + 40\nwhile time.time() < end:\n    x = x @ x; x = x / x.norm()\n"
            "torch.cuda.synchronize()\n")
CPU_LOAD = ("import time\nheld = bytearray(256 * 2**20)\nfor i in range(0, len(held), 4096):\n    held[i] = 1\n"
            "print('ready', flush=True)\nend = time.time() + 40\nwhile time.time() < end:\n    pass\n")


def probe_argv(interval: float, **options) -> list[str]:
    """The GPU probe run straight from the package (the worker ships the same file by its hash)."""
    return [sys.executable, "-I", gpu_remote.PROBE_PATH, *gpu_remote.probe_args(interval, **options)]


def main() -> None:
    print(subprocess.run("nvidia-smi -L", shell=True, capture_output=True, text=True).stdout.strip())
    if importlib.util.find_spec("torch") is not None:
        load = GPU_LOAD
    else:
        print("torch not installed: the job's process group burns CPU only; no process on a GPU")
        load = CPU_LOAD
    job = subprocess.Popen([sys.executable, "-c", load], stdout=subprocess.PIPE, start_new_session=True)
    try:
        print("job:", job.stdout.readline().decode().strip(), "pid", job.pid)
        once = subprocess.run(probe_argv(0), capture_output=True, timeout=120)
        sample = gpu_remote.parse_line(once.stdout.strip().splitlines()[-1])
        print("busy check: error", sample.error, "gpus", [(g.index, g.utilization, g.memory_used) for g in sample.gpus])
        print("processes", [(p.pid, p.user, p.job_id, p.used_memory) for p in sample.processes])
        foreign = sample.foreign([g.index for g in sample.gpus])
        print("reason:", gpu_remote.busy_reason(foreign) or "(no process outside Mado)")
        with tempfile.TemporaryDirectory() as tmp:
            state = os.path.join(tmp, "state.json")
            with open(state, "w") as f:
                json.dump({"pgid": job.pid, "pid": job.pid}, f)
            probe = subprocess.Popen(probe_argv(2, gpus=True, state_path=state), stdout=subprocess.PIPE)
            before, started = None, time.perf_counter()
            for step in range(4):
                line = probe.stdout.readline()
                s = gpu_remote.parse_line(line)
                points = gpu_remote.metric_points(s, [g.index for g in s.gpus], step, "t") + \
                    gpu_remote.host_points(s.group, before, step, "t")
                before = s.group or before
                print(f"sample {step} ({len(line)} bytes, error {s.error}):",
                      {p["name"]: p["value"] for p in points})
            probe.kill()
            print(f"4 samples in {time.perf_counter() - started:.1f} s from one probe pid {probe.pid}")
        watch(sample)
    finally:
        job.kill()
        job.wait()


def watch(sample) -> None:
    """The GPU watch (worker_agent.gpu_watch) with the job's process still on GPU 0: what the worker would
    post to worker/computers/{id}/gpus, read through the long-lived probe and through NVML."""
    ids = [g.index for g in sample.gpus] + ["99"]  # 99: registered, but not on this machine
    probe = subprocess.Popen(probe_argv(1), stdout=subprocess.PIPE)
    try:
        for step in range(2):
            line = probe.stdout.readline()
            print(f"watch probe {step}:", json.dumps(gpu_remote.watch_readings(gpu_remote.parse_line(line), ids)))
    finally:
        probe.kill()
    from worker_agent.telemetry import GpuTelemetry, sample_all

    nvml = sample_all(GpuTelemetry())
    print("watch NVML:", json.dumps(gpu_remote.watch_readings(nvml, ids)) if nvml else "NVML not available")


if __name__ == "__main__":
    main()
