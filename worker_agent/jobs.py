"""Jobs on the worker: the claim loop (`JobManager`), which runs one `JobRunner` per job
(worker_agent.job_runner), a `ClusterRunner` per cluster job (worker_agent.cluster_runner).

Claiming. The worker claims while it runs fewer jobs than `parallel_jobs`, with a long-poll, and again
as soon as a job ends (the server ends a waiting claim with 200, no item and reason `active_jobs_ended`
when one of the listed jobs completes). A claim is sent once: after a network error the worker calls
`resume`, which returns every job the server gives this worker (a claim whose answer was lost among
them), never sending the claim again. The server puts a job back in the queue when it was claimed and
never started and 60 s passed without a heartbeat, so a worker confirms its lease with a `running`
heartbeat *before* it starts the job's process: a job is started only under a lease the server still
gives it, and a job the server calls running is never handed to another worker.

SIGTERM to the worker stops the runners where they are and leaves every job running on its target."""
from __future__ import annotations

import logging
import threading
import time

from worker_agent import gpu_remote
from worker_agent.api import ApiClient, ApiError, ApiUnavailable, Backoff, FatalApiError
from worker_agent.cluster_runner import ClusterRunner, is_cluster, revoke_forgotten
from worker_agent.config import WorkerConfig
from worker_agent.job_runner import TRANSIENT, JobRunner, JobTarget, LeasedJob, Stopping, now_iso
from worker_agent.journal import JobJournal
from worker_agent.ssh import ConnectionPool, Target
from worker_agent.telemetry import INTERVAL_SECONDS, GpuTelemetry, metric_points, same_machine

log = logging.getLogger("mado.worker.jobs")


def new_record(item: dict) -> dict:
    job = {k: v for k, v in item.items() if k != "job_token"}
    return {"format": 1, "job_id": int(item["id"]), "lease_id": str(item["lease_id"]),
            "job_token": item.get("job_token"), "job": job, "step": "claimed",
            "offsets": {"stdout": 0, "stderr": 0}, "pending": [], "final": None, "completion": None,
            "running_reported": item.get("status") == "running", "claimed_at": now_iso()}



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
        self.runners: dict[int, LeasedJob] = {}
        self.cond = threading.Condition()
        self.backoff = Backoff(base=1.0, cap=30.0)
        self.recovered = threading.Event()

    # -- runners -------------------------------------------------------------------------------

    def active_ids(self) -> list[int]:
        with self.cond:
            return sorted(self.runners)

    def run_job(self, record: dict) -> LeasedJob:
        runner = ClusterRunner(self, record) if is_cluster(record["job"]) else JobRunner(self, record)
        with self.cond:
            self.runners[runner.id] = runner
        runner.start()
        return runner

    def accept(self, item: dict) -> LeasedJob | None:
        """A job the server handed this worker (claim or resume) that it does not run yet."""
        if not item.get("job_token"):
            log.warning("job %s came back without a job token; asking the server again", item.get("id"))
            return None
        record = new_record(item)
        self.journal.save(record)  # before anything touches the target
        log.info("claimed job %s (%s runtime on %s, GPUs %s)", item["id"], item.get("runtime"),
                 (item.get("computer") or {}).get("name"), ",".join(map(str, item.get("gpu_ids") or [])) or "none")
        return self.run_job(record)

    def runner_ended(self, runner: LeasedJob) -> None:
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
                revoke_forgotten(self.pool, record, self.stop_event)
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
        sampled replica by replica (LeasedJob.telemetry_units): one probe on each replica's computer,
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

    def sample_remote(self, target: JobTarget, gpus: bool = True) -> None:
        """The job on its computer while it runs: one probe (gpu_remote.PROBE) printing a line every
        INTERVAL_SECONDS over the connection the worker holds (a Local computer's is a local process),
        started again after the connection breaks: the CPU and memory of the job's process group (its
        pgid from the supervisor's state.json) and, with `gpus`, its GPUs from nvidia-smi. GPUs that
        cannot be read (no nvidia-smi, no devices) are said once and not asked again for this job.
        `target` may be a cluster job's replica: its own computer, workspace and metric names."""
        def over() -> bool:
            return self.stop_event.is_set() or target.done.is_set() or target.record.get("final") is not None

        failures = 0
        state_path = f"{target.job_dir}/state.json" if target.job_dir else ""
        before: gpu_remote.Group | None = None
        try:
            while not over():
                # The state path on stdin: the probe is the worker's, and nothing of the job's may outlive it
                # under the job's workspace.
                try:
                    connection = self.pool.get(Target.from_api(target.computer))
                    # StreamStalled (a ConnectionError) when no line came for three intervals and a minute.
                    with gpu_remote.probe_stream(connection, target.python, INTERVAL_SECONDS, gpus=gpus,
                                                 state_path="-" if state_path else "",
                                                 stdin=f"{state_path}\n".encode() if state_path else b"",
                                                 timeout=3 * INTERVAL_SECONDS + 60) as stream:
                        for line in gpu_remote.read_lines(stream, over):
                            sample = gpu_remote.parse_line(line)
                            if sample.error:
                                log.info("job %s: no GPU telemetry from %s%s: %s", target.id,
                                         target.computer.get("name"),
                                         f" ({target.replica_name})" if target.replica_name else "", sample.error)
                                gpus = False
                                if not state_path:
                                    return
                            failures = 0
                            self.post_gpu_sample(target, sample, before)
                            before = sample.group or before
                    if not over():
                        log.info("job %s: the probe on %s ended; starting it again", target.id,
                                 target.computer.get("name"))
                except TRANSIENT as exc:
                    log.info("job %s: the probe's stream was interrupted (%s); starting it again", target.id, exc)
                if over():
                    break
                failures += 1
                self.stop_event.wait(min(60.0, 2.0 * 2 ** min(failures, 5)))
        finally:
            self.api.close()  # this thread's HTTP session

    def post_gpu_sample(self, target: JobTarget, sample: gpu_remote.Sample,
                        before: gpu_remote.Group | None = None) -> None:
        step, stamp, prefix = target.telemetry_step + 1, now_iso(), target.metric_prefix
        points = [*gpu_remote.metric_points(sample, target.gpu_ids, step, stamp, prefix=prefix),
                  *gpu_remote.host_points(sample.group, before, step, stamp, prefix=prefix)]
        # A Docker job's own processes run as root in their container: a login user who cannot read their
        # environment would count the job's own processes as outside Mado. Not reported for those.
        if str(target.job.get("runtime") or "python") != "docker":
            outside, target.outside_gpus = gpu_remote.outside_points(sample, target.gpu_ids, target.outside_gpus,
                                                                     step, stamp, prefix=prefix)
            points += outside
        if not points:
            return
        target.telemetry_step += 1
        try:
            self.api.job_metrics(target.id, self.config.worker_id, target.lease, points)
        except ApiError as exc:
            log.debug("job %s: system metrics not delivered: %s", target.id, exc)

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
