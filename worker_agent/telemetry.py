"""GPU telemetry of running jobs: utilisation and memory of each job's reserved GPUs, every 10 s
(MMT_WORKER_TELEMETRY_SECONDS), sent as job metrics `system/gpu/<id>/utilization` (percent) and
`system/gpu/<id>/memory` (MiB used).

NVML (`nvidia-ml-py`, the `telemetry` extra) reads the GPUs of the machine the worker runs on, so it
serves jobs whose computer is that machine: Local computers and SSH computers at a loopback address.
When NVML cannot be imported or initialised, the worker says so once in its log, with the reason; it
never guesses values. Every other job (an SSH computer elsewhere, or this machine without NVML) is
sampled with nvidia-smi on its computer over the worker's connection: worker_agent.gpu_remote, which
adds `system/gpu/<id>/temperature` (°C) and `system/gpu/<id>/power` (W). The same probe reports every
job's process tree (`system/cpu/utilization`, % of one core; `system/memory/rss_bytes`), GPUs or not."""
from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("mado.worker.telemetry")

INTERVAL_SETTING = "MMT_WORKER_TELEMETRY_SECONDS"
INTERVAL_DEFAULT = 10.0


def interval_seconds(environ=os.environ) -> float:
    """MMT_WORKER_TELEMETRY_SECONDS: seconds between two samples of a running job (10 by default). It
    exists so that tests which wait for a second sample need not wait 20 s. ValueError says what is wrong:
    the worker's configuration refuses a bad value at start (worker_agent.config)."""
    text = str(environ.get(INTERVAL_SETTING, "")).strip()
    if not text:
        return INTERVAL_DEFAULT
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0.5 <= value <= 3600:
        raise ValueError(f"{INTERVAL_SETTING} is the seconds between two samples of a running job's GPUs, CPU "
                         f"and memory, from 0.5 to 3600 (got {text!r}).")
    return value


try:
    INTERVAL_SECONDS = interval_seconds()  # read once, when the worker starts
except ValueError:
    INTERVAL_SECONDS = INTERVAL_DEFAULT  # refused by the configuration before any job is sampled
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def same_machine(computer: dict) -> bool:
    if computer.get("kind") == "local":
        return True
    host = str(computer.get("host") or "").strip().lower()
    return host in LOOPBACK or host.startswith("127.")


class GpuTelemetry:
    """Samples GPUs by id through NVML. `sample(ids)` → {id: (utilization %, memory MiB)}; ids NVML
    does not know are left out."""

    def __init__(self):
        self._lock = threading.Lock()
        self._nvml = None
        self._reason: str | None = None
        self._said = False
        self._tried = False

    def _init(self) -> None:
        self._tried = True
        try:
            import pynvml
        except ImportError:
            self._reason = ("nvidia-ml-py is not installed (install mado-tracking[telemetry] on the worker to report "
                            "GPU utilisation)")
            return
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, …: no usable GPU here
            self._reason = f"NVML could not start ({type(exc).__name__}: {exc}); no NVIDIA driver on this machine?"
            return
        self._nvml = pynvml

    @property
    def available(self) -> bool:
        with self._lock:
            if not self._tried:
                self._init()
            if self._nvml is None and not self._said:
                self._said = True
                log.info("GPU telemetry off: %s. Jobs run as usual; their GPUs are read with nvidia-smi on their "
                         "computers instead, where it works.",
                         self._reason)
            return self._nvml is not None

    def sample(self, gpu_ids: list[str]) -> dict[str, tuple[float, float]]:
        if not self.available:
            return {}
        nvml = self._nvml
        values: dict[str, tuple[float, float]] = {}
        with self._lock:
            for gpu in gpu_ids:
                try:
                    handle = nvml.nvmlDeviceGetHandleByIndex(int(gpu))
                    rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                except Exception as exc:  # an id NVML does not know, a GPU that fell off the bus
                    log.debug("GPU %s not sampled: %s", gpu, exc)
                    continue
                values[str(gpu)] = (float(rates.gpu), float(memory.used) / 2**20)
        return values


def _text(value) -> str:
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


def sample_all(telemetry: GpuTelemetry):
    """Every GPU of this machine with the processes on it, as a gpu_remote.Sample (the GPU watch of a Local
    computer, worker_agent.gpu_watch); None when NVML is not available. A process's user and Mado job come
    from /proc here (gpu_remote.local_owner), as the probe finds them on a computer over SSH."""
    from worker_agent import gpu_remote

    if not telemetry.available:
        return None
    nvml = telemetry._nvml
    sample = gpu_remote.Sample()
    with telemetry._lock:
        try:
            count = nvml.nvmlDeviceGetCount()
        except Exception as exc:  # the driver went away since NVML started
            return gpu_remote.Sample(error=f"NVML could not count the GPUs ({type(exc).__name__}: {exc})")
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except Exception as exc:  # a GPU that fell off the bus: the others are still read
                log.debug("GPU %s not read: %s", index, exc)
                continue
            sample.gpus.append(gpu_remote.Gpu(str(index), uuid, float(rates.gpu), float(memory.used) / 2**20,
                                              float(memory.total) / 2**20, None, None))
            for process in processes:
                user, job = gpu_remote.local_owner(process.pid)
                used = getattr(process, "usedGpuMemory", None)
                sample.processes.append(gpu_remote.Process(uuid, int(process.pid),
                                                           float(used) / 2**20 if isinstance(used, int) else None,
                                                           user, job))
    return sample


def metric_points(values: dict[str, tuple[float, float]], step: int, timestamp: str, *,
                  prefix: str = "system/") -> list[dict]:
    """`prefix`: `system/<replica>/` for a cluster job's replica (gpu_remote.replica_prefix)."""
    points = []
    for gpu, (utilization, memory_mib) in sorted(values.items()):
        points.append({"name": f"{prefix}gpu/{gpu}/utilization", "value": utilization, "step": step,
                       "timestamp": timestamp})
        points.append({"name": f"{prefix}gpu/{gpu}/memory", "value": round(memory_mib, 1), "step": step,
                       "timestamp": timestamp})
    return points
