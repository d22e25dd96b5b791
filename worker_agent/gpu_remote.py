"""GPUs of a computer the worker reaches over SSH (or runs on without NVML): `nvidia-smi` on the target.

One small Python program (`PROBE`, worker_agent/gpu_probe.py, run with the computer's Python) prints one JSON line per sample:
the raw CSV of `nvidia-smi --query-gpu=…` and `--query-compute-apps=…`, and for each process on a GPU
its owner and, when its environment can be read, the Mado job it belongs to (`MMT_JOB_ID`). It runs
two ways over the connection the worker already holds:

- telemetry: one long-lived command per running job (`Connection.stream`), a line every 10 s, never
  one exec per sample; the worker parses the CSV and posts the job's `system/gpu/<id>/…` metrics;
- the busy check before a job starts: the same program once (`Connection.run`), to see processes
  outside Mado on the job's reserved GPUs (seed 002: reservations only hold between this app's Jobs).

nvidia-smi that is missing, or that finds no GPU ("No devices were found", exit 6; no driver, exit 9),
is reported once as the reason; nothing is guessed. The CSV parsing lives here, on the worker, so the
program on the target stays small and the same for every nvidia-smi version."""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from worker_agent.core import ship

log = logging.getLogger("mado.worker.telemetry")

QUERY_GPU = "index,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw"
QUERY_APPS = "gpu_uuid,pid,used_memory"
FORMAT = "--format=csv,noheader,nounits"
BUSY_WAIT_SETTING = "MMT_WORKER_GPU_BUSY_WAIT"
BUSY_WAIT_DEFAULT = 600.0
BUSY_RECHECK_SECONDS = 5.0
SYSTEM = "system/"
MAX_REASON = 450  # the heartbeat's `waiting` and the release's `reason` (jobs.services) take this many characters

# The probe program (worker_agent/gpu_probe.py), run on targets by its hash.
PROBE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_probe.py")
PROBE = ship.Program.of_file(PROBE_PATH)


def probe_args(interval: float, *, gpus: bool = True, state_path: str = "") -> list[str]:
    """`state_path`: the job's state.json on the target, to sample its process group's CPU and memory
    too; `gpus=False` leaves nvidia-smi alone (a job without GPUs, or GPUs NVML reads on this machine)."""
    args = [f"{interval:g}", QUERY_GPU, QUERY_APPS, FORMAT]
    if state_path:  # "-": the path comes on stdin, so no job path is on the probe's command line
        args += ["gpus" if gpus else "nogpus", state_path]
    return args


def probe_stream(connection, python: str, interval: float, *, gpus: bool = True, state_path: str = "",
                 stdin: bytes = b"", timeout: float = 15.0):
    """The long-lived probe over `connection` (`read(n)`, `close()`, a context manager)."""
    return ship.stream(connection, python, PROBE, probe_args(interval, gpus=gpus, state_path=state_path),
                       stdin=stdin, timeout=timeout)


@dataclass
class Gpu:
    index: str
    uuid: str
    utilization: float | None
    memory_used: float | None
    memory_total: float | None
    temperature: float | None
    power: float | None


@dataclass
class Process:
    gpu_uuid: str
    pid: int
    used_memory: float | None
    user: str | None
    job_id: str | None  # MMT_JOB_ID in its environment: a process of a Mado job


@dataclass
class Group:
    """The job's process group on the target at one moment: CPU time so far (clock ticks of its live
    processes), resident memory (bytes) and how many processes."""

    time: float
    ticks: int
    hz: int
    rss: int
    processes: int


@dataclass
class Sample:
    gpus: list[Gpu] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list)
    error: str | None = None
    size: int = 0  # bytes of the line that carried it
    group: Group | None = None

    def gpu(self, gpu_id: str) -> Gpu | None:
        """A registered GPU ID is nvidia-smi's index, or a UUID (`GPU-…`)."""
        gpu_id = str(gpu_id).strip()
        return next((g for g in self.gpus if gpu_id in (g.index, g.uuid)), None)

    def foreign(self, gpu_ids: list[str]) -> list[tuple[str, Process]]:
        """(GPU ID, process) for processes on `gpu_ids` that belong to no Mado job."""
        found = []
        for gpu_id in gpu_ids:
            gpu = self.gpu(gpu_id)
            if gpu is None:
                continue
            found += [(str(gpu_id), p) for p in self.processes if p.gpu_uuid == gpu.uuid and not p.job_id]
        return found


def _number(text: str) -> float | None:
    """nvidia-smi prints `[N/A]` or `[Not Supported]` (with nounits) for what a GPU cannot measure."""
    try:
        return float(text)
    except ValueError:
        return None


def parse_line(line: bytes | str) -> Sample:
    size = len(line)
    try:
        data = json.loads(line)
    except ValueError:
        return Sample(error=f"The GPU probe printed something unexpected: {str(line)[:200]!r}", size=size)
    sample = Sample(size=size, group=_group(data))
    if data.get("error"):
        sample.error = str(data["error"])
        return sample
    for row in (data.get("gpus") or "").splitlines():
        cells = [c.strip() for c in row.split(",")]
        if len(cells) < 7:
            continue
        sample.gpus.append(Gpu(cells[0], cells[1], *(_number(c) for c in cells[2:7])))
    owners = data.get("owners") or {}
    for row in (data.get("apps") or "").splitlines():
        cells = [c.strip() for c in row.split(",")]
        if len(cells) < 3 or not cells[1].isdigit():
            continue  # e.g. "No running processes found" from some versions
        user, job = (owners.get(cells[1]) or [None, None])[:2]
        sample.processes.append(Process(cells[0], int(cells[1]), _number(cells[2]), user, job))
    return sample


def _group(data: dict) -> Group | None:
    group = data.get("group")
    if not isinstance(group, dict):
        return None
    try:
        return Group(float(data.get("time") or 0), int(group["ticks"]), int(group["hz"]) or 100, int(group["rss"]),
                     int(group["processes"]))
    except (KeyError, TypeError, ValueError):
        return None


def host_points(group: Group | None, before: Group | None, step: int, timestamp: str, *,
                prefix: str = SYSTEM) -> list[dict]:
    """The job's process tree on its computer: `system/cpu/utilization` in percent of one core (as top
    shows a process: 250 is two and a half cores busy), from the CPU time between two samples, and
    `system/memory/rss_bytes`, resident memory summed over its processes (shared pages count once per
    process). The first sample has no CPU figure; CPU time of processes that ended in between is lost,
    so a drop is shown as 0, not negative. `prefix`: see replica_prefix."""
    if group is None or group.processes == 0:
        return []
    points = [{"name": f"{prefix}memory/rss_bytes", "value": float(group.rss), "step": step, "timestamp": timestamp}]
    if before is not None and group.time > before.time:
        busy = max(0, group.ticks - before.ticks) / group.hz
        points.append({"name": f"{prefix}cpu/utilization", "value": round(100.0 * busy / (group.time - before.time), 1),
                       "step": step, "timestamp": timestamp})
    return points


def replica_prefix(replica: str | None) -> str:
    """Where a job's system metrics are named: `system/…` for an ordinary job, `system/<replica>/…` for
    each replica of a cluster job (main1 too), as MLflow names a node's system metrics
    (`system/<node_id>/…`): the replicas' GPU IDs repeat from computer to computer."""
    return f"{SYSTEM}{replica}/" if replica else SYSTEM


def metric_points(sample: Sample, gpu_ids: list[str], step: int, timestamp: str, *, prefix: str = SYSTEM) -> list[dict]:
    """The job's GPUs as metrics: utilization (%), memory (MiB used, as NVML's path names it),
    temperature (°C), power (W); what a GPU cannot measure is left out."""
    points = []
    for gpu_id in gpu_ids:
        gpu = sample.gpu(gpu_id)
        if gpu is None:
            continue
        for name, value in (("utilization", gpu.utilization), ("memory", gpu.memory_used),
                            ("temperature", gpu.temperature), ("power", gpu.power)):
            if value is not None:
                points.append({"name": f"{prefix}gpu/{gpu_id}/{name}", "value": value, "step": step,
                               "timestamp": timestamp})
    return points


def outside_points(sample: Sample, gpu_ids: list[str], before: set[str], step: int, timestamp: str, *,
                   prefix: str = SYSTEM) -> tuple[list[dict], set[str]]:
    """`<prefix>gpu/<id>/outside_processes`: how many processes outside Mado share a running job's GPU
    (someone over SSH, another scheduler: reservations hold only between Mado's jobs). Sent only while
    there are some, and one 0 in the first sample after (`before`: the GPUs that had some last time), so
    a job that never shared its GPUs has no such chart; the GPU board shows the GPU as busy outside the
    app while the latest point is above 0 and recent. Returns the points and the GPUs that have some now."""
    if sample.error:  # nothing was read: say nothing rather than "none"
        return [], before
    counts: dict[str, int] = {}
    for gpu_id, _process in sample.foreign(gpu_ids):
        counts[gpu_id] = counts.get(gpu_id, 0) + 1
    names = [g for g in gpu_ids if counts.get(g) or g in before]
    points = [{"name": f"{prefix}gpu/{g}/outside_processes", "value": float(counts.get(g, 0)), "step": step,
               "timestamp": timestamp} for g in names]
    return points, set(counts)


# The server's limits on a GPU watch body (computers.services.record_gpu_readings).
WATCH_MAX_GPUS = 64
WATCH_MAX_OUTSIDE = 32
WATCH_MAX_USER = 64


def watch_readings(sample: Sample, gpu_ids: list[str]) -> list[dict]:
    """The body of worker/computers/{id}/gpus from one sample of the whole computer (worker_agent.gpu_watch):
    each registered GPU the sample found, with its utilisation and memory now and the processes on it that
    belong to no Mado job (`Sample.foreign`: no MMT_JOB_ID in an environment the login user can read), as
    many as the server takes. Values nvidia-smi could not give are null."""
    body = []
    for gpu_id in [str(g) for g in gpu_ids][:WATCH_MAX_GPUS]:
        gpu = sample.gpu(gpu_id)
        if gpu is None:
            continue
        outside = [{"pid": process.pid, "user": _user_text(process.user)}
                   for _, process in sample.foreign([gpu_id]) if 0 < process.pid < 2**31][:WATCH_MAX_OUTSIDE]
        body.append({"id": gpu_id, "utilization": _within(gpu.utilization, 100.0),
                     "memory_used_mib": _within(gpu.memory_used, float(2**40)),
                     "memory_total_mib": _within(gpu.memory_total, float(2**40)), "outside": outside})
    return body


def _within(value: float | None, high: float) -> float | None:
    return value if value is not None and 0 <= value <= high else None


def _user_text(user: str | None) -> str:
    text = "".join(ch for ch in str(user or "") if ch.isprintable())[:WATCH_MAX_USER]
    return text or "unknown"


def local_owner(pid: int) -> tuple[str | None, str | None]:
    """The probe's `owner` for a process of this machine (NVML gives pids only): its user, and its Mado job
    (MMT_JOB_ID in its environment, when this user may read it)."""
    try:
        uid = os.stat(f"/proc/{int(pid)}").st_uid
    except (OSError, ValueError):
        return None, None
    try:
        import pwd

        user = pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        user = str(uid)
    job = None
    try:
        with open(f"/proc/{int(pid)}/environ", "rb") as f:
            for entry in f.read().split(b"\0"):
                if entry.startswith(b"MMT_JOB_ID="):
                    job = entry[11:].decode("ascii", "replace")
    except OSError:
        pass
    return user, job


def sample_once(connection, python: str, timeout: float = 90.0) -> Sample:
    """One sample over `connection` (`run`): for the busy check before a start."""
    result = ship.run(connection, python, PROBE, probe_args(0), timeout=timeout)
    line = (result.stdout or b"").strip().splitlines()
    if result.exit_code != 0 or not line:
        said = (result.stderr or b"").decode("utf-8", "replace").strip()[-300:]
        return Sample(error=f"The GPU probe failed (exit {result.exit_code}): {said or 'no output'}")
    return parse_line(line[-1])


def read_lines(stream, stop) -> Iterator[bytes]:
    """Lines of a stream (`read(n)`) until it ends or `stop()` says so."""
    buffer = b""
    while not stop():
        data = stream.read(65536)
        if not data:
            return
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield line


def busy_clauses(foreign: list[tuple[str, Process]], *, replica: str | None = None, computer: str = "") -> list[str]:
    """One sentence per process: "GPU 1 is in use by a process outside Mado (pid 4242, user alice)"; for a
    cluster job's replica "GPU 1 of sub1 on node-b is in use by …". The GPU board reads the pid and the
    user back from the job's `waiting` line (jobs.gpu_board.OUTSIDE): keep the two in step."""
    where = f" of {replica} on {computer}" if replica else ""
    return [f"GPU {gpu_id}{where} is in use by a process outside Mado (pid {process.pid}, "
            f"user {process.user or 'unknown'})" for gpu_id, process in foreign]


def busy_reason(foreign: list[tuple[str, Process]], *, replica: str | None = None, computer: str = "") -> str:
    """The sentence the job waits with (in the worker's log; for the job page see docs/gpus.md)."""
    return join_reason(busy_clauses(foreign, replica=replica, computer=computer))


def join_reason(clauses: list[str], limit: int = MAX_REASON) -> str:
    """The clauses that fit in `limit` characters (the server refuses a longer `waiting`), whole ones only,
    and how many more there are."""
    kept: list[str] = []
    for number, clause in enumerate(clauses):
        rest = len(clauses) - number - 1
        tail = f"; and {rest} more" if rest else ""
        candidate = "; ".join([*kept, clause])
        if len(candidate + tail) > limit:
            return "; ".join(kept) + f"; and {len(clauses) - number} more" if kept else clause[:limit]
        kept.append(clause)
    return "; ".join(kept)


def busy_wait_for(computer: dict, fallback: float) -> tuple[float, str]:
    """How long a job waits for its GPUs, and where that came from (said with the reason when the claim
    goes back): the computer's setting, which the server sends in the claim (gpu_busy_wait_seconds);
    a server from before that field sends none, and the worker's MMT_WORKER_GPU_BUSY_WAIT decides."""
    value = computer.get("gpu_busy_wait_seconds")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        return float(value), "the computer's setting"
    return fallback, BUSY_WAIT_SETTING


def busy_wait_seconds(environ=os.environ) -> float:
    """MMT_WORKER_GPU_BUSY_WAIT: how long a job waits for its GPUs to be free of processes outside
    Mado before it gives the claim back; 0 turns the check off."""
    text = str(environ.get(BUSY_WAIT_SETTING, "")).strip()
    if not text:
        return BUSY_WAIT_DEFAULT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        log.warning("%s is seconds (0 turns the check off), not %r: waiting the default %.0f s; set a number such "
                    "as 600", BUSY_WAIT_SETTING, text, BUSY_WAIT_DEFAULT)
        return BUSY_WAIT_DEFAULT
    return value
