"""The GPU watch end to end (issue 22 item 2, docs/gpus.md "The GPU watch"): a real `mado-tracking-worker run`,
the real sshd target with the stand-in nvidia-smi (tests/gpu/stand_in.py) first on the PATH of the computer's
Python, and the live server. No job runs: a process outside Mado on GPU 1 shows on the GPU board as "Busy
outside the app" with its pid and user, GPU 0 as free with its readings; once the process has ended the board
shows GPU 1 free again. A computer whose nvidia-smi is missing sends nothing and is said once in the log."""
from __future__ import annotations

import getpass
import os
import subprocess
import uuid

import pytest
from django.test import Client
from django.urls import reverse

from computers.models import ComputeTarget, GpuReading
from tests.agent_e2e_jobs.conftest import TARGET_PYTHON, e2e, wait_until  # noqa: F401  (e2e: the fixture)
from tests.gpu.stand_in import gpu, install, write_state
from tests.gpu.test_gpu_board import row
from tests.peers.sshd import sshd  # noqa: F401  (the shared fixture e2e needs)

BUSY = "Busy outside the app"
PROBE_MARK = b"gpu_uuid,pid,used_memory"  # in the probe's command line (worker_agent.gpu_remote.QUERY_APPS)


@pytest.fixture
def outsider():
    """A real process, of no Mado job, that the stand-in lists on GPU 1."""
    process = subprocess.Popen(["sleep", "600"])
    yield process
    process.kill()
    process.wait()


def watch_probes(directory) -> list[int]:
    """PIDs of GPU watch probes (interval 1 s) on this machine, which is also the target, started by the
    stand-in's Python wrapper in `directory` (its PATH names it)."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read()
        except (OSError, ValueError):
            continue
        if PROBE_MARK in argv and b"1" in argv and str(directory).encode() in environ:
            found.append(int(name))
    return found


def test_a_gpu_no_job_holds_shows_a_process_outside_mado_until_it_ends(e2e, outsider):
    directory = e2e.working_dir / "nvidia"
    gpus = [gpu(0, utilization=12, memory_used=2048), gpu(1, utilization=81, memory_used=40000)]
    python = install(directory, gpus, [{"gpu": 1, "pid": outsider.pid, "used_memory": 2048}], owner=(e2e.uid, e2e.gid))
    e2e.computer.python_path = str(python)
    e2e.computer.save(update_fields=["python_path"])
    # Another computer on the same sshd whose Python finds no nvidia-smi: it sends nothing, said once.
    blind = ComputeTarget.objects.create(
        owner=e2e.world.global_admin, name=f"blind-{uuid.uuid4().hex[:6]}", kind="ssh", visibility="public",
        enabled=True, host=e2e.computer.host, port=e2e.computer.port, ssh_user=e2e.computer.ssh_user,
        ssh_key_path=e2e.computer.ssh_key_path, known_hosts_path=e2e.computer.known_hosts_path,
        working_dir=str(e2e.working_dir), python_path=TARGET_PYTHON, runtimes=["python"], gpu_ids=["0"],
        concurrency=1)
    earlier = set(watch_probes(directory))
    worker = e2e.start_worker(MMT_WORKER_GPU_WATCH_SECONDS=1)

    client = Client()
    client.force_login(e2e.world.member)
    name = e2e.computer.name

    def board() -> str:
        return client.get(reverse("gpu-board")).content.decode()

    seen = set()

    def busy_on_the_board():
        seen.update(set(watch_probes(directory)) - earlier)
        return BUSY in row(board(), name, "1")

    wait_until(busy_on_the_board, timeout=60, what=f"GPU 1 busy outside the app ({worker.output()[-2000:]})")
    page = board()
    busy = row(page, name, "1")
    assert "Free" in busy and f"pid {outsider.pid}, user {getpass.getuser()}" in busy, busy
    assert "81 %" in busy and "40000 / 81559 MiB" in busy
    free = row(page, name, "0")
    assert "Free" in free and BUSY not in free and "12 %" in free and "2048 / 81559 MiB" in free, free
    assert len(seen) == 1, f"one long-lived probe reads the computer, not one command per reading: {seen}"

    outsider.kill()
    write_state(directory, gpus, [])
    wait_until(lambda: BUSY not in row(board(), name, "1"), timeout=60,
               what=f"GPU 1 free again ({worker.output()[-2000:]})")
    again = row(board(), name, "1")
    assert "Free" in again and "81 %" in again, "still read: free, with its readings"
    assert set(watch_probes(directory)) - earlier <= seen, "the same probe went on reading"

    said = [line for line in worker.output().splitlines() if f"GPU watch of {blind.name}: no readings" in line]
    assert len(said) == 1 and "nvidia-smi" in said[0], said
    assert not GpuReading.objects.filter(target=blind).exists()
