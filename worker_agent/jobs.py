"""Jobs on the worker: the claim loop (`JobManager`) and one `JobRunner` per job.

Claiming. The worker claims while it runs fewer jobs than `parallel_jobs`, with a long-poll, and again
as soon as a job ends (the server ends a waiting claim with 200, no item and reason `active_jobs_ended`
when one of the listed jobs completes). A claim is sent once: after a network error the worker calls
`resume`, which returns every job the server gives this worker (a claim whose answer was lost among
them), never sending the claim again. The server puts a job back in the queue when it was claimed and
never started and 60 s passed without a heartbeat, so a worker confirms its lease with a `running`
heartbeat *before* it starts the job's process: a job is started only under a lease the server still
gives it, and a job the server calls running is never handed to another worker.

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

A cluster job (docs/cluster-jobs.md) runs as a `ClusterRunner`: one `ReplicaRunner` per replica does
the steps above on its own computer and workspace `<jobId>-<replica>`; all are prepared before any
starts (the source and inputs by the worker; the venv or container by each supervisor, which then
holds until the job releases all replicas at once); each replica's logs are followed on its own
thread and posted with its name; the job ends with main1 (the subs are then stopped) or with the
first sub that fails (the others are stopped; the completion names it); a stop request stops them all.
Python replicas on SSH computers also get `ssh` between them (worker_agent/replica_ssh.py): the job's
key is authorized on every replica's computer before any is prepared and removed before the completion.

Any leased call answered 401/403/404/410, or 409 `invalid_lease`/`job_ended`/`job_already_completed`,
means the lease is gone: the worker stops touching that job and forgets it. SIGTERM to the worker
stops the runners where they are and leaves every job running on its target."""
from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import queue
import tempfile
import threading
import time
from collections import deque
from datetime import UTC, datetime

from worker_agent import authorized_keys, dataset_transfer, gpu_remote, jobenv, log_delivery, replica_ssh
from worker_agent.api import ApiClient, ApiError, ApiUnavailable, Backoff, FatalApiError
from worker_agent.config import WorkerConfig
from worker_agent.journal import JobJournal
from worker_agent.remote_files import RemoteFileError, RemoteRange, fetch_source, list_outputs, net_fact, open_frames
from worker_agent.core.lifecycle import conclude, invalid_result, send_outputs, signal_name, upload
from worker_agent.results import WORKER_LIMIT_SETTING, too_many_files
from worker_agent.runtimes import (CONTAINER_RUNTIMES, RuntimeRefused, TargetFacts, build_spec, facts_binary,
                                   facts_from, read_facts)
from worker_agent.ssh import CommandTimeout, ConnectError, ConnectionPool, Target
from worker_agent.supervisor import LogChunk, Remote, StateFrame, SupervisorError, spec_hash, workspace
from worker_agent.telemetry import INTERVAL_SECONDS, GpuTelemetry, metric_points, same_machine
from worker_agent.text import mask_tokens

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


def new_record(item: dict) -> dict:
    job = {k: v for k, v in item.items() if k != "job_token"}
    return {"format": 1, "job_id": int(item["id"]), "lease_id": str(item["lease_id"]),
            "job_token": item.get("job_token"), "job": job, "step": "claimed",
            "offsets": {"stdout": 0, "stderr": 0}, "pending": [], "final": None, "completion": None,
            "running_reported": item.get("status") == "running", "claimed_at": now_iso()}


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


class JobRunner:
    # Whether the supervisor holds the job's process until `release` (cluster replicas: ClusterRunner).
    HOLD_START = False
    target_facts: TargetFacts | None = None  # what came with the poll before the start (keep_facts)

    def __init__(self, manager: JobManager, record: dict):
        self.manager = manager
        self.api: ApiClient = manager.api
        self.config: WorkerConfig = manager.config
        self.record = record
        self.job = dict(record["job"], job_token=record.get("job_token"))
        self.id = int(record["job_id"])
        self.lease = str(record["lease_id"])
        self.computer = dict(self.job.get("computer") or {})
        self.python = str(self.computer.get("python_path") or "python3")
        self.working_dir = str(self.computer.get("working_dir") or "").rstrip("/")
        # The supervisor's workspace name: the job id, or `<jobId>-<replica>` for a cluster job's replica.
        self.workspace_id = str(self.id)
        self.job_dir = workspace(self.working_dir, self.workspace_id) if self.working_dir.startswith("/") else ""
        self.replica_name: str | None = None  # set on the replicas of a cluster job: their log chunks name it
        self.gpu_ids = [str(g) for g in self.job.get("gpu_ids") or []]
        self.inputs_pinned = False
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
        self.telemetry_step = 0
        self.sampled_at = float("-inf")
        self.gpu_sampler: threading.Thread | None = None  # nvidia-smi on the target (worker_agent.gpu_remote)
        self.gpu_waiting: str | None = None  # why the job waits for its GPUs (a process outside Mado)
        self.metric_prefix = gpu_remote.SYSTEM  # `system/<replica>/` on a cluster job's replicas
        self.outside_gpus: set[str] = set()  # its GPUs that processes outside Mado shared at the last sample
        self.thread = threading.Thread(target=self.main, name=f"job-{self.id}", daemon=True)
        self.heartbeat_thread = threading.Thread(target=self.heartbeats, name=f"job-{self.id}-heartbeat", daemon=True)

    # -- bookkeeping ---------------------------------------------------------------------------

    def save(self, *, durable: bool = True, **changes) -> None:
        with self._record_lock:
            self.record.update(changes)
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

    def call(self, send, what: str):
        """Send a leased call until the server answers: network trouble and 5xx are retried with
        backoff for as long as it takes (the server may be restarting); a lost lease raises."""
        failures = 0
        while True:
            self.check()
            try:
                return send()
            except ApiUnavailable as exc:
                failures += 1
                level = logging.INFO if failures == 1 else logging.WARNING
                log.log(level, "job %s: %s not delivered yet (%s); retrying", self.id, what, exc)
                self.pause(min(10.0, 0.5 * 2 ** min(failures, 5)))
            except ApiError as exc:
                if isinstance(exc, FatalApiError) or lease_gone(exc):
                    raise LeaseRejected(f"{exc.status} {exc.code}: {exc}") from None
                raise

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

    def ensure_started(self) -> None:
        if not self.job_dir:
            raise StartFailed("The computer has no working directory (an absolute path on the target): set one in "
                              "its settings.")
        try:
            state = self.on_target(lambda c: self.remote(c).poll(facts=self.facts_binary),
                                   "asking the supervisor for the job's state")
        except SupervisorError as exc:
            if not self.started:
                raise StartFailed(f"The job's workspace cannot be used ({exc.code}): {exc.message}") from None
            self.save(final={"status": "refused", "error": f"The job's workspace cannot be used: {exc.message}"})
            return
        self.keep_facts(state)
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
            spec = self.prepare()
            if not self.record.get("running_reported"):  # after the `running` heartbeat it cannot go back
                self.wait_for_free_gpus()
            with self._lock:
                if self.cancel_requested:
                    self.save(completion={"status": "canceled", "end_reason": "canceled"})
                    return
            self.confirm_start()
            answer = self.start_supervisor(spec)
            log.info("job %s started on %s (%s runtime, supervisor pid %s)", self.id, self.computer.get("name"),
                     self.job.get("runtime"), (answer.get("supervisor") or {}).get("pid"))
        elif status == "unknown" and state.get("recoverable"):
            log.info("job %s: its supervisor is gone before the job ran; a new one takes over", self.id)
            self.start_supervisor(self.spec())
        else:
            log.info("job %s: re-attached (status %s%s)", self.id, status,
                     "" if status != "unknown" else ", supervisor gone; the job is never started again")
        self.mark_started()

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
            return build_spec(self.job, facts, grace_seconds=self.config.cancel_grace, cluster=self.cluster_spec(),
                              hold=self.HOLD_START)
        except RuntimeRefused as exc:
            raise StartFailed(exc.message) from None

    def cluster_spec(self) -> dict | None:
        """`build_spec`'s `cluster` argument: none for an ordinary job (see ReplicaRunner)."""
        return None

    def busy_checks(self) -> list[tuple[JobRunner, float, str]]:
        """Where the busy check looks before the start: (the job or a replica, how long it may wait, where
        that wait came from: gpu_remote.busy_wait_for); none without GPUs or where the wait is 0 (off)."""
        limit, source = gpu_remote.busy_wait_for(self.computer, self.manager.gpu_busy_wait)
        return [(self, limit, source)] if self.gpu_ids and limit > 0 else []

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

    def telemetry_units(self) -> list[JobRunner]:
        """What the telemetry loop samples, each with its own probe and metric names: the job itself, or
        a cluster job's replicas (ClusterRunner)."""
        return [self]

    def give_back(self, reason: str) -> None:
        """Back to the queue, unstarted (worker/jobs/{id}/release): the server hands it to another worker,
        or to this one again after a while. The input pins on the computer go first; then nothing of the
        job is left here. Raises GivenBack."""
        if self.inputs_pinned:
            self.release_inputs()
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

    def start_supervisor(self, spec: dict) -> dict:
        try:
            return self.on_target(lambda c: self.remote(c).start(spec), "starting the supervisor")
        except SupervisorError as exc:
            raise StartFailed(f"The supervisor refused to start the job ({exc.code}): {exc.message}") from None

    def mark_started(self) -> None:
        with self._lock:
            self.started = True
            if self.record["step"] == "claimed":
                self.save(step="started")
            cancel = self.cancel_requested
        self._beat.set()  # the first heartbeat with status running, now
        if cancel:
            self.begin_cancel()

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

    # Whether the server takes log frames (worker/jobs/{id}/log-frames); False after it answered 404.
    log_frames = True
    log_meter: log_delivery.Throughput | None = None  # this job's MB/s line, made at its first post
    log_cuts: frozenset = frozenset()  # (stream, offset) where a chunk in flight before a restart began or ended

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

    def _cancel(self) -> None:
        try:
            state = self.on_target(lambda c: self.remote(c).cancel(grace=self.config.cancel_grace), "stopping the job")
            log.info("job %s: stopped (%s)", self.id, state.get("status"))
        except (Stopping, LeaseRejected):
            pass
        except Exception:
            log.exception("job %s: stopping the job failed", self.id)
            with self._lock:
                self._cancel_thread = None
        finally:
            self.api.close()


# -- cluster jobs (docs/cluster-jobs.md, "What the agent does") ------------------------------------

def is_cluster(job: dict) -> bool:
    """A job of more than one replica (a cluster job of size 1 is an ordinary job)."""
    return int(job.get("cluster_size") or 1) > 1 and bool(job.get("replicas"))


def is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def target_fact(connection, python: str, *args: str) -> str:
    """worker_agent/target/net.py on the target (`free-port`, `resolve NAME…`); StartFailed when it fails."""
    try:
        return net_fact(connection, python, *args)
    except RemoteFileError as exc:
        raise StartFailed(exc.message) from None


def computer_key(computer: dict) -> str:
    """One authorized_keys file: a computer's id, or its user, host and port."""
    if computer.get("id") is not None:
        return str(computer["id"])
    return f"{computer.get('ssh_user')}@{computer.get('host')}:{computer.get('port') or 22}"


def revoke_key(pool: ConnectionPool, computer: dict, tag: str, stop: threading.Event, *, job_id,
               attempts: int = 3) -> bool:
    """A job's authorized_keys line off one computer, a few tries; False when it could not be done."""
    error = ""
    for attempt in range(attempts):
        if stop.is_set():
            return False
        try:
            connection = pool.get(Target.from_api(computer))
            answer = replica_ssh.edit(connection, str(computer.get("python_path") or "python3"),
                                      replica_ssh.revoke_op([tag]))
            log.info("job %s: the job's SSH key is removed from %s (%d line%s)", job_id, computer.get("name"),
                     answer["removed"], "" if answer["removed"] == 1 else "s")
            return True
        except replica_ssh.ReplicaSshError as exc:
            error = exc.message
        except ConnectError as exc:
            error = exc.detail
        except TRANSIENT as exc:
            error = f"{type(exc).__name__}: {exc}"
        stop.wait(min(5.0, 0.5 * 2 ** attempt))
    log.warning("job %s: the job's SSH key could not be removed from %s (%s); it expires there on its own, or "
                "goes when this worker next runs a cluster job there", job_id, computer.get("name"), mask_tokens(error))
    return False


class ReplicaRunner(JobRunner):
    """One replica of a cluster job: JobRunner's per-computer steps (prepare, start, follow, stop and,
    for main1, the outputs) on the replica's computer, in its workspace `<jobId>-<replica>`, with its
    own log offsets in `record["replicas"][name]`. The lease, the API, the journal and the checks for
    a worker stop or a lost lease are the job's (ClusterRunner); a replica has no threads of its own.
    JobRunner.__init__ is not called: it would start threads and claim the job's record.
    Its supervisor prepares and then holds the process until the job releases every replica at once."""

    HOLD_START = True

    def __init__(self, parent: ClusterRunner, replica: dict):  # JobRunner.__init__ deliberately not called
        self.parent = parent
        self.manager, self.api, self.config = parent.manager, parent.api, parent.config
        self.id, self.lease = parent.id, parent.lease
        self.replica = dict(replica)
        self.name = self.replica_name = str(replica["name"])
        self.computer = dict(replica.get("computer") or {})
        self.gpu_ids = [str(g) for g in replica.get("gpu_ids") or []]
        self.job = dict(parent.job, computer=self.computer, gpu_ids=self.gpu_ids)
        self.python = str(self.computer.get("python_path") or "python3")
        self.working_dir = str(self.computer.get("working_dir") or "").rstrip("/")
        self.workspace_id = f"{self.id}-{self.name}"
        self.job_dir = workspace(self.working_dir, self.workspace_id) if self.working_dir.startswith("/") else ""
        self.record = parent.record["replicas"][self.name]
        self.stop = parent.stop
        self.started = bool(self.record.get("started"))
        self.abort = threading.Event()  # the job stops following its replicas (it failed elsewhere)
        self.inputs_pinned = False  # its input versions are in its computer's cache, pinned for the job
        self._lock = threading.Lock()
        # Telemetry (JobManager.telemetry_loop): its own probe on its own computer, its metrics named
        # system/<replica>/… on the job, until the job is done or this replica has ended.
        self.done = parent.done
        self.telemetry_step = 0
        self.sampled_at = float("-inf")
        self.gpu_sampler: threading.Thread | None = None
        self.metric_prefix = gpu_remote.replica_prefix(self.name)
        self.outside_gpus: set[str] = set()

    @property
    def rejected(self) -> str | None:
        return self.parent.rejected

    def check(self) -> None:
        self.parent.check()
        if self.abort.is_set():
            raise Stopping()

    def save(self, *, durable: bool = True, **changes) -> None:
        self.parent.save_replica(self.name, durable=durable, **changes)

    def cluster_spec(self) -> dict:
        return self.parent.cluster_spec_of(self)

    def spec(self) -> dict:
        return self.parent.replica_spec(self, super().spec())

    def stop_now(self) -> dict:
        return self.on_target(lambda c: self.remote(c).cancel(grace=self.config.cancel_grace), f"stopping {self.name}")

    def report_cache_usage(self, usage: dict) -> None:
        # The server files the report under the job's computer (main1's); another computer's numbers
        # would overwrite it there.
        if self.computer.get("id") == self.parent.computer.get("id"):
            super().report_cache_usage(usage)


class ClusterRunner(JobRunner):
    """A cluster job: every replica prepared, then all started; followed together; the job ends with
    main1, or with the first sub that fails (the others are then stopped); a stop request stops them
    all. The decision is journaled (`record["cluster"]["decision"]`) with the master port and the
    hosts file, so a restarted worker re-attaches to every replica and decides the same way."""

    def __init__(self, manager: JobManager, record: dict):
        super().__init__(manager, record)
        replicas = sorted(self.job["replicas"], key=lambda r: int(r["index"]))
        states = record.setdefault("replicas", {})
        for replica in replicas:
            states.setdefault(str(replica["name"]), {"offsets": {"stdout": 0, "stderr": 0}, "pending": [],
                                                     "final": None, "started": False})
        record.setdefault("cluster", {})
        self.replicas = [ReplicaRunner(self, replica) for replica in replicas]
        self.main = self.replicas[0]
        # Nothing of a cluster job lives in `<working_dir>/.mmt/jobs/<jobId>`: its outputs are main1's.
        self.workspace_id, self.job_dir = self.main.workspace_id, self.main.job_dir

    def save_replica(self, name: str, *, durable: bool = True, **changes) -> None:
        with self._record_lock:
            self.record["replicas"][name].update(changes)
            self.record["updated_at"] = now_iso()
            if not self._forgotten:
                self.manager.journal.save(self.record, durable=durable)

    def replica(self, name: str) -> ReplicaRunner:
        return next(r for r in self.replicas if r.name == name)

    # -- start -----------------------------------------------------------------------------------

    def ensure_started(self) -> None:
        for replica in self.replicas:
            if not replica.job_dir:
                return self.start_failed(replica, f"The computer {replica.computer.get('name')} has no working "
                                                  "directory (an absolute path on the target): set one in its "
                                                  "settings.")
        states = {}
        for replica in self.replicas:
            try:
                states[replica.name] = replica.on_target(
                    lambda c, r=replica: r.remote(c).poll(facts=r.facts_binary),
                    f"asking the supervisor of {replica.name} for its state")
                replica.keep_facts(states[replica.name])
            except SupervisorError as exc:
                message = f"The replica's workspace cannot be used ({exc.code}): {exc.message}"
                if not self.started:
                    return self.start_failed(replica, message, present=states)
                replica.save(final={"status": "refused", "error": message})
                states[replica.name] = {"status": "refused"}
            except StartFailed as exc:
                return self.start_failed(replica, exc.message, reason=exc.reason, present=states)
        present = {name for name, state in states.items() if state.get("status") != "absent"}
        fresh = [r for r in self.replicas if r.name not in present]
        if fresh and self.started:
            for replica in fresh:  # it ran before, and its workspace is gone: it is never started twice
                if replica.record.get("final") is None:
                    replica.save(final={"status": "absent", "error": "The replica's workspace on its computer "
                                                                     "disappeared."})
            fresh = []
        if fresh and self.cancel_requested:
            log.info("job %s: stop requested before its replicas started; not starting them", self.id)
            self.stop_replicas([r for r in self.replicas if r.name in present])
            self.save(completion={"status": "canceled", "end_reason": "canceled"})
            return None
        if fresh and not self.start_replicas(fresh, present):
            return None
        for replica in self.replicas:
            state = states.get(replica.name) or {}
            if state.get("status") == "unknown" and state.get("recoverable"):
                log.info("job %s: the supervisor of %s is gone before it ran; a new one takes over", self.id,
                         replica.name)
                replica.start_supervisor(replica.spec())
            elif replica.name in present:
                log.info("job %s: %s re-attached (status %s)", self.id, replica.name, state.get("status"))
            if not replica.started:
                replica.started = True
                replica.save(started=True)
        if not self.record["cluster"].get("decision") and not self.release_replicas():
            return None
        self.mark_started()
        return None

    def start_replicas(self, fresh: list[ReplicaRunner], present: set[str]) -> bool:
        """Prepare every replica first, then start them all; False when the job ended instead."""
        try:
            self.ensure_cluster_facts()
            self.ensure_replica_ssh()
        except StartFailed as exc:
            self.start_failed(self.main, exc.message, reason=exc.reason, present=present)
            return False
        specs = {}
        for replica in fresh:
            try:
                specs[replica.name] = replica.prepare()
            except StartFailed as exc:
                self.start_failed(replica, exc.message, reason=exc.reason, present=present)
                return False
        if not self.record.get("running_reported"):  # after the `running` heartbeat it can no longer go back
            try:
                self.wait_for_free_gpus()
            except StartFailed as exc:
                self.start_failed(getattr(exc, "unit", None) or self.main, exc.message, reason=exc.reason,
                                  present=present)
                return False
        with self._lock:
            if self.cancel_requested:
                self.stop_replicas([r for r in self.replicas if r.name in present])
                self.save(completion={"status": "canceled", "end_reason": "canceled"})
                return False
        self.confirm_start()  # the lease is still ours, and the job never returns to the queue now
        started = set(present)
        for replica in fresh:
            try:
                answer = replica.start_supervisor(specs[replica.name])
            except StartFailed as exc:
                self.start_failed(replica, exc.message, reason=exc.reason, present=started)
                return False
            started.add(replica.name)
            replica.started = True
            replica.save(started=True)
            log.info("job %s: %s started on %s (GPUs %s, supervisor pid %s)", self.id, replica.name,
                     replica.computer.get("name"), ",".join(replica.gpu_ids) or "none",
                     (answer.get("supervisor") or {}).get("pid"))
        return True

    def busy_checks(self) -> list[tuple[JobRunner, float, str]]:
        """Every replica with GPUs, on its own computer with that computer's wait (0 there: not looked at)."""
        checks = []
        for replica in self.replicas:
            limit, source = gpu_remote.busy_wait_for(replica.computer, self.manager.gpu_busy_wait)
            if replica.gpu_ids and limit > 0:
                checks.append((replica, limit, source))
        return checks

    def give_back(self, reason: str) -> None:
        """As JobRunner.give_back, and first what the job set up on the replicas' computers: their input
        pins and the job's SSH key (nothing of it may outlast the claim)."""
        self.release_replica_inputs()
        self.revoke_replica_ssh()
        super().give_back(reason)

    def telemetry_units(self) -> list[JobRunner]:
        return [r for r in self.replicas if r.started]

    def release_replicas(self) -> bool:
        """Start every replica's process together (docs/cluster-jobs.md, step 1): each supervisor prepares
        its replica (venv, container) and holds; once every replica holds (or is past that, after a
        restart), all are released at once. Without this the replica prepared first would run alone
        for as long as the others prepare: a sub that fails at once got the others stopped before
        their processes existed. False when the job ended instead (a replica could not be prepared, or
        a stop request came)."""
        rounds = 0
        said = None
        while True:
            self.check()
            with self._lock:
                canceled = self.cancel_requested
            if canceled:
                log.info("job %s: stop requested while its replicas were being prepared; stopping them", self.id)
                self.stop_replicas(self.replicas)
                self.save(completion={"status": "canceled", "end_reason": "canceled"})
                return False
            held, preparing = [], []
            for replica in self.replicas:
                try:
                    state = replica.on_target(lambda c, r=replica: r.remote(c).poll(),
                                              f"asking the supervisor of {replica.name} whether it is prepared")
                except SupervisorError as exc:
                    message = f"The replica's workspace cannot be used ({exc.code}): {exc.message}"
                    self.start_failed(replica, message, present=[r.name for r in self.replicas])
                    return False
                except StartFailed as exc:
                    self.start_failed(replica, exc.message, reason=exc.reason, present=[r.name for r in self.replicas])
                    return False
                status = state.get("status")
                if state.get("pid") or status == "running":
                    continue  # its process runs or ran: released before (a restarted worker)
                if status == "starting":
                    (held if state.get("held") else preparing).append(replica)
                elif status == "unknown" and state.get("recoverable"):
                    log.info("job %s: the supervisor of %s ended while preparing; a new one takes over", self.id,
                             replica.name)
                    try:
                        replica.start_supervisor(replica.spec())
                    except StartFailed as exc:
                        self.start_failed(replica, exc.message, reason=exc.reason,
                                          present=[r.name for r in self.replicas])
                        return False
                    preparing.append(replica)
                else:  # failed_to_start (venv, requirements, docker create), canceled there, or gone
                    error = state.get("error") or {
                        "absent": "Its workspace on its computer disappeared before it started.",
                        "canceled": "It was stopped on its computer before it started."}.get(
                        status, f"Its supervisor says {status} before it started.")
                    self.start_failed(replica, error, present=[r.name for r in self.replicas])
                    return False
            if not preparing:
                break
            names = ", ".join(r.name for r in preparing)
            if names != said:
                log.info("job %s: waiting for %s to be prepared (%d of %d replicas are)", self.id, names,
                         len(self.replicas) - len(preparing), len(self.replicas))
                said = names
            rounds += 1
            self.pause(min(5.0, 0.5 + 0.25 * rounds))
        failed = self.release_all(held) if held else None
        if failed is not None:
            replica, exc = failed
            self.start_failed(replica, f"Its supervisor refused to start it ({exc.code}): {exc.message}",
                              present=[r.name for r in self.replicas])
            return False
        return True

    def release_all(self, replicas: list[ReplicaRunner]) -> tuple[ReplicaRunner, SupervisorError] | None:
        """`release` to every held replica at the same moment (each on its own computer); the first
        replica whose supervisor refused, with its error, or None."""
        errors: dict[str, BaseException] = {}

        def release(replica: ReplicaRunner) -> None:
            try:
                replica.on_target(lambda c: replica.remote(c).release(), f"starting {replica.name}")
            except BaseException as exc:  # noqa: BLE001  (raised on the job's thread below)
                errors[replica.name] = exc
            finally:
                replica.api.close()

        threads = [threading.Thread(target=release, args=(r,), name=f"job-{self.id}-release-{r.name}", daemon=True)
                   for r in replicas]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for replica in replicas:  # a worker stop or a lost lease first: they leave the job as it is
            exc = errors.get(replica.name)
            if exc is not None and not isinstance(exc, SupervisorError):
                raise exc
        for replica in replicas:
            exc = errors.get(replica.name)
            if exc is not None:
                return replica, exc
        log.info("job %s: every replica is prepared; started %s", self.id, ", ".join(r.name for r in replicas))
        return None

    def start_failed(self, replica: ReplicaRunner, message: str, *, reason: str = "start_failed", present=()) -> None:
        """One replica cannot start: those started are stopped, and the job fails naming the replica."""
        log.warning("job %s: %s could not start: %s", self.id, replica.name, message)
        if isinstance(present, dict):  # poll answers so far: those with a workspace may run
            present = {name for name, state in present.items() if state.get("status") != "absent"}
        self.stop_replicas([r for r in self.replicas if r.name in set(present) and r is not replica])
        self.release_replica_inputs()
        error = mask_tokens(f"{replica.name}: {message}", self.job.get("job_token") or "")
        self.save(completion={"status": "failed", "end_reason": reason, "replica": replica.name,
                              "error": error})

    def release_replica_inputs(self) -> None:
        """The job will not run: the input pins on each computer that got its inputs go now. A computer
        where no replica's supervisor started would otherwise hold them for hours."""
        done = set()
        for replica in self.replicas:
            where = (replica.computer.get("id"), replica.working_dir)
            if replica.inputs_pinned and where not in done:
                done.add(where)
                replica.release_inputs()

    def ensure_cluster_facts(self) -> dict:
        """MASTER_PORT (a free port on main1's computer) and every replica's hosts file, chosen once and
        journaled: a restarted worker must hand the supervisors the very same spec."""
        facts = self.record.get("cluster") or {}
        if facts.get("master_port") and facts.get("hosts"):
            return facts
        main = self.main
        port = main.on_target(lambda c: target_fact(c, main.python, "free-port"),
                              "choosing MASTER_PORT on main1's computer")
        hosts = {replica.name: self.hosts_of(replica) for replica in self.replicas}
        self.save(cluster=dict(facts, master_port=int(port), hosts=hosts))
        log.info("job %s: %d replicas, MASTER_PORT %s on %s", self.id, len(self.replicas), port,
                 main.computer.get("name"))
        return self.record["cluster"]

    def hosts_of(self, replica: ReplicaRunner) -> dict[str, str]:
        """Replica name → address as `replica` reaches it: loopback on its own computer, else the
        computer's host, resolved on the replica's computer where it is a name."""
        wanted = {other.name: jobenv.LOOPBACK if jobenv.same_computer(replica.computer, other.computer)
                  else jobenv.computer_address(other.computer) for other in self.replicas}
        names = sorted({address for address in wanted.values() if not is_ip(address)})
        if names:
            text = replica.on_target(lambda c: target_fact(c, replica.python, "resolve", *names),
                                     f"resolving the other computers' names on {replica.name}'s computer")
            resolved = json.loads(text.splitlines()[-1])
            wanted = {name: str(resolved.get(address, address)) for name, address in wanted.items()}
        return wanted

    def cluster_spec_of(self, replica: ReplicaRunner) -> dict:
        facts = self.record["cluster"]
        replicas = [r.replica for r in self.replicas]
        env = jobenv.cluster_environment(replica=replica.replica, replicas=replicas,
                                         mode=str(self.job.get("cluster_mode") or "single-node"),
                                         main_addr=jobenv.main_address(replica.replica, replicas),
                                         master_port=int(facts["master_port"]))
        runtime = str(self.job.get("runtime") or "python")
        inputs = jobenv.container_locations().inputs_dir if runtime in ("docker", *CONTAINER_RUNTIMES) else \
            jobenv.host_locations(replica.job_dir).inputs_dir
        env.update(jobenv.cluster_file_variables(inputs))
        if (facts.get("ssh") or {}).get("enabled"):
            env["MMT_CLUSTER_SSH_CONFIG"] = f"{replica.job_dir}/{replica_ssh.CONFIG_PATH}"
        return {"name": replica.name, "env": env, "hosts": facts["hosts"][replica.name]}

    def replica_spec(self, replica: ReplicaRunner, spec: dict) -> dict:
        """build_spec's spec plus the launchers' files: the hostfiles (every runtime) and, where the job
        has SSH between its replicas, the replica's `ssh/` with `ssh/bin` first on PATH."""
        replicas = [r.replica for r in self.replicas]
        files = [{"path": f"inputs/{jobenv.CLUSTER_HOSTFILE}", "content": jobenv.hostfile_text(replicas),
                  "mode": 0o644},
                 {"path": f"inputs/{jobenv.CLUSTER_NODEFILE}", "content": jobenv.nodefile_text(replicas),
                  "mode": 0o644}]
        ssh = self.record["cluster"].get("ssh") or {}
        if ssh.get("enabled"):
            files += replica_ssh.replica_files(job_dir=replica.job_dir, peers=ssh["peers"],
                                               known_hosts=ssh["known_hosts"], private_key=ssh["private"])
            spec["path_prepend"] = [f"{replica.job_dir}/{replica_ssh.BIN_DIR}", *(spec.get("path_prepend") or [])]
        spec["files"] = [*spec["files"], *files]
        spec["spec_hash"] = spec_hash(spec)
        return spec

    # -- ssh between the replicas (worker_agent/replica_ssh.py) ------------------------------------

    def ensure_replica_ssh(self) -> None:
        """The job's key pair (journaled before any computer is touched, so its lines are always found
        again), then its public key authorized on every replica's computer. Where that cannot be done
        (another runtime, a Local computer, no trusted host key, an authorized_keys the SSH user cannot
        write) the job runs without SSH between its replicas, as cluster jobs did before: the
        torch.distributed rendezvous does not need it."""
        cluster = self.record["cluster"]
        ssh = dict(cluster.get("ssh") or {})
        if "enabled" not in ssh:
            ssh = self.new_replica_ssh()
            self.save(cluster=dict(cluster, ssh=ssh))
        if not ssh.get("enabled"):
            return
        op = replica_ssh.authorize_op(public_key=ssh["public"], tag=ssh["tag"],
                                      seconds=replica_ssh.key_lifetime(self.job.get("walltime_seconds")),
                                      worker_id=self.config.worker_id, keep=self.manager.active_ids())
        for replica in self.ssh_computers():
            key = computer_key(replica.computer)
            if key not in ssh["authorized"]:
                ssh = dict(ssh, authorized=[*ssh["authorized"], key])
                self.save(cluster=dict(self.record["cluster"], ssh=ssh))
            try:
                answer = replica.on_target(lambda c, r=replica: replica_ssh.edit(c, r.python, op),
                                           f"authorizing the job's SSH key on {replica.computer.get('name')}")
            except replica_ssh.ReplicaSshError as exc:
                reason = (f"the SSH user's ~/.ssh/authorized_keys on {replica.computer.get('name')} cannot be "
                          f"changed: {exc.message}")
                log.warning("job %s: no ssh between its replicas: %s", self.id, reason)
                self.revoke_replica_ssh()
                self.save(cluster=dict(self.record["cluster"], ssh=dict(self.record["cluster"]["ssh"], enabled=False,
                                                                        reason=reason)))
                return
            log.info("job %s: the job's SSH key is authorized on %s (%s)%s", self.id, replica.computer.get("name"),
                     answer.get("path"), f", expiring {answer['expiry']}" if answer.get("expiry") else
                     " without expiry-time (OpenSSH older than 8.2 there)")

    def new_replica_ssh(self) -> dict:
        replicas = [r.replica for r in self.replicas]
        reason = replica_ssh.unsupported(self.job)
        if reason is None:
            tag = authorized_keys.job_tag(self.id, self.config.worker_id)
            try:
                peers = replica_ssh.peers(replicas)
                known_hosts = replica_ssh.known_hosts_text(replicas)
                for replica in self.replicas:  # every workspace path fits into an ssh_config
                    replica_ssh.replica_files(job_dir=replica.job_dir, peers=peers, known_hosts=known_hosts,
                                              private_key="")
            except replica_ssh.ReplicaSshError as exc:
                reason = exc.message
            else:
                pair = replica_ssh.new_key_pair(tag)
                return {"enabled": True, "tag": tag, "private": pair["private"], "public": pair["public"],
                        "peers": peers, "known_hosts": known_hosts, "authorized": [], "revoked": []}
        log.info("job %s: no ssh between its replicas: %s", self.id, reason)
        return {"enabled": False, "reason": reason}

    def ssh_computers(self) -> list[ReplicaRunner]:
        """The first replica on each computer: one authorized_keys edit per computer."""
        seen, firsts = set(), []
        for replica in self.replicas:
            key = computer_key(replica.computer)
            if key not in seen:
                seen.add(key)
                firsts.append(replica)
        return firsts

    def revoke_replica_ssh(self) -> None:
        """The job's key off every computer that authorized it (once; journaled per computer). A computer
        that cannot be reached now keeps the line until its expiry time or this worker's next sweep there."""
        ssh = self.record["cluster"].get("ssh") or {}
        wanted = [r for r in self.ssh_computers()
                  if computer_key(r.computer) in set(ssh.get("authorized") or [])
                  and computer_key(r.computer) not in set(ssh.get("revoked") or [])]
        for replica in wanted:
            if revoke_key(self.manager.pool, replica.computer, ssh["tag"], self.stop, job_id=self.id):
                ssh = self.record["cluster"]["ssh"]
                self.save(cluster=dict(self.record["cluster"], ssh=dict(
                    ssh, revoked=[*(ssh.get("revoked") or []), computer_key(replica.computer)])))

    def deliver(self) -> bool:
        # Every replica has ended (or never started) once there is a completion: the key goes first.
        self.revoke_replica_ssh()
        return super().deliver()

    def drop(self, why: str) -> None:
        try:
            self.revoke_replica_ssh()
        except Exception:  # the job is no longer ours either way; its lines expire on their own
            log.exception("job %s: removing the job's SSH key failed", self.id)
        super().drop(why)

    # -- follow and decide -------------------------------------------------------------------------

    def follow(self) -> dict:
        """Follow every replica until all have ended; the decision: main1 ended first, a sub failed,
        or the walltime."""
        running = [r for r in self.replicas if r.record.get("final") is None]
        events: queue.Queue = queue.Queue()
        threads = []
        for replica in running:
            replica.abort.clear()
            thread = threading.Thread(target=self._follow_replica, args=(replica, events),
                                      name=f"job-{self.id}-{replica.name}", daemon=True)
            thread.start()
            threads.append(thread)
        try:
            for replica in self.replicas:  # ended before a restart: decided in the same order again
                if replica.record.get("final") is not None:
                    self.decide(replica)
            if self.record["cluster"].get("decision") and running:
                self.stop_replicas(running, wait=False)
            left = len(running)
            while left:
                try:
                    replica, outcome = events.get(timeout=0.5)
                except queue.Empty:
                    self.check()
                    continue
                if isinstance(outcome, BaseException):
                    raise outcome
                left -= 1
                replica.save(final=outcome)
                self.decide(replica)
        finally:
            for replica in self.replicas:
                replica.abort.set()
            for thread in threads:
                thread.join(timeout=10)
                if thread.is_alive():
                    log.warning("job %s: %s still follows a replica after the job's follow ended", self.id, thread.name)
            for replica in self.replicas:  # the job goes on with main1 (outputs) and the stops
                replica.abort.clear()
        return dict(self.record["cluster"]["decision"])

    @staticmethod
    def _follow_replica(replica: ReplicaRunner, events: queue.Queue) -> None:
        try:
            events.put((replica, replica.follow()))
        except BaseException as exc:  # noqa: BLE001  (handed to the job's thread, which decides)
            events.put((replica, exc))
        finally:
            replica.api.close()

    def decide(self, replica: ReplicaRunner) -> None:
        cluster = self.record["cluster"]
        if cluster.get("decision"):
            return
        final = replica.record["final"] or {}
        status = final.get("status")
        if replica is self.main:
            decision = {"kind": "main"}
        elif self.cancel_requested:
            return  # every replica is being stopped; main1's end is the job's
        elif status == "exited" and final.get("exit_code") == 0:
            log.info("job %s: %s is done (exit code 0); waiting for main1", self.id, replica.name)
            return
        elif status == "timed_out":
            decision = {"kind": "timed_out"}
        else:
            decision = {"kind": "replica_failed", "replica": replica.name}
        self.save(cluster=dict(cluster, decision=decision))
        others = [r for r in self.replicas if r.record.get("final") is None]
        log.info("job %s: %s ended (%s); stopping %s", self.id, replica.name, status,
                 ", ".join(r.name for r in others) or "nothing: all have ended")
        self.stop_replicas(others, wait=False)

    def conclude(self, final: dict) -> dict:
        kind = final.get("kind")
        if kind == "main":
            completion = self.main.conclude(self.main.record.get("final") or {})
            if completion["status"] != "canceled" and completion.get("end_reason") != "timed_out":
                completion["replica"] = self.main.name
            return completion
        if kind == "timed_out":
            return {"status": "failed", "end_reason": "timed_out",
                    "error": f"The walltime of {self.job.get('walltime_seconds')} s was reached; every replica "
                             "was stopped."}
        return self.replica_failure(self.replica(str(final.get("replica"))))

    def replica_failure(self, replica: ReplicaRunner) -> dict:
        final = replica.record.get("final") or {}
        name, code, sig = replica.name, final.get("exit_code"), final.get("signal")
        completion = {"status": "failed", "end_reason": "replica_failed", "replica": name}
        if final.get("status") == "exited" and code is not None:
            return dict(completion, exit_code=int(code), error=f"{name} exited with code {code}")
        if final.get("status") == "exited" and sig:
            return dict(completion, error=f"{name} was killed by {signal_name(sig)}.")
        if final.get("status") == "canceled":
            return dict(completion, error=f"{name} was stopped on its computer.")
        return dict(completion, error=f"{name}: {replica.conclude(final).get('error')}")

    # -- stop ----------------------------------------------------------------------------------------

    def stop_replicas(self, replicas: list[ReplicaRunner], *, wait: bool = True) -> None:
        """SIGTERM to each, SIGKILL after the grace, all at once (each on its own computer)."""
        threads = [threading.Thread(target=self._stop_replica, args=(r,), name=f"job-{self.id}-stop-{r.name}",
                                    daemon=True) for r in replicas]
        for thread in threads:
            thread.start()
        if wait:
            for thread in threads:
                thread.join()

    def _stop_replica(self, replica: ReplicaRunner) -> None:
        try:
            state = replica.stop_now()
            log.info("job %s: %s stopped (%s)", self.id, replica.name, state.get("status"))
        except (Stopping, LeaseRejected):
            pass
        except (SupervisorError, StartFailed) as exc:
            log.warning("job %s: %s could not be stopped: %s", self.id, replica.name, getattr(exc, "message", exc))
        except Exception:
            log.exception("job %s: stopping %s failed", self.id, replica.name)
        finally:
            replica.api.close()

    def _cancel(self) -> None:
        try:
            self.stop_replicas(self.replicas)
        finally:
            self.api.close()


class JobManager:
    """The claim loop and the runners of one worker."""

    def __init__(self, config: WorkerConfig, api: ApiClient, pool: ConnectionPool, stop_event: threading.Event, *,
                 journal: JobJournal | None = None, telemetry: GpuTelemetry | None = None, on_fatal=None):
        self.config = config
        self.api = api
        self.pool = pool
        self.stop_event = stop_event
        self.journal = journal or JobJournal(config.state_dir)
        self.telemetry = telemetry or GpuTelemetry()
        self.gpu_busy_wait = gpu_remote.busy_wait_seconds()
        self.on_fatal = on_fatal or (lambda exc: stop_event.set())
        self.runners: dict[int, JobRunner] = {}
        self.cond = threading.Condition()
        self.backoff = Backoff(base=1.0, cap=30.0)
        self.recovered = threading.Event()

    # -- runners -------------------------------------------------------------------------------

    def active_ids(self) -> list[int]:
        with self.cond:
            return sorted(self.runners)

    def run_job(self, record: dict) -> JobRunner:
        runner = ClusterRunner(self, record) if is_cluster(record["job"]) else JobRunner(self, record)
        with self.cond:
            self.runners[runner.id] = runner
        runner.start()
        return runner

    def accept(self, item: dict) -> JobRunner | None:
        """A job the server handed this worker (claim or resume) that it does not run yet."""
        if not item.get("job_token"):
            log.warning("job %s came back without a job token; asking the server again", item.get("id"))
            return None
        record = new_record(item)
        self.journal.save(record)  # before anything touches the target
        log.info("claimed job %s (%s runtime on %s, GPUs %s)", item["id"], item.get("runtime"),
                 (item.get("computer") or {}).get("name"), ",".join(map(str, item.get("gpu_ids") or [])) or "none")
        return self.run_job(record)

    def runner_ended(self, runner: JobRunner) -> None:
        with self.cond:
            if self.runners.get(runner.id) is runner and (runner.finished or not self.stop_event.is_set()):
                del self.runners[runner.id]
            self.cond.notify_all()

    # -- recovery ------------------------------------------------------------------------------

    def _resume(self, active: list[int]) -> list[dict]:
        """`worker/resume` until it answers (FatalApiError raises)."""
        failures = 0
        while not self.stop_event.is_set():
            try:
                return self.api.resume_jobs(self.config.worker_id, active)
            except FatalApiError:
                raise
            except ApiError as exc:
                failures += 1
                log.warning("resume not answered yet: %s", exc)
                self.stop_event.wait(self.backoff.delay(failures))
        raise Stopping()

    def recover(self) -> None:
        """The journal plus `worker/resume`: re-attach every job this worker still holds."""
        self.journal.ensure()
        records = self.journal.load_all()
        items = self._resume(sorted(records))
        held = {int(item["id"]): item for item in items}
        for job_id, record in sorted(records.items()):
            item = held.pop(job_id, None)
            if item is None:
                log.info("job %s is no longer held by this worker on the server; forgetting it", job_id)
                self.revoke_forgotten(record)
                self.journal.remove(job_id)
                continue
            if str(item.get("lease_id")) != record["lease_id"]:
                log.warning("job %s has a new lease on the server; the old record is dropped", job_id)
                self.journal.remove(job_id)
                held[job_id] = dict(item, job_token=None)
                continue
            record["job"]["cancel_requested"] = bool(item.get("cancel_requested"))
            log.info("resuming job %s (step %s, logs delivered up to stdout %d, stderr %d)", job_id, record["step"],
                     record["offsets"]["stdout"], record["offsets"]["stderr"])
            self.run_job(record)
        if any(not item.get("job_token") for item in held.values()):
            # Listed by mistake as active above: ask again without them for a fresh token each.
            fresh = {int(i["id"]): i for i in self._resume(self.active_ids())}
            held = {job_id: fresh.get(job_id, item) for job_id, item in held.items()}
        for item in held.values():
            log.info("job %s is held by this worker but was not journaled (a claim answer was lost); running it",
                     item["id"])
            self.accept(item)
        self.recovered.set()

    def revoke_forgotten(self, record: dict) -> None:
        """A cluster job that ended while this worker was gone: its SSH key off the computers that
        authorized it, on a thread of its own (a computer that is down must not hold up the others)."""
        ssh = (record.get("cluster") or {}).get("ssh") or {}
        left = set(ssh.get("authorized") or []) - set(ssh.get("revoked") or [])
        computers = {computer_key(c): c
                     for c in ((r.get("computer") or {}) for r in record["job"].get("replicas") or [])}
        targets = [computers[k] for k in sorted(left) if k in computers]
        if not targets or not ssh.get("tag"):
            return

        def revoke() -> None:
            for computer in targets:
                revoke_key(self.pool, computer, ssh["tag"], self.stop_event, job_id=record["job_id"])

        threading.Thread(target=revoke, name=f"job-{record['job_id']}-revoke", daemon=True).start()

    def resume_after_error(self) -> None:
        """After a claim failed on the network: take over whatever the server gave us meanwhile."""
        for item in self._resume(self.active_ids()):
            if int(item["id"]) not in self.active_ids():
                log.info("job %s was claimed although the claim's answer was lost; running it", item["id"])
                self.accept(item)

    # -- threads -------------------------------------------------------------------------------

    def claim_loop(self) -> None:
        failures = unknown = 0
        try:
            _ = self.telemetry.available  # says once, now, why GPU telemetry is off (if it is)
            self.recover()
            while not self.stop_event.is_set():
                with self.cond:
                    while len(self.runners) >= self.config.parallel_jobs and not self.stop_event.is_set():
                        self.cond.wait(1.0)
                if self.stop_event.is_set():
                    return
                try:
                    active = self.active_ids()
                    item, answer = self.api.claim_job(self.config.worker_id, active, self.config.claim_wait)
                    failures = unknown = 0
                except FatalApiError as exc:
                    self.on_fatal(exc)
                    return
                except ApiUnavailable as exc:
                    failures += 1
                    log.warning("job claim failed (%s): asking the server what this worker holds instead of "
                                "claiming again", exc)
                    self.stop_event.wait(self.backoff.delay(failures))
                    self.resume_after_error()
                    continue
                except ApiError as exc:
                    if exc.code == "unknown_active_jobs":
                        # A runner holds a job the server no longer gives us: its next heartbeat drops it.
                        # Until then, claim slowly.
                        unknown += 1
                        self.stop_event.wait(min(1.0, 0.05 * unknown))
                        continue
                    failures += 1
                    log.warning("job claim refused: %s", exc)
                    self.stop_event.wait(self.backoff.delay(failures))
                    continue
                if item is None and answer.get("reason") == "active_jobs_ended":
                    # The wake-up: a job ended during the long-poll. Claim again once its runner is gone.
                    self.wait_runners_gone(set(answer.get("ended_job_ids") or active))
                    continue
                if item is not None:
                    self.accept(item)
        except Stopping:
            return
        except FatalApiError as exc:
            self.on_fatal(exc)
        except Exception:
            log.exception("the job claim loop failed")
            self.on_fatal(FatalApiError("The job claim loop failed unexpectedly; see the log above."))

    def wait_runners_gone(self, job_ids: set, timeout: float = 1.0) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.stop_event.is_set() or not job_ids & set(self.runners), timeout=timeout)

    def telemetry_loop(self) -> None:
        """A sample of each running job's GPUs as soon as it runs, then every INTERVAL_SECONDS: through
        NVML when the job's computer is this machine and NVML works, otherwise with nvidia-smi on the
        computer over its connection (`sample_remote`, one long-lived command per job). A cluster job is
        sampled replica by replica (JobRunner.telemetry_units): one probe on each replica's computer,
        its metrics named system/<replica>/…"""
        while not self.stop_event.wait(1.0):
            now = time.monotonic()
            nvml = self.telemetry.available
            with self.cond:
                running = [r for r in self.runners.values() if r.started and not r.done.is_set()]
            units = [unit for runner in running for unit in runner.telemetry_units()]
            for unit in units:
                # Every job gets the probe, for its process tree's CPU and memory; it asks nvidia-smi too
                # unless the job has no GPUs or NVML reads them here.
                if unit.gpu_sampler is None and unit.record.get("final") is None:
                    unit.gpu_sampler = threading.Thread(
                        target=self.sample_remote, args=(unit,),
                        kwargs={"gpus": bool(unit.gpu_ids) and not (nvml and same_machine(unit.computer))},
                        name=f"job-{unit.id}-probe" + (f"-{unit.replica_name}" if unit.replica_name else ""),
                        daemon=True)
                    unit.gpu_sampler.start()
            due = [u for u in units if u.gpu_ids and nvml and same_machine(u.computer) and u.record.get("final") is None
                   and now - u.sampled_at >= INTERVAL_SECONDS]
            if not due:
                continue
            stamp = now_iso()
            for unit in due:
                unit.sampled_at = now
                values = self.telemetry.sample(unit.gpu_ids)
                if not values:
                    continue
                unit.telemetry_step += 1
                try:
                    self.api.job_metrics(unit.id, self.config.worker_id, unit.lease,
                                         metric_points(values, unit.telemetry_step, stamp, prefix=unit.metric_prefix))
                except ApiError as exc:
                    log.debug("job %s: GPU metrics not delivered: %s", unit.id, exc)

    def sample_remote(self, runner: JobRunner, gpus: bool = True) -> None:
        """The job on its computer while it runs: one probe (gpu_remote.PROBE) printing a line every
        INTERVAL_SECONDS over the connection the worker holds (a Local computer's is a local process),
        started again after the connection breaks: the CPU and memory of the job's process group (its
        pgid from the supervisor's state.json) and, with `gpus`, its GPUs from nvidia-smi. GPUs that
        cannot be read (no nvidia-smi, no devices) are said once and not asked again for this job.
        `runner` may be a cluster job's replica: its own computer, workspace and metric names."""
        def over() -> bool:
            return self.stop_event.is_set() or runner.done.is_set() or runner.record.get("final") is not None

        failures = 0
        state_path = f"{runner.job_dir}/state.json" if runner.job_dir else ""
        before: gpu_remote.Group | None = None
        try:
            while not over():
                # The state path on stdin: the probe is the worker's, and nothing of the job's may outlive it
                # under the job's workspace.
                try:
                    connection = self.pool.get(Target.from_api(runner.computer))
                    # StreamStalled (a ConnectionError) when no line came for three intervals and a minute.
                    with gpu_remote.probe_stream(connection, runner.python, INTERVAL_SECONDS, gpus=gpus,
                                                 state_path="-" if state_path else "",
                                                 stdin=f"{state_path}\n".encode() if state_path else b"",
                                                 timeout=3 * INTERVAL_SECONDS + 60) as stream:
                        for line in gpu_remote.read_lines(stream, over):
                            sample = gpu_remote.parse_line(line)
                            if sample.error:
                                log.info("job %s: no GPU telemetry from %s%s: %s", runner.id,
                                         runner.computer.get("name"),
                                         f" ({runner.replica_name})" if runner.replica_name else "", sample.error)
                                gpus = False
                                if not state_path:
                                    return
                            failures = 0
                            self.post_gpu_sample(runner, sample, before)
                            before = sample.group or before
                    if not over():
                        log.info("job %s: the probe on %s ended; starting it again", runner.id,
                                 runner.computer.get("name"))
                except TRANSIENT as exc:
                    log.info("job %s: the probe's stream was interrupted (%s); starting it again", runner.id, exc)
                if over():
                    break
                failures += 1
                self.stop_event.wait(min(60.0, 2.0 * 2 ** min(failures, 5)))
        finally:
            self.api.close()  # this thread's HTTP session

    def post_gpu_sample(self, runner: JobRunner, sample: gpu_remote.Sample,
                        before: gpu_remote.Group | None = None) -> None:
        step, stamp, prefix = runner.telemetry_step + 1, now_iso(), runner.metric_prefix
        points = [*gpu_remote.metric_points(sample, runner.gpu_ids, step, stamp, prefix=prefix),
                  *gpu_remote.host_points(sample.group, before, step, stamp, prefix=prefix)]
        # A Docker job's own processes run as root in their container: a login user who cannot read their
        # environment would count the job's own processes as outside Mado. Not reported for those.
        if str(runner.job.get("runtime") or "python") != "docker":
            outside, runner.outside_gpus = gpu_remote.outside_points(sample, runner.gpu_ids, runner.outside_gpus,
                                                                     step, stamp, prefix=prefix)
            points += outside
        if not points:
            return
        runner.telemetry_step += 1
        try:
            self.api.job_metrics(runner.id, self.config.worker_id, runner.lease, points)
        except ApiError as exc:
            log.debug("job %s: system metrics not delivered: %s", runner.id, exc)

    def start_threads(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.claim_loop, name="jobs", daemon=True),
                   threading.Thread(target=self.telemetry_loop, name="gpu-telemetry", daemon=True)]
        for thread in threads:
            thread.start()
        return threads

    def shutdown(self, timeout: float = 5.0) -> None:
        """The stop event is set: let the runners put their streams down (their jobs keep running)."""
        with self.cond:
            runners = list(self.runners.values())
        deadline = time.monotonic() + timeout
        for runner in runners:
            runner.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        runners = [r for r in runners if not r.finished]
        if runners:
            log.info("left %d job(s) running on their targets: %s", len(runners),
                     ", ".join(str(r.id) for r in runners))

    def run_once(self) -> None:
        """Re-attach what this worker holds, or claim one job; wait until those have ended."""
        self.recover()
        if not self.active_ids():
            try:
                item, _ = self.api.claim_job(self.config.worker_id, [], 0)
            except ApiUnavailable:
                self.resume_after_error()
                item = None
            if item is not None:
                self.accept(item)
        while not self.stop_event.is_set():
            with self.cond:
                if not self.runners:
                    return
                self.cond.wait(1.0)
