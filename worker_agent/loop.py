"""The worker's main loop: presence, connection checks, directory reads and jobs.

Jobs have their own threads (`worker_agent.jobs`: the claim loop and GPU telemetry;
`worker_agent.job_runner` and `worker_agent.cluster_runner`: one runner and one heartbeat thread per job), and so does the GPU watch (`worker_agent.gpu_watch`: one per computer
with registered GPUs that the hello's answer lists). Three more threads here: presence (`worker/hello` at start and
every `hello_interval_seconds`, re-scanning key candidates each time), checks and reads (each a
long-poll claim → handle → complete, so a read queued while the worker waits is answered as soon as
the server wakes the poll). Network trouble is retried with backoff and never stops the worker;
401/403 stop it with a sentence saying which token or scope is wrong. SIGTERM drains: the worker stops
claiming and says `worker/goodbye`, so the server hands its open long-polls nothing more and puts the
jobs it claimed but never started back in the queue for another worker; it exits once the check or
read in hand is reported (at most a grace period); running jobs are left running on their targets and
re-attached on the next start."""
from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable

from worker_agent import __version__
from worker_agent.api import ApiClient, ApiError, ApiUnavailable, Backoff, FatalApiError
from worker_agent.candidates import scan
from worker_agent.config import WorkerConfig
from worker_agent.gpu_watch import CAPABILITY as GPU_WATCH
from worker_agent.gpu_watch import GpuWatch
from worker_agent.jobs import JobManager
from worker_agent.probe import run_check
from worker_agent.reads import ERRORS, read_directory
from worker_agent.ssh import ConnectionPool

log = logging.getLogger("mado.worker")

CAPABILITIES = ["checks", "reads", "key_candidates"]
# Said only by a worker that runs jobs: "cluster_jobs" = it starts every replica of a cluster job
# (docs/cluster-jobs.md); the server gives cluster jobs to no other worker.
JOB_CAPABILITIES = ["jobs", "cluster_jobs"]
HELLO_INTERVAL = 60.0
STOP_GRACE = 15.0


class Worker:
    def __init__(self, config: WorkerConfig, *, api: ApiClient | None = None, pool: ConnectionPool | None = None,
                 jobs: bool | None = None):
        """`jobs`: run jobs too (the default with the real API client; a stand-in API in tests runs only
        checks and reads unless asked)."""
        self.config = config
        self.stop_event = threading.Event()
        if jobs is None:
            jobs = api is None
        self.api = api or ApiClient(config.api_url, config.token, stop=self.stop_event)
        self.pool = pool or ConnectionPool(allow_local=config.allow_local)
        self.jobs = JobManager(config, self.api, self.pool, self.stop_event, on_fatal=self._fail) if jobs else None
        # The GPUs of every computer it serves, for the GPU board (worker_agent.gpu_watch): a worker that runs
        # jobs, unless MMT_WORKER_GPU_WATCH_SECONDS=0. It shares the jobs' NVML and connections.
        self.gpu_watch = GpuWatch(interval=config.gpu_watch_seconds, worker_id=config.worker_id, api=self.api,
                                  pool=self.pool, stop_event=self.stop_event, telemetry=self.jobs.telemetry,
                                  on_fatal=self._fail) if jobs and config.gpu_watch_seconds > 0 else None
        self._watching = False  # the watch starts with run_forever, not with run_once
        self.claim_wait = config.claim_wait
        self.hello_interval = HELLO_INTERVAL
        self.fatal: FatalApiError | None = None
        self._backoff = Backoff(base=1.0, cap=60.0)
        self._handling = 0
        self._handling_lock = threading.Lock()

    # -- presence ------------------------------------------------------------------------------

    def hello_payload(self) -> dict:
        found = scan(self.config.ssh_dirs)
        return {
            "worker_id": self.config.worker_id,
            "version": __version__,
            "hostname": self.config.hostname,
            "parallel_jobs": self.config.parallel_jobs,
            "target_ids": self.config.target_ids,
            "capabilities": list(CAPABILITIES) + (list(JOB_CAPABILITIES) if self.jobs is not None else [])
            + ([GPU_WATCH] if self.gpu_watch is not None else []),
            "ssh_key_candidates": found.ssh_keys,
            "known_hosts_candidates": found.known_hosts,
        }

    def hello(self) -> dict:
        answer = self.api.hello(self.hello_payload())
        interval = answer.get("hello_interval_seconds")
        if isinstance(interval, (int, float)) and 5 <= interval <= 600:
            self.hello_interval = float(interval)
        if self.gpu_watch is not None and self._watching:
            self.gpu_watch.update(answer.get("gpu_watch"))
        return answer

    # -- one item each -------------------------------------------------------------------------

    def handle_check(self, item: dict) -> None:
        computer = item.get("computer") or {}
        log.info("checking computer %s (%s), check %s", computer.get("id"), computer.get("name"), item.get("id"))
        # The API item tests the worker's own MMT_API_URL: that is the address jobs on this target get.
        status, result = run_check(computer, self.pool, api_url=self.config.api_url or item.get("api_url") or "")
        failed = [i["key"] for i in result["items"] if i["status"] == "failed"]
        log.info("check %s %s%s", item.get("id"), status, f" (failed: {', '.join(failed)})" if failed else "")
        self._complete("check", item, lambda: self.api.complete_check(
            item["id"], self.config.worker_id, item["lease_id"], status, result))

    def handle_read(self, item: dict) -> None:
        entries, error = read_directory(item.get("connection") or {}, str(item.get("path") or ""), self.pool)
        if error not in (None, *ERRORS):
            error = "connect_failed"
        log.info("read %s: %s", item.get("id"), error or f"{len(entries)} entries")
        self._complete("read", item, lambda: self.api.complete_read(
            item["id"], self.config.worker_id, item["lease_id"], entries, error))

    def _complete(self, what: str, item: dict, send: Callable[[], dict]) -> None:
        started = time.monotonic()
        try:
            send()
            log.debug("reported %s %s in %.0f ms", what, item.get("id"), (time.monotonic() - started) * 1000)
        except FatalApiError:
            raise
        except ApiError as exc:
            # 409 (lease lost, expired, completed differently) or 422: the server will not take this
            # result, retrying cannot change that.
            log.warning("the server refused the result of %s %s: %s", what, item.get("id"), exc)

    # -- threads -------------------------------------------------------------------------------

    def _presence_thread(self) -> None:
        failures = 0
        while not self.stop_event.is_set():
            try:
                self.hello()
                failures = 0
                wait = self.hello_interval
            except FatalApiError as exc:
                return self._fail(exc)
            except ApiError as exc:
                failures += 1
                wait = min(self.hello_interval, self._backoff.delay(failures))
                log.warning("presence not sent: %s", exc)
            self.stop_event.wait(wait)

    def _claim_thread(self, what: str, claim: Callable[[str, int], dict | None],
                      handle: Callable[[dict], None]) -> None:
        failures = 0
        while not self.stop_event.is_set():
            try:
                item = claim(self.config.worker_id, self.claim_wait)
                failures = 0
                if item is None:
                    continue
                log.debug("claimed %s %s", what, item.get("id"))
                with self._handling_lock:
                    self._handling += 1
                try:
                    handle(item)  # even when stopping: the item is ours now, report it
                finally:
                    with self._handling_lock:
                        self._handling -= 1
            except FatalApiError as exc:
                return self._fail(exc)
            except ApiError as exc:
                failures += 1
                level = logging.WARNING if isinstance(exc, ApiUnavailable) or failures > 1 else logging.INFO
                log.log(level, "%s claim failed: %s", what, exc)
                self.stop_event.wait(self._backoff.delay(failures))
            except Exception:  # a bug in handling one item must not stop the worker
                failures += 1
                log.exception("unexpected error while handling a %s", what)
                self.stop_event.wait(self._backoff.delay(failures))

    def _fail(self, exc: FatalApiError) -> None:
        if self.fatal is None:
            self.fatal = exc
            log.error("%s", exc)
        self.stop_event.set()

    # -- entry points --------------------------------------------------------------------------

    def run_forever(self, *, install_signals: bool = True) -> int:
        if install_signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda *_: self.stop_event.set())
        self._watching = True
        try:
            self.hello()  # the first hello decides quickly whether the token works at all
        except FatalApiError as exc:
            self._fail(exc)
            return 1
        except ApiError as exc:
            log.warning("presence not sent yet: %s (will retry)", exc)
        log.info("worker %s %s started (api %s, target ids %s)", self.config.worker_id, __version__,
                 self.config.api_url, self.config.target_ids or "any")
        threads = [
            threading.Thread(target=self._presence_thread, name="presence", daemon=True),
            threading.Thread(target=self._claim_thread, name="checks", daemon=True,
                             args=("check", self.api.claim_check, self.handle_check)),
            threading.Thread(target=self._claim_thread, name="reads", daemon=True,
                             args=("read", self.api.claim_read, self.handle_read)),
        ]
        for thread in threads:
            thread.start()
        if self.jobs is not None:
            self.jobs.start_threads()
        while not self.stop_event.wait(1.0):
            self.pool.prune()
        if self.gpu_watch is not None:
            self.gpu_watch.stop_all()
        if self.fatal is None:
            self.say_goodbye()
        if self.jobs is not None:
            self.jobs.shutdown()
        # A check or read in hand gets a grace period to be reported. Threads waiting in a long-poll
        # hold nothing: they are daemons and end with the process. (Were an item handed out in that
        # very moment, the server returns it again to this worker id on its next claim.)
        deadline = time.monotonic() + STOP_GRACE
        while self._handling and time.monotonic() < deadline:
            time.sleep(0.05)
        self.pool.close_all()
        log.info("worker %s stopped", self.config.worker_id)
        return 1 if self.fatal else 0

    def say_goodbye(self) -> None:
        try:
            answer = self.api.goodbye(self.config.worker_id)
        except ApiError as exc:
            log.warning("could not tell the server that this worker stops (%s): jobs it claimed but did not "
                        "start return to the queue after 60 s without a heartbeat", exc)
            return
        released = answer.get("released_job_ids") or []
        if released:
            log.info("stopping: job(s) %s go back to the queue for another worker",
                     ", ".join(map(str, released)))

    def run_once(self) -> int:
        """Presence, then whatever check and read are waiting now, then one job (or the jobs this worker
        already holds) to its end; then exit."""
        try:
            self.hello()
            check = self.api.claim_check(self.config.worker_id, 0)
            if check:
                self.handle_check(check)
            read = self.api.claim_read(self.config.worker_id, 0)
            if read:
                self.handle_read(read)
            if self.jobs is not None:
                self.jobs.run_once()
        except FatalApiError as exc:
            self._fail(exc)
            return 1
        finally:
            self.pool.close_all()
        return 0
