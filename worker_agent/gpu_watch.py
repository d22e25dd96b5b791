"""The GPU watch (issue 22, docs/gpus.md "The GPU watch"): the worker reads the GPUs of every computer it
serves that has registered GPUs, whether or not a Mado job holds them, and sends each reading to the
server (`worker/computers/{id}/gpus`) for the GPU board: utilisation and memory now, and the processes on
each GPU that belong to no Mado job. Seed 002: reservations hold only between this app's jobs; they do not
stop people using a GPU over SSH, and without this a GPU no job holds would always look free.

Which computers: the server lists them in its answer to every hello (`gpu_watch`, because the worker says
the capability `gpu_watch`): the SSH and Local computers it serves within MMT_WORKER_TARGET_IDS, enabled,
with registered GPUs, each with its connection fields. A computer added, changed or dropped there is
followed within a hello interval.

How: one thread per computer. Over SSH (and on a Local computer without NVML) it runs the job telemetry's
probe (gpu_remote.PROBE) without a job, as **one long-lived command per computer** printing a line every
MMT_WORKER_GPU_WATCH_SECONDS over the connection the worker already holds (ConnectionPool), as the jobs'
probes do: no new SSH channel, Python start or login per reading; the probe already prints whole-computer
readings and, per process, the owner and MMT_JOB_ID that tell Mado's processes from the others
(gpu_remote.Sample.foreign), and it ends by itself at its next line once the channel is closed. A Local
computer with NVML is read here (telemetry.sample_all). A computer whose nvidia-smi is missing or fails,
or that cannot be reached, sends nothing: one line in the log when it starts failing (and one when it works
again), then tried again with a growing pause (up to 10 minutes), silently."""
from __future__ import annotations

import logging
import threading

from worker_agent import gpu_remote
from worker_agent.api import ApiClient, ApiError, FatalApiError
from worker_agent.ssh import CommandTimeout, ConnectError, ConnectionPool, Target
from worker_agent.telemetry import GpuTelemetry, sample_all

log = logging.getLogger("mado.worker.gpu_watch")

CAPABILITY = "gpu_watch"
MAX_PAUSE = 600.0
TRANSIENT = (ConnectError, CommandTimeout, ConnectionError, OSError, EOFError)


class GpuWatch:
    """The watch of one worker: `update(computers)` with the hello's list starts, restarts (changed
    connection fields, Python or GPUs) and stops one ComputerWatch per computer."""

    def __init__(self, *, interval: float, worker_id: str, api: ApiClient, pool: ConnectionPool,
                 stop_event: threading.Event, telemetry: GpuTelemetry | None = None, on_fatal=None):
        self.interval = float(interval)
        self.worker_id = worker_id
        self.api = api
        self.pool = pool
        self.stop_event = stop_event
        self.telemetry = telemetry or GpuTelemetry()
        self.on_fatal = on_fatal or (lambda exc: stop_event.set())
        self.watches: dict[int, ComputerWatch] = {}
        self._lock = threading.Lock()
        self._said_local = False

    def update(self, computers) -> None:
        """`computers`: the hello answer's `gpu_watch`; None (a server without the watch) changes nothing."""
        if not isinstance(computers, list) or self.stop_event.is_set():
            return
        wanted: dict[int, dict] = {}
        for computer in computers:
            if not isinstance(computer, dict) or not isinstance(computer.get("id"), int) or not computer.get("gpu_ids"):
                continue
            if computer.get("kind") == "local" and not self.pool.allow_local:
                if not self._said_local:
                    self._said_local = True
                    log.info("GPU watch: Local computer %s is not read (Local computers are off on this worker)",
                             computer.get("name"))
                continue
            wanted[computer["id"]] = computer
        with self._lock:
            for computer_id, watch in list(self.watches.items()):
                if watch.computer != wanted.get(computer_id):
                    watch.stop.set()
                    del self.watches[computer_id]
            for computer_id, computer in wanted.items():
                if computer_id not in self.watches:
                    watch = ComputerWatch(self, computer)
                    self.watches[computer_id] = watch
                    watch.thread.start()

    def stop_all(self) -> None:
        with self._lock:
            for watch in self.watches.values():
                watch.stop.set()
            self.watches.clear()


class ComputerWatch:
    def __init__(self, owner: GpuWatch, computer: dict):
        self.owner = owner
        self.computer = computer
        self.name = str(computer.get("name") or computer["id"])
        self.gpu_ids = [str(g) for g in computer.get("gpu_ids") or []]
        self.stop = threading.Event()
        self.failing: str | None = None
        self.failures = 0  # in a row, for the pause before the next try
        self.thread = threading.Thread(target=self.run, name=f"gpu-watch-{computer['id']}", daemon=True)

    def stopped(self) -> bool:
        return self.stop.is_set() or self.owner.stop_event.is_set()

    def run(self) -> None:
        try:
            while not self.stopped():
                try:
                    error = self.watch()
                except TRANSIENT as exc:
                    error = f"the connection failed ({exc})"
                if self.stopped():
                    break
                self.failures += 1
                self.failed(error or "the GPU probe ended")
                self.stop.wait(min(MAX_PAUSE, max(self.owner.interval, 5.0) * 2 ** min(self.failures, 6)))
        finally:
            self.owner.api.close()  # this thread's HTTP session

    def watch(self) -> str | None:
        """Read and send until stopped; returns why it stopped reading otherwise."""
        telemetry = self.owner.telemetry
        if self.computer.get("kind") == "local" and telemetry.available:
            while not self.stopped():
                sample = sample_all(telemetry)
                if sample is None or sample.error:
                    return sample.error if sample is not None else "NVML is not available"
                self.send(sample)
                self.stop.wait(self.owner.interval)
            return None
        interval = self.owner.interval
        python = str(self.computer.get("python_path") or "python3")
        connection = self.owner.pool.get(Target.from_api(self.computer))
        # StreamStalled (a ConnectionError) when no line came for three intervals and a minute.
        with gpu_remote.probe_stream(connection, python, interval, timeout=3 * interval + 60) as stream:
            for line in gpu_remote.read_lines(stream, self.stopped):
                sample = gpu_remote.parse_line(line)
                if sample.error:
                    return sample.error  # the probe exits after such a line: nvidia-smi does not heal by itself
                self.send(sample)
        return None

    def send(self, sample: gpu_remote.Sample) -> None:
        if self.failing is not None:
            log.info("GPU watch of %s: reading its GPUs again", self.name)
            self.failing = None
        self.failures = 0
        gpus = gpu_remote.watch_readings(sample, self.gpu_ids)
        if not gpus:
            return
        try:
            self.owner.api.gpu_readings(self.computer["id"], self.owner.worker_id, gpus)
        except FatalApiError as exc:
            self.owner.on_fatal(exc)
        except ApiError as exc:  # a computer no longer served (the next hello drops it), the server away
            log.debug("GPU watch of %s: reading not delivered: %s", self.name, exc)

    def failed(self, error: str) -> None:
        """Said once when the watch starts failing, not at every retry."""
        if self.failing is None:
            log.warning("GPU watch of %s: no readings (%s); the GPU board shows none for it until this works. "
                        "Tried again now and then.", self.name, error[:300])
        self.failing = error
