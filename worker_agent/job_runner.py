"""One job on the worker: a `JobRunner` (or, for a cluster job, worker_agent.cluster_runner's
`ClusterRunner`) with the job-level concerns (`LeasedJob`) and its work on a computer (`JobTarget`).

A job, step by step (each step written to the journal, so a worker killed at any moment continues
where it was, and nothing runs twice):

1. `claimed`: the record (lease, job token) is journaled before anything touches the target. The
   supervisor is asked for the job's state: a job already started is re-attached, never started again;
   a job still to start gets the target's facts with that answer (one run on the target, not two).
2. start: `runtimes.build_spec` from those facts, the source fetched into `<job_dir>/source`,
   the input dataset versions put into the computer's cache (`dataset_transfer`), then `supervisor.Remote.start` (idempotent). A refused runtime, source or spec ends the job
   `failed` with end reason `start_failed`. Heartbeats go every 5 s on their own thread from the
   claim on (`status: running` once the supervisor runs the job); `cancel_requested` in an answer
   makes the supervisor stop the job (SIGTERM, SIGKILL after the grace).
3. logs: one follow stream per job (`Remote.follow`) from the journaled byte offsets. A reader thread
   takes frames off the stream; the runner posts them in order, in batches of up to 4 MiB or 0.2 s.
   Before a batch is posted its chunk boundaries are journaled, and only after the server accepted
   it the offsets move on: a worker restarted after a crash re-sends that batch cut at the very same
   offsets, which the server ignores as duplicates, so every byte arrives once and in order. A
   stream that breaks (SSH drop, network cut, stall past 15 s) is followed again from the offsets.
4. end: the supervisor's final state becomes the completion: exited 0 → outputs (result.json read and
   validated on the worker with `worker_agent.results`, then declared, artifacts uploaded — files of
   64 MiB or more in parts with Content-Range, progress logged) → `finished`; an invalid result →
   `failed`/`invalid_result` with the validator's message; exited ≠ 0 → `failed` with the exit code;
   timed_out → `failed`/`timed_out`; failed_to_start → `failed`/`start_failed`; canceled →
   `canceled`; a supervisor that vanished while the job's process may live is `unknown`: never
   started again, followed while the process lives, then `failed`/`worker_lost`.
5. completion: sent until the server answers; then the record is removed.

Any leased call answered 401/403/404/410, or 409 `invalid_lease`/`job_ended`/`job_already_completed`,
means the lease is gone: the worker stops touching that job and forgets it."""
from __future__ import annotations

import hashlib
import logging
import queue
import tempfile
import threading
import time
from collections import deque
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from worker_agent import dataset_transfer, gpu_remote, log_delivery
from worker_agent.api import ApiClient, ApiError, ApiUnavailable, FatalApiError
from worker_agent.config import WorkerConfig
from worker_agent.core.lifecycle import conclude, invalid_result, send_outputs, upload
from worker_agent.remote_files import RemoteFileError, RemoteRange, fetch_source, list_outputs, open_frames
from worker_agent.results import WORKER_LIMIT_SETTING, too_many_files
from worker_agent.runtimes import RuntimeRefused, TargetFacts, build_spec, facts_binary, facts_from, read_facts
from worker_agent.ssh import CommandTimeout, ConnectError, Target
from worker_agent.supervisor import LogChunk, Remote, StateFrame, SupervisorError, workspace
from worker_agent.text import mask_tokens

if TYPE_CHECKING:
    from worker_agent.jobs import JobManager


log = logging.getLogger("mado.worker.jobs")

HEARTBEAT_SECONDS = 5.0
LOG_BATCH_BYTES = 16 << 20  # per POST, merged into chunks of ≤ 4 MiB (log_delivery; JSON chunks stay ≤ 256 KiB)
LOG_FLUSH_SECONDS = 0.2
# Before a job runs, a target that cannot be reached for this long fails the job; once it runs, the
# worker keeps trying (the job is alive there and the network may come back).
CONNECT_BEFORE_START_SECONDS = 300.0
LEASE_GONE_409 = ("invalid_lease", "job_ended", "job_already_completed")
# The network and the target: worth another try after a pause.
TRANSIENT = (ConnectError, CommandTimeout, ConnectionError, OSError, EOFError)
SUPERVISOR_LOST = ("The job's supervisor on the target ended unexpectedly, so its exit code is unknown; the job was "
                   "not started again.")
CONFIG_CONNECT_CODES = ("ssh_configuration", "host_key_unknown", "host_key_changed", "local_executor_disabled")


class Stopping(Exception):
    """The worker is stopping: leave the job where it is (it keeps running on its target)."""


class LeaseRejected(Exception):
    """The server no longer gives this job to this worker."""


class GivenBack(Exception):
    """The job went back to the queue unstarted (worker/jobs/{id}/release): nothing of it is left here."""


class StartFailed(Exception):
    """The job cannot start; `reason` is its end reason (input_failed when an input dataset version
    could not be delivered, start_failed otherwise)."""

    def __init__(self, message: str, reason: str = "start_failed"):
        super().__init__(message)
        self.message = message
        self.reason = reason


def lease_gone(exc: ApiError) -> bool:
    return exc.status in (401, 403, 404, 410) or (exc.status == 409 and exc.code in LEASE_GONE_409)


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


class Rechunker:
    """Cuts the first chunks of a re-followed stream at the boundaries of the batch that was in flight
    when the worker stopped, so that a re-sent chunk has the same offset (and length) as the one the
    server may already hold, and is ignored there."""

    def __init__(self, pending: list):
        self.pending: dict[str, deque] = {}
        for stream, offset, length in pending:
            self.pending.setdefault(stream, deque()).append((int(offset), int(length)))
        self.buffers: dict[str, tuple[int, bytearray]] = {}

    def feed(self, chunk: LogChunk) -> list[LogChunk]:
        want = self.pending.get(chunk.stream)
        if not want:
            return [chunk]
        start, data = self.buffers.get(chunk.stream, (chunk.offset, bytearray()))
        if start + len(data) != chunk.offset:  # not contiguous: give up re-cutting
            self.pending.pop(chunk.stream, None)
            self.buffers.pop(chunk.stream, None)
            return ([LogChunk(chunk.stream, start, bytes(data))] if data else []) + [chunk]
        data += chunk.data
        out = []
        while want and start == want[0][0] and len(data) >= want[0][1]:
            length = want.popleft()[1]
            out.append(LogChunk(chunk.stream, start, bytes(data[:length])))
            start += length
            del data[:length]
        if want and start != want[0][0]:
            want.clear()
        if not want:
            self.pending.pop(chunk.stream, None)
            self.buffers.pop(chunk.stream, None)
            if data:
                out.append(LogChunk(chunk.stream, start, bytes(data)))
        else:
            self.buffers[chunk.stream] = (start, data)
        return out

    def drain(self) -> list[LogChunk]:
        out = [LogChunk(stream, start, bytes(data)) for stream, (start, data) in self.buffers.items() if data]
        self.buffers.clear()
        self.pending.clear()
        return out


_END = object()


class JobTarget:
    """One job's place on one computer: its workspace there and the steps run in it (facts, spec, source,
    inputs, supervisor start, the followed log stream, the outputs, the stop). An ordinary job has one
    (JobRunner); a cluster job has one per replica (ClusterRunner), in the workspace `<jobId>-<replica>`,
    whose state lives in `record["replicas"][name]`. The lease, the API, the journal and the checks for a
    worker stop or a lost lease are its job's (`owner`); a target has no threads of its own."""

    target_facts: TargetFacts | None = None  # what came with the poll before the start (keep_facts)

    def __init__(self, owner: LeasedJob, record: dict, *, started: bool, replica: dict | None = None):
        self.owner = owner
        self.manager, self.api, self.config = owner.manager, owner.api, owner.config
        self.id, self.lease, self.stop, self.done = owner.id, owner.lease, owner.stop, owner.done
        self.record = record  # its offsets, pending chunks and final state: the job's record, or its replica's
        self.started = started
        self.replica = dict(replica or {})
        self.name = self.replica_name = str(replica["name"]) if replica else None  # its log chunks name it
        placed = replica or owner.job
        self.computer = dict(placed.get("computer") or {})
        self.gpu_ids = [str(g) for g in placed.get("gpu_ids") or []]
        self.job = dict(owner.job, computer=self.computer, gpu_ids=self.gpu_ids) if replica else owner.job
        self.python = str(self.computer.get("python_path") or "python3")
        self.working_dir = str(self.computer.get("working_dir") or "").rstrip("/")
        # The supervisor's workspace name: the job id, or `<jobId>-<replica>` for a cluster job's replica.
        self.workspace_id = f"{self.id}-{self.name}" if replica else str(self.id)
        self.job_dir = workspace(self.working_dir, self.workspace_id) if self.working_dir.startswith("/") else ""
        self.abort = threading.Event()  # the job stops following this replica (it failed elsewhere)
        self.inputs_pinned = False  # its input versions are in its computer's cache, pinned for the job
        # Telemetry (JobManager.telemetry_loop): its own probe on its own computer, its metrics named
        # system/… (system/<replica>/… on a replica), until the job is done or this target has ended.
        self.telemetry_step = 0
        self.sampled_at = float("-inf")
        self.gpu_sampler: threading.Thread | None = None  # nvidia-smi on the target (worker_agent.gpu_remote)
        self.metric_prefix = gpu_remote.replica_prefix(self.name) if replica else gpu_remote.SYSTEM
        self.outside_gpus: set[str] = set()  # its GPUs that processes outside Mado shared at the last sample
        self.log_frames = True  # whether the server takes log frames (worker/jobs/{id}/log-frames); not after a 404
        self.log_meter: log_delivery.Throughput | None = None  # this job's MB/s line, made at its first post
        self.log_cuts: frozenset = frozenset()  # (stream, offset) where a chunk in flight before a restart began/ended

    def save(self, *, durable: bool = True, **changes) -> None:
        self.owner.save(durable=durable, part=self.record, **changes)

    def check(self) -> None:
        self.owner.check()
        if self.abort.is_set():
            raise Stopping()

    def pause(self, seconds: float) -> None:
        self.stop.wait(seconds)
        self.check()

    def call(self, send, what: str):
        return self.owner.call(send, what, by=self)

    # -- the target ----------------------------------------------------------------------------

    def connection(self):
        return self.manager.pool.get(Target.from_api(self.computer))

    def remote(self, connection) -> Remote:
        return Remote(connection, working_dir=self.working_dir, job_id=self.workspace_id, python=self.python)

    def on_target(self, action, what: str):
        """Run `action(connection)`, retrying when the network or the target fails."""
        failures = 0
        first_failure = None
        while True:
            self.check()
            try:
                return action(self.connection())
            except ConnectError as exc:
                if exc.code in CONFIG_CONNECT_CODES and not self.started:
                    raise StartFailed(exc.detail) from None
                error = exc.detail
            except TRANSIENT as exc:
                error = f"{type(exc).__name__}: {exc}"
            failures += 1
            first_failure = first_failure or time.monotonic()
            if not self.started and time.monotonic() - first_failure > CONNECT_BEFORE_START_SECONDS:
                raise StartFailed(f"The computer could not be reached for {CONNECT_BEFORE_START_SECONDS:.0f} s: "
                                  f"{error}")
            log.log(logging.INFO if failures == 1 else logging.WARNING,
                    "job %s: %s failed (%s); trying again", self.id, what, mask_tokens(error))
            self.pause(min(10.0, 0.5 * 2 ** min(failures, 5)))

    # -- before the start ----------------------------------------------------------------------

    def prepare(self) -> dict:
        """Everything before the supervisor starts: the spec, the source, the input datasets."""
        spec = self.spec()
        if self.job.get("source"):
            self.fetch_source()
        if self.job.get("input_datasets"):
            self.ensure_inputs()
        return spec

    @property
    def facts_binary(self) -> str:
        return facts_binary(str(self.job.get("runtime") or "python"))

    def keep_facts(self, state: dict) -> None:
        """The target's facts that came with a poll (a job still to start): spec() needs no run of its own."""
        if state.get("facts"):
            self.target_facts = facts_from(state["facts"])

    def spec(self) -> dict:
        facts = self.target_facts or self.on_target(
            lambda c: read_facts(c, python=self.python, runtime=str(self.job.get("runtime") or "python")),
            "reading target facts")
        try:
            spec = build_spec(self.job, facts, grace_seconds=self.config.cancel_grace,
                              cluster=self.owner.cluster_spec_of(self), hold=self.owner.HOLD_START)
        except RuntimeRefused as exc:
            raise StartFailed(exc.message) from None
        return self.owner.replica_spec(self, spec)

    def start_supervisor(self, spec: dict) -> dict:
        try:
            return self.on_target(lambda c: self.remote(c).start(spec), "starting the supervisor")
        except SupervisorError as exc:
            raise StartFailed(f"The supervisor refused to start the job ({exc.code}): {exc.message}") from None

    def ensure_inputs(self) -> None:
        """The job's input dataset versions into the computer's cache before the supervisor starts
        (worker_agent.dataset_transfer); a version that cannot be delivered fails the start."""
        def ensure(connection):
            return dataset_transfer.ensure_inputs(connection, self.api, self.job, worker_id=self.config.worker_id,
                                                  lease=self.lease, python=self.python, working_dir=self.working_dir)

        try:
            answers = self.on_target(ensure, "delivering the input datasets")
        except dataset_transfer.DatasetError as exc:
            self.release_inputs()
            raise StartFailed(exc.message, reason="input_failed") from None
        self.inputs_pinned = True
        if answers:
            self.report_cache_usage(answers[-1]["usage"])

    def release_inputs(self) -> None:
        """The job will not start here: its pins would keep those versions from eviction for hours."""
        try:
            dataset_transfer.release(self.connection(), self.id, python=self.python, working_dir=self.working_dir)
        except Exception as error:
            log.info("job %s: its dataset cache pins stay until they lapse (%s)", self.id, error)

    def report_cache_usage(self, usage: dict) -> None:
        # The server files the report under the job's computer (a cluster job's: main1's); another
        # computer's numbers would overwrite it there.
        if self.computer.get("id") == self.owner.computer.get("id"):
            dataset_transfer.report_usage(self.api, self.job, self.config.worker_id, self.lease, usage)

    def fetch_source(self) -> None:
        source = self.job["source"]
        if source.get("kind") != "archive":
            try:
                self.on_target(lambda c: fetch_source(c, python=self.python, job_dir=self.job_dir, source=source),
                               "fetching the source")
            except RemoteFileError as exc:
                raise StartFailed(exc.message) from None
            return
        with tempfile.TemporaryFile(prefix="mmt-source-") as archive:
            def download():
                archive.seek(0)
                archive.truncate()
                return self.api.download_source(self.id, self.config.worker_id, self.lease, archive)

            try:
                size = self.call(download, "source download")
            except ApiError as exc:
                raise StartFailed(f"The source could not be downloaded: {exc}") from None
            archive.seek(0)
            digest = hashlib.sha256()
            for block in iter(lambda: archive.read(1 << 20), b""):
                digest.update(block)
            if source.get("sha256") and digest.hexdigest() != source["sha256"]:
                raise StartFailed("The downloaded source archive does not match its sha256; upload it again.")
            log.info("job %s: source archive downloaded (%d bytes); unpacking it on the target", self.id, size)

            def unpack(connection):
                archive.seek(0)
                return fetch_source(connection, python=self.python, job_dir=self.job_dir, source=source,
                                    archive=archive)

            try:
                self.on_target(unpack, "unpacking the source")
            except RemoteFileError as exc:
                raise StartFailed(exc.message) from None

    # -- logs ----------------------------------------------------------------------------------

    def follow(self) -> dict:
        pending = self.record.get("pending") or []
        rechunker = Rechunker(pending) if pending else None
        # The re-cut chunks must reach the server as they were cut (it may hold them): merging stops there.
        self.log_cuts = log_delivery.cut_points(pending)
        if pending:
            log.info("job %s: %d log chunk(s) were in flight when the worker stopped; sending them again cut at the "
                     "same offsets", self.id, len(pending))
        failures = 0
        while True:
            self.check()
            try:
                connection = self.connection()
                final = self.follow_once(self.remote(connection), rechunker)
            except ConnectError as exc:
                final, error = None, exc.detail
            except TRANSIENT as exc:
                final, error = None, f"{type(exc).__name__}: {exc}"
            else:
                error = "the stream ended before the job's end"
            if final is not None:
                return final
            failures += 1
            log.log(logging.INFO if failures == 1 else logging.WARNING,
                    "job %s: log stream interrupted (%s); following again from stdout %d, stderr %d", self.id,
                    error, self.record["offsets"]["stdout"], self.record["offsets"]["stderr"])
            self.pause(min(10.0, 0.5 * 2 ** min(failures, 5)))

    def follow_once(self, remote: Remote, rechunker: Rechunker | None) -> dict | None:
        offsets = self.record["offsets"]
        follow = remote.follow(offsets["stdout"], offsets["stderr"])
        # Room for a whole batch of follow chunks (≤ 256 KiB each) while the previous batch is posted,
        # so reading the stream and posting overlap (log_delivery, docs/logs.md).
        items: queue.Queue = queue.Queue(maxsize=max(32, 2 * LOG_BATCH_BYTES // (256 << 10)))
        closed = threading.Event()

        def put(item) -> None:
            while not closed.is_set():
                try:
                    items.put(item, timeout=0.5)
                    return
                except queue.Full:
                    continue

        def reader() -> None:
            try:
                for item in follow:
                    put(item)
                put(_END)
            except Exception as exc:  # StreamBroken, a stall, the connection
                put(exc)

        thread = threading.Thread(target=reader, name=f"job-{self.id}-follow", daemon=True)
        thread.start()
        batch: list[LogChunk] = []
        size = 0
        first = 0.0
        try:
            while True:
                self.check()
                wait = 0.5 if not batch else max(0.0, first + LOG_FLUSH_SECONDS - time.monotonic())
                try:
                    item = items.get(timeout=wait)
                except queue.Empty:
                    if batch:
                        self.post_logs(batch, started=first)
                        batch, size = [], 0
                    continue
                if isinstance(item, LogChunk):
                    for chunk in rechunker.feed(item) if rechunker else [item]:
                        if not batch:
                            first = time.monotonic()
                        batch.append(chunk)
                        size += len(chunk.data)
                    if size >= LOG_BATCH_BYTES:
                        self.post_logs(batch, behind=True, started=first)
                        batch, size = [], 0
                    continue
                if isinstance(item, StateFrame):
                    if not item.final:
                        continue
                    if rechunker:
                        batch += rechunker.drain()
                    if batch:
                        self.post_logs(batch, started=first)
                    self.report_throughput(self.log_meter and self.log_meter.finish())
                    return item.state
                # the stream ended or broke: deliver what arrived, then follow again from there
                if batch:
                    self.post_logs(batch, started=first)
                if isinstance(item, Exception):
                    raise item if isinstance(item, TRANSIENT) else ConnectionError(str(item))
                return None
        finally:
            closed.set()
            follow.close()
            thread.join(timeout=5)

    def post_logs(self, batch: list[LogChunk], *, behind: bool = False, started: float | None = None) -> None:
        """Deliver a batch, as frames of bytes (merged into chunks of up to 4 MiB) or, to a server without
        that endpoint, as JSON chunks of at most 256 KiB. `behind`: the batch was cut for its size, so
        more output is waiting (the MB/s line comes once the worker has caught up)."""
        if self.log_frames:
            batch = log_delivery.merge(batch, cuts=self.log_cuts)
        # The boundaries of what is in flight: after a restart the Rechunker cuts the same chunks again.
        self.save(pending=[[c.stream, c.offset, len(c.data)] for c in batch], durable=False)
        try:
            self.send_logs(batch)
        except LeaseRejected:
            raise
        except ApiError as exc:  # 422: the server refuses these chunks; they cannot get better by resending
            log.error("job %s: the server refused %d log chunk(s): %s", self.id, len(batch), exc)
        offsets = dict(self.record["offsets"])
        for chunk in batch:
            offsets[chunk.stream] = max(offsets[chunk.stream], chunk.end)
        self.save(offsets=offsets, pending=[], durable=False)
        if self.log_meter is None:
            self.log_meter = log_delivery.Throughput()
        self.report_throughput(self.log_meter.delivered(sum(len(c.data) for c in batch), behind=behind,
                                                        started=started))

    def send_logs(self, batch: list[LogChunk]) -> None:
        if self.log_frames:
            try:
                self.call(lambda: log_delivery.post_frames(self.api, self.id, self.config.worker_id, self.lease, batch,
                                                           replica=self.replica_name), "logs")
                return
            except log_delivery.NotServed:
                log.info("job %s: the server takes no log frames; sending logs as JSON chunks", self.id)
                self.log_frames = False
        if any(len(c.data) > log_delivery.JSON_CHUNK_BYTES for c in batch):
            batch = log_delivery.split(batch)  # the JSON endpoint takes ≤ 1 MiB a chunk
            self.save(pending=[[c.stream, c.offset, len(c.data)] for c in batch], durable=False)
        chunks = [c.as_api_chunk() for c in batch]
        if self.replica_name:
            chunks = [dict(chunk, replica=self.replica_name) for chunk in chunks]
        self.call(lambda: self.api.job_logs(self.id, self.config.worker_id, self.lease, chunks), "logs")

    def report_throughput(self, sentence: str | None) -> None:
        if sentence:
            log.info("job %s: %s", self.id, sentence)

    # -- the end -------------------------------------------------------------------------------

    def note(self, text: str, level: int) -> None:
        log.log(level, "job %s: %s", self.id, text)

    def conclude(self, final: dict) -> dict:
        return conclude(final, self.outputs, walltime=self.job.get("walltime_seconds"), subject="The job",
                        lost=lambda f: SUPERVISOR_LOST if f.get("status") == "unknown" else
                        f.get("error") or f"The job's state on the target is {f.get('status')}.")

    def outputs(self) -> dict:
        outputs_dir = f"{self.job_dir}/outputs"
        limit = self.config.max_output_files
        try:
            listing = self.on_target(lambda c: list_outputs(c, python=self.python, outputs_dir=outputs_dir,
                                                            max_files=limit), "listing the outputs")
        except RemoteFileError as exc:
            return invalid_result(exc.message)
        if listing.get("result") is None:
            files = [f for f in listing.get("files") or [] if f.get("kind") != "dir"]
            if files:
                log.info("job %s: %d file(s) in the outputs directory but no result.json: nothing is uploaded",
                         self.id, len(files))
        elif listing.get("too_many"):  # the listing stopped early: the count itself is the answer
            error = too_many_files(f"more than {limit}", limit)
            log.warning("job %s: %s", self.id, error)
            return invalid_result(error)
        # The server applies this worker's limit up to its own maximum (MADO_MAX_OUTPUT_FILES).
        return send_outputs(listing, max_files=limit, limit_setting=WORKER_LIMIT_SETTING, note=self.note,
                            upload=self.upload, upload_batch=self.upload_batch, gone=lease_gone, pause=self.pause,
                            cap=10.0, transient=TRANSIENT, declare=lambda result, files, manifest: self.call(
                                lambda: self.api.job_outputs(self.id, self.config.worker_id, self.lease, result, files,
                                                             manifest, max_files=limit), "outputs"))

    def upload(self, path: str, size: int, number: int, count: int) -> None:
        full = f"{self.job_dir}/outputs/{path}"

        def put(offset: int, length: int, content_range: str | None) -> dict:
            self.check()
            with RemoteRange(self.connection(), python=self.python, path=full, offset=offset, length=length) as body:
                return self.api.put_artifact(self.id, self.config.worker_id, self.lease, path,
                                             body if length else b"", content_range=content_range)

        def progress(offset: int) -> None:
            log.info("job %s: uploading %s (%d/%d): %d of %d bytes (%.0f%%)", self.id, path, number, count, offset,
                     size, 100.0 * offset / size if size else 100.0)

        try:
            upload(path, size, put, gone=lease_gone, transient=TRANSIENT, note=self.note, progress=progress,
                   pause=self.pause, cap=10.0)
        except ApiError as exc:  # only a lost lease gets through (FatalApiError is a 401/403)
            raise LeaseRejected(f"{exc.status} {exc.code}: {exc}") from None

    def upload_batch(self, files: list[dict]) -> dict:
        """Many small outputs in one request, read on the target by one program over one channel."""
        self.check()
        with open_frames(self.connection(), self.python, f"{self.job_dir}/outputs", files) as body:
            try:
                return self.api.put_artifacts_batch(self.id, self.config.worker_id, self.lease, body)
            except ApiError as exc:
                if isinstance(exc, FatalApiError) or lease_gone(exc):
                    raise LeaseRejected(f"{exc.status} {exc.code}: {exc}") from None
                raise

    def stop_now(self) -> dict:
        """SIGTERM, SIGKILL after the grace; the supervisor's state then."""
        return self.on_target(lambda c: self.remote(c).cancel(grace=self.config.cancel_grace),
                              f"stopping {self.name or 'the job'}")


class LeasedJob:
    """What every job on this worker has, wherever it runs: its lease and journal record, its thread and
    heartbeat thread, the steps (`proceed`), the completion and stop requests; the subclass gives
    ensure_started, follow, conclude and _cancel. Its work on computers is done by its JobTargets
    (`targets`): one for a JobRunner, one per replica for a ClusterRunner."""

    # Whether the supervisors hold the job's processes until `release` (cluster replicas: ClusterRunner).
    HOLD_START = False
    targets: list[JobTarget]

    def __init__(self, manager: JobManager, record: dict):
        self.manager = manager
        self.api: ApiClient = manager.api
        self.config: WorkerConfig = manager.config
        self.record = record
        self.job = dict(record["job"], job_token=record.get("job_token"))
        self.id = int(record["job_id"])
        self.lease = str(record["lease_id"])
        self.computer = dict(self.job.get("computer") or {})
        self.stop = manager.stop_event
        self.done = threading.Event()
        self.rejected: str | None = None
        self.cancel_requested = bool(self.job.get("cancel_requested"))
        self.started = record["step"] not in ("claimed",)
        self._lock = threading.Lock()
        self._cancel_thread: threading.Thread | None = None
        self._beat = threading.Event()
        self._record_lock = threading.Lock()
        self._forgotten = False
        self.gpu_waiting: str | None = None  # why the job waits for its GPUs (a process outside Mado)
        self.thread = threading.Thread(target=self.main, name=f"job-{self.id}", daemon=True)
        self.heartbeat_thread = threading.Thread(target=self.heartbeats, name=f"job-{self.id}-heartbeat", daemon=True)

    # -- bookkeeping ---------------------------------------------------------------------------

    def save(self, *, durable: bool = True, part: dict | None = None, **changes) -> None:
        """`changes` into the record (or `part` of it: a replica's), journaled while the job is this worker's."""
        with self._record_lock:
            (self.record if part is None else part).update(changes)
            self.record["updated_at"] = now_iso()
            if not self._forgotten:
                self.manager.journal.save(self.record, durable=durable)

    @property
    def finished(self) -> bool:
        """Completed or dropped: nothing of this job is left to this worker."""
        return self._forgotten

    def forget(self) -> None:
        """The job is over for this worker: its record goes, and nothing writes it again."""
        with self._record_lock:
            self._forgotten = True
            self.manager.journal.remove(self.id)

    def check(self) -> None:
        """Raise when this runner must leave the job alone now."""
        if self.rejected is not None:
            raise LeaseRejected(self.rejected)
        if self.stop.is_set():
            raise Stopping()

    def pause(self, seconds: float) -> None:
        self.stop.wait(seconds)
        self.check()

    def start(self) -> None:
        self.heartbeat_thread.start()
        self.thread.start()

    def main(self) -> None:
        failures = 0
        try:
            while True:
                try:
                    self.check()
                    self.proceed()
                    return
                except (Stopping, GivenBack):
                    return
                except LeaseRejected as exc:
                    self.drop(str(exc))
                    return
                except FatalApiError as exc:
                    self.drop(str(exc))
                    return
                except Exception:  # a bug or an unforeseen failure: keep the job, try the step again
                    failures += 1
                    log.exception("job %s: unexpected error; trying again", self.id)
                    self.stop.wait(min(60.0, 2.0 ** failures))
        finally:
            self.done.set()
            self._beat.set()
            self.api.close()
            self.manager.runner_ended(self)

    def drop(self, why: str) -> None:
        log.warning("job %s: the server no longer gives this job to this worker (%s); leaving it alone",
                    self.id, mask_tokens(why))
        self.forget()

    # -- API calls with retries ----------------------------------------------------------------

    def call(self, send, what: str, *, by: LeasedJob | JobTarget | None = None):
        """Send a leased call until the server answers: network trouble and 5xx are retried with
        backoff for as long as it takes (the server may be restarting); a lost lease raises. `by`: the
        target sending it, whose check (and pause) apply."""
        by = by or self
        failures = 0
        while True:
            by.check()
            try:
                return send()
            except ApiUnavailable as exc:
                failures += 1
                level = logging.INFO if failures == 1 else logging.WARNING
                log.log(level, "job %s: %s not delivered yet (%s); retrying", self.id, what, exc)
                by.pause(min(10.0, 0.5 * 2 ** min(failures, 5)))
            except ApiError as exc:
                if isinstance(exc, FatalApiError) or lease_gone(exc):
                    raise LeaseRejected(f"{exc.status} {exc.code}: {exc}") from None
                raise

    # -- the steps -----------------------------------------------------------------------------

    def proceed(self) -> None:
        if self.record["completion"] is None and self.record["final"] is None:
            try:
                self.ensure_started()
            except StartFailed as exc:
                log.warning("job %s could not start: %s", self.id, exc.message)
                self.save(completion={"status": "failed", "end_reason": exc.reason,
                                      "error": mask_tokens(exc.message, self.job.get("job_token") or "")})
            if self.record["completion"] is None and self.record["final"] is None:
                final = self.follow()
                self.save(final=final, step="ended")
        while True:
            if self.record["completion"] is None:
                self.save(completion=self.conclude(self.record["final"]), step="completing")
            if self.deliver():
                return

    def cluster_spec_of(self, target: JobTarget) -> dict | None:
        """`build_spec`'s `cluster` argument: none for an ordinary job (see ClusterRunner)."""
        return None

    def replica_spec(self, target: JobTarget, spec: dict) -> dict:
        """What the job adds to build_spec's spec: nothing for an ordinary job (see ClusterRunner)."""
        return spec

    def busy_checks(self) -> list[tuple[JobTarget, float, str]]:
        """Where the busy check looks before the start: (each target with GPUs, how long it may wait on its
        computer, where that wait came from: gpu_remote.busy_wait_for); none where the wait is 0 (off)."""
        checks = []
        for target in self.targets:
            limit, source = gpu_remote.busy_wait_for(target.computer, self.manager.gpu_busy_wait)
            if target.gpu_ids and limit > 0:
                checks.append((target, limit, source))
        return checks

    def wait_for_free_gpus(self) -> None:
        """Reservations hold only between this app's Jobs (seed 002): a process outside Mado on one of
        the job's GPUs (someone over SSH, another scheduler) makes the job wait, still claimed, looking
        again every few seconds for up to the computer's wait (gpu_busy_wait_seconds in the claim;
        gpu_remote.busy_wait_for); then it gives the claim back to the queue with the reason (give_back). A
        process of a Mado job (MMT_JOB_ID in its environment) does not count. Without a working nvidia-smi
        on the target nothing is checked (said once in the log). A cluster job looks at every replica's
        GPUs on its own computer (busy_checks), each computer with its own wait; the first one past its
        wait gives the whole claim back."""
        checks = self.busy_checks()
        if not checks:
            return
        began = time.monotonic()
        said = None
        while not self.cancel_requested and checks:
            clauses, busy = [], []
            for check in list(checks):
                unit, limit, source = check
                where = f" of {unit.replica_name}" if unit.replica_name else ""
                try:
                    sample = unit.on_target(lambda c, u=unit: gpu_remote.sample_once(c, u.python),
                                            f"looking at the processes on the GPUs{where or ' of the job'}")
                except StartFailed as exc:
                    exc.unit = unit  # the cluster job fails naming this replica
                    raise
                if sample.error:
                    log.info("job %s: %s GPUs%s were not checked for processes outside Mado: %s", self.id,
                             "the" if where else "its", where, sample.error)
                    checks.remove(check)
                    continue
                found = gpu_remote.busy_clauses(sample.foreign(unit.gpu_ids), replica=unit.replica_name,
                                                computer=str(unit.computer.get("name") or ""))
                if found:
                    clauses += found
                    busy.append(check)
            if not clauses:
                if said:
                    log.info("job %s: its GPUs are free of processes outside Mado now; starting it", self.id)
                break
            reason = gpu_remote.join_reason(clauses)
            self.gpu_waiting = reason
            if reason != said:
                log.warning("job %s waits (claimed): %s", self.id, reason)
                said = reason
                self._beat.set()  # the reason reaches the job's page with the next heartbeat, now
            now = time.monotonic()
            over = next(((limit, source) for _, limit, source in busy if now - began >= limit), None)
            if over is not None:
                suffix = f"; it waited {over[0]:.0f} s ({over[1]})"
                self.give_back(gpu_remote.join_reason(clauses, gpu_remote.MAX_REASON - len(suffix)) + suffix)
            deadline = began + min(limit for _, limit, _ in busy)
            self.pause(max(0.05, min(gpu_remote.BUSY_RECHECK_SECONDS, deadline - now)))
        self.gpu_waiting = None

    def telemetry_units(self) -> list[JobTarget]:
        """What the telemetry loop samples, each with its own probe and metric names: the job's target, or
        a cluster job's replicas, once each has started."""
        return [target for target in self.targets if target.started]

    def release_target_inputs(self) -> None:
        """The job will not run: the input pins on each computer that got its inputs go now. A computer
        where no replica's supervisor started would otherwise hold them for hours."""
        done = set()
        for target in self.targets:
            where = (target.computer.get("id"), target.working_dir)
            if target.inputs_pinned and where not in done:
                done.add(where)
                target.release_inputs()

    def give_back(self, reason: str) -> None:
        """Back to the queue, unstarted (worker/jobs/{id}/release): the server hands it to another worker,
        or to this one again after a while. The input pins on the computers go first; then nothing of the
        job is left here. Raises GivenBack."""
        self.release_target_inputs()
        self.call(lambda: self.api.job_release(self.id, self.config.worker_id, self.lease, reason),
                  "giving the claim back")
        log.warning("job %s: gave its claim back to the queue: %s", self.id, reason)
        self.forget()
        raise GivenBack()

    def confirm_start(self) -> None:
        """A `running` heartbeat before the process starts, answered by the server: after it the job is
        never requeued (jobs.services.requeue_unstarted), so it cannot run twice. A lease the server no
        longer gives (requeued while this worker was away) drops the job here, before anything ran."""
        answer = self.call(lambda: self.api.job_heartbeat(self.id, self.config.worker_id, self.lease, "running"),
                           "the lease confirmation before the start")
        self.save(running_reported=True)
        if answer.get("cancel_requested"):
            self.cancel_requested = True

    def mark_started(self) -> None:
        with self._lock:
            self.started = True
            if self.record["step"] == "claimed":
                self.save(step="started")
            cancel = self.cancel_requested
        self._beat.set()  # the first heartbeat with status running, now
        if cancel:
            self.begin_cancel()

    def deliver(self) -> bool:
        """Send the completion; False when the outputs must be sent again first."""
        completion = dict(self.record["completion"])
        try:
            self.call(lambda: self.send_completion(completion), "completion")
        except ApiError as exc:
            if exc.code == "artifacts_incomplete" and int(self.record.get("output_rounds") or 0) < 3:
                log.warning("job %s: %s; uploading the outputs again", self.id, exc)
                self.save(completion=None, output_rounds=int(self.record.get("output_rounds") or 0) + 1)
                return False
            log.error("job %s: the server refused the completion %s: %s", self.id, completion, exc)
            self.forget()
            return True
        log.info("job %s completed: %s%s%s%s", self.id, completion["status"],
                 f" (exit code {completion['exit_code']})" if completion.get("exit_code") is not None else "",
                 f", {completion['end_reason']}" if completion.get("end_reason") else "",
                 f", replica {completion['replica']}" if completion.get("replica") else "")
        self.forget()
        return True

    def send_completion(self, completion: dict) -> dict:
        return self.api.complete_job(self.id, self.config.worker_id, self.lease, completion["status"],
                                     exit_code=completion.get("exit_code"), error=completion.get("error"),
                                     end_reason=completion.get("end_reason"), replica=completion.get("replica"))

    # -- heartbeats and stop requests ------------------------------------------------------------

    def heartbeats(self) -> None:
        try:
            while not self.done.is_set() and not self.stop.is_set():
                status = "running" if self.started and not self.record.get("running_reported") else None
                try:
                    answer = self.api.job_heartbeat(self.id, self.config.worker_id, self.lease, status,
                                                    waiting=self.gpu_waiting if not self.started else None)
                except ApiUnavailable as exc:
                    log.debug("job %s: heartbeat not delivered (%s)", self.id, exc)
                except ApiError as exc:
                    if self.done.is_set():
                        return
                    if isinstance(exc, FatalApiError) or lease_gone(exc):
                        self.rejected = f"{exc.status} {exc.code}: {exc}"
                        return
                    log.warning("job %s: heartbeat refused: %s", self.id, exc)
                else:
                    if status == "running":
                        self.save(running_reported=True)
                    if answer.get("cancel_requested"):
                        self.request_cancel()
                self._beat.wait(HEARTBEAT_SECONDS)
                self._beat.clear()
        finally:
            self.api.close()

    def request_cancel(self) -> None:
        with self._lock:
            if self.cancel_requested and (self._cancel_thread is not None or not self.started):
                return
            self.cancel_requested = True
            started = self.started
        if started:
            self.begin_cancel()

    def begin_cancel(self) -> None:
        with self._lock:
            if self._cancel_thread is not None:
                return
            self._cancel_thread = threading.Thread(target=self._cancel, name=f"job-{self.id}-cancel", daemon=True)
        log.info("job %s: stop requested; SIGTERM now, SIGKILL after %s s", self.id, self.config.cancel_grace)
        self._cancel_thread.start()


class JobRunner(LeasedJob):
    """An ordinary job: the steps of its one JobTarget, on the job's computer."""

    def __init__(self, manager: JobManager, record: dict):
        super().__init__(manager, record)
        self.target = JobTarget(self, record, started=self.started)
        self.targets = [self.target]

    def ensure_started(self) -> None:
        target = self.target
        if not target.job_dir:
            raise StartFailed("The computer has no working directory (an absolute path on the target): set one in "
                              "its settings.")
        try:
            state = target.on_target(lambda c: target.remote(c).poll(facts=target.facts_binary),
                                     "asking the supervisor for the job's state")
        except SupervisorError as exc:
            if not self.started:
                raise StartFailed(f"The job's workspace cannot be used ({exc.code}): {exc.message}") from None
            self.save(final={"status": "refused", "error": f"The job's workspace cannot be used: {exc.message}"})
            return
        target.keep_facts(state)
        status = state.get("status")
        if status == "absent":
            if self.started:
                # It ran here before, and its workspace is gone: starting it again would run it twice.
                self.save(final={"status": "absent", "error": "The job's workspace on the target disappeared."})
                return
            if self.cancel_requested:
                log.info("job %s: stop requested before it started; not starting it", self.id)
                self.save(completion={"status": "canceled", "end_reason": "canceled"})
                return
            spec = target.prepare()
            if not self.record.get("running_reported"):  # after the `running` heartbeat it cannot go back
                self.wait_for_free_gpus()
            with self._lock:
                if self.cancel_requested:
                    self.save(completion={"status": "canceled", "end_reason": "canceled"})
                    return
            self.confirm_start()
            answer = target.start_supervisor(spec)
            log.info("job %s started on %s (%s runtime, supervisor pid %s)", self.id, self.computer.get("name"),
                     self.job.get("runtime"), (answer.get("supervisor") or {}).get("pid"))
        elif status == "unknown" and state.get("recoverable"):
            log.info("job %s: its supervisor is gone before the job ran; a new one takes over", self.id)
            target.start_supervisor(target.spec())
        else:
            log.info("job %s: re-attached (status %s%s)", self.id, status,
                     "" if status != "unknown" else ", supervisor gone; the job is never started again")
        self.mark_started()

    def mark_started(self) -> None:
        self.target.started = True  # its steps on the target no longer fail the start (on_target)
        super().mark_started()

    def follow(self) -> dict:
        return self.target.follow()

    def conclude(self, final: dict) -> dict:
        return self.target.conclude(final)

    def _cancel(self) -> None:
        try:
            state = self.target.stop_now()
            log.info("job %s: stopped (%s)", self.id, state.get("status"))
        except (Stopping, LeaseRejected):
            pass
        except Exception:
            log.exception("job %s: stopping the job failed", self.id)
            with self._lock:
                self._cancel_thread = None
        finally:
            self.api.close()


