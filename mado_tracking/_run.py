"""Runs: continue the Job's Run inside a job, or create one with a personal token; log to it; end it."""
from __future__ import annotations

import atexit
import numbers
import os
import re
import signal
import sys
import threading
import time

from ._buffer import MetricSender
from ._http import Client, TrackingError, decode_number

MAX_PARAMS_PER_REQUEST = 100
MAX_TAGS_PER_REQUEST = 100
KEY_PATTERN = re.compile(r"^[\w\-. /:]+$")
MAX_KEY_LENGTH = 250
STATUSES = ("RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED")
SIGTERM_BUDGET = 7.0  # the worker SIGKILLs 10 s after SIGTERM: leave room for the program's own handler


def _seconds(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def _now_ms() -> int:
    return int(time.time() * 1000)


def _check_key(what: str, key) -> str:
    if not isinstance(key, str) or not key:
        raise TrackingError(f"A {what} name must be a non-empty string, not {key!r}.", "INVALID_PARAMETER_VALUE")
    if len(key) > MAX_KEY_LENGTH:
        raise TrackingError(f"The {what} name {key[:40]!r}... is {len(key)} characters long; "
                            f"the limit is {MAX_KEY_LENGTH}.", "INVALID_PARAMETER_VALUE")
    if not KEY_PATTERN.match(key) or key.startswith("/") or ".." in key.split("/"):
        raise TrackingError(
            f"Invalid {what} name {key!r}: names may only contain letters, digits, underscores (_), dashes (-), "
            "periods (.), spaces ( ), colons (:) and slashes (/), and may not start with a slash or contain '..'.",
            "INVALID_PARAMETER_VALUE")
    return key


class ActiveRun:
    """A Run being logged to. Also a context manager: leaving the `with` block ends the Run
    (FINISHED, FAILED on an exception, KILLED on Ctrl-C)."""

    def __init__(self, client: Client, info: dict, *, in_job: bool):
        self.client = client
        self.info = info
        self.run_id: str = info.get("run_id") or info["run_uuid"]
        self.experiment_id: str = str(info.get("experiment_id", ""))
        self.artifact_uri: str = info.get("artifact_uri", "")
        self.in_job = in_job  # the Job's Run: the server sets its end when the job ends
        self.ended = False
        self.metrics = MetricSender(client, self.run_id, interval=_seconds("MADO_TRACKING_FLUSH_INTERVAL", 1.0))

    def __repr__(self) -> str:
        return f"<mado_tracking.ActiveRun run_id={self.run_id!r} experiment_id={self.experiment_id!r}>"

    @property
    def tracking_uri(self) -> str:
        return self.client.tracking_uri

    def __enter__(self) -> "ActiveRun":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.ended:
            return False
        status = "FINISHED" if exc_type is None else ("KILLED" if exc_type is KeyboardInterrupt else "FAILED")
        if exc_type is None:
            self.end(status)
        else:
            try:
                self.end(status)
            except TrackingError as error:  # the block's own exception matters more
                print(f"mado_tracking: {error}", file=sys.stderr)
        return False

    # -- logging -------------------------------------------------------------------------------------

    def _usable(self) -> None:
        if self.ended:
            raise TrackingError(f"Run {self.run_id} has ended: start a new Run to log more.", "INVALID_STATE")
        self.metrics.raise_errors()

    def log_metric(self, key: str, value: float, step: int | None = None, timestamp: int | None = None) -> None:
        self.log_metrics({key: value}, step=step, timestamp=timestamp)

    def log_metrics(self, metrics: dict, step: int | None = None, timestamp: int | None = None) -> None:
        """Buffer the points; the background thread sends them (see `flush`)."""
        self._usable()
        timestamp = _now_ms() if timestamp is None else int(timestamp)
        step = 0 if step is None else step
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            raise TrackingError(f"A metric step must be an integer, not {step!r}.", "INVALID_PARAMETER_VALUE")
        points = []
        for key, value in metrics.items():
            _check_key("metric", key)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TrackingError(f"The value of metric {key!r} must be a number, not {value!r}.",
                                    "INVALID_PARAMETER_VALUE")
            points.append({"key": key, "value": float(value), "timestamp": timestamp, "step": int(step)})
        self.metrics.add(points)

    def _batch(self, field: str, items: list[dict]) -> None:
        self.client.api("POST", "runs/log-batch", {"run_id": self.run_id, field: items},
                        retry_for=_seconds("MADO_TRACKING_RETRY_SECONDS", 60.0))

    def log_param(self, key: str, value) -> None:
        self.log_params({key: value})

    def log_params(self, params: dict) -> None:
        """Sent at once. A parameter cannot change once logged: another value raises INVALID_PARAMETER_VALUE."""
        self._usable()
        items = [{"key": _check_key("parameter", key), "value": str(value)} for key, value in params.items()]
        for start in range(0, len(items), MAX_PARAMS_PER_REQUEST):
            self._batch("params", items[start:start + MAX_PARAMS_PER_REQUEST])

    def set_tag(self, key: str, value) -> None:
        self.set_tags({key: value})

    def set_tags(self, tags: dict) -> None:
        """Sent at once; a tag set again takes the new value."""
        self._usable()
        items = [{"key": _check_key("tag", key), "value": str(value)} for key, value in tags.items()]
        for start in range(0, len(items), MAX_TAGS_PER_REQUEST):
            self._batch("tags", items[start:start + MAX_TAGS_PER_REQUEST])

    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:
        """Upload one file as `<artifact_path>/<its name>` among the Run's artifacts."""
        self._usable()
        if not os.path.isfile(local_path):
            raise TrackingError(f"{local_path!r} is not a file: log_artifact uploads one file "
                                "(use log_artifacts for a directory).", "INVALID_PARAMETER_VALUE")
        name = os.path.basename(local_path)
        path = f"{artifact_path.strip('/')}/{name}" if artifact_path else name
        self._upload(local_path, path)

    def log_artifacts(self, local_dir: str, artifact_path: str | None = None) -> None:
        """Upload every file under `local_dir`, keeping their relative paths (under `artifact_path`)."""
        self._usable()
        if not os.path.isdir(local_dir):
            raise TrackingError(f"{local_dir!r} is not a directory.", "INVALID_PARAMETER_VALUE")
        for root, _, files in os.walk(local_dir):
            for name in sorted(files):
                full = os.path.join(root, name)
                relative = os.path.relpath(full, local_dir).replace(os.sep, "/")
                self._upload(full, f"{artifact_path.strip('/')}/{relative}" if artifact_path else relative)

    def _upload(self, local_path: str, path: str) -> None:
        if not self.artifact_uri:
            self.artifact_uri = self.get()["info"].get("artifact_uri", "")
        url = self.client.artifact_url(self.artifact_uri, path)
        with open(local_path, "rb") as handle:
            self.client.request("PUT", url, data=handle, retry_for=_seconds("MADO_TRACKING_RETRY_SECONDS", 60.0))

    # -- reading -------------------------------------------------------------------------------------

    def get(self) -> dict:
        """The Run as MLflow's `runs/get` returns it: `{"info": {...}, "data": {"metrics", "params", "tags"}}`."""
        return self.client.api("GET", "runs/get", {"run_id": self.run_id}, retry_for=10.0)["run"]

    def get_metric_history(self, key: str) -> list[dict]:
        """Every point of one metric series that the server has (points still buffered are not there yet)."""
        return get_metric_history(key, run_id=self.run_id, _client=self.client)

    # -- ending --------------------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every buffered point has been taken by the server; False if `timeout` passed first."""
        delivered = self.metrics.flush(timeout)
        self.metrics.raise_errors()
        return delivered

    def end(self, status: str = "FINISHED", *, flush_timeout: float | None = None) -> None:
        """Send the buffered points, then set the Run's status and end time. Inside a job this ends the Run,
        not the Job."""
        if status not in STATUSES:
            raise TrackingError(f"Unknown Run status {status!r}: use one of {', '.join(STATUSES)}.",
                                "INVALID_PARAMETER_VALUE")
        if self.ended:
            return
        if flush_timeout is None:
            flush_timeout = _seconds("MADO_TRACKING_FLUSH_TIMEOUT", 120.0)
        self.ended = True
        _forget(self)
        delivered = self.metrics.close(flush_timeout)
        unsent = self.metrics.unsent()
        self.client.api("POST", "runs/update", {"run_id": self.run_id, "status": status, "end_time": _now_ms()},
                        retry_for=_seconds("MADO_TRACKING_RETRY_SECONDS", 60.0))
        self.metrics.raise_errors()
        if not delivered:
            raise TrackingError(
                f"{unsent} metric points could not be sent to {self.tracking_uri} within {flush_timeout:g} s "
                f"({self.metrics.last_failure}); they are lost. Raise MADO_TRACKING_FLUSH_TIMEOUT to wait longer.",
                "UNAVAILABLE")

    end_run = end


# -- the active run and module-level functions --------------------------------------------------------

_lock = threading.RLock()
_active: ActiveRun | None = None
_hooks_installed = False
_previous_sigterm = None


def _forget(run: ActiveRun) -> None:
    global _active
    with _lock:
        if _active is run:
            _active = None


def _job_run_id() -> str | None:
    return os.environ.get("MLFLOW_RUN_ID") or os.environ.get("MMT_RUN_ID") or None


def start_run(run_id: str | None = None, *, experiment: str | None = None, run_name: str | None = None,
              tags: dict | None = None, tracking_uri: str | None = None, token: str | None = None) -> ActiveRun:
    """Start logging to a Run and make it the active one.

    Inside a job (MLFLOW_RUN_ID / MMT_RUN_ID set by the worker) `start_run()` continues the Job's Run with the
    job's token. Elsewhere it creates a new Run in `experiment` (a name; created if missing; the server's
    default experiment when omitted) using `tracking_uri`/`token` or MLFLOW_TRACKING_URI/MLFLOW_TRACKING_TOKEN.
    `run_id=` continues an existing Run."""
    global _active
    with _lock:
        if _active is not None:
            raise TrackingError(
                f"Run {_active.run_id} is already active: end it with mado_tracking.end_run() "
                "(or leave its `with` block) before starting another.", "INVALID_STATE")
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            raise TrackingError(
                "No tracking server: set MLFLOW_TRACKING_URI (e.g. https://mado.example.org/mlflow) and "
                "MLFLOW_TRACKING_TOKEN to a personal token with the runs:write scope, or pass "
                "tracking_uri= and token=. Inside a job the worker sets them.", "INVALID_PARAMETER_VALUE")
        client = Client(uri, token or os.environ.get("MLFLOW_TRACKING_TOKEN"),
                        timeout=_seconds("MADO_TRACKING_TIMEOUT", 30.0))
        in_job = False
        if run_id is None and tracking_uri is None and experiment is None and _job_run_id():
            run_id, in_job = _job_run_id(), True
        if run_id is not None:
            info = client.api("GET", "runs/get", {"run_id": run_id}, retry_for=60.0)["run"]["info"]
            if not in_job and info.get("status") != "RUNNING":
                info = client.api("POST", "runs/update", {"run_id": run_id, "status": "RUNNING"},
                                  retry_for=60.0).get("run_info", info)
        else:
            body = {"experiment_id": _experiment_id(client, experiment), "start_time": _now_ms()}
            if run_name:
                body["run_name"] = run_name
            # Not idempotent: retried only while the server cannot have received it.
            info = client.api("POST", "runs/create", body, retry_for=60.0, only_if_unsent=True)["run"]["info"]
        run = ActiveRun(client, info, in_job=in_job)
        _active = run
        _install_hooks()
    if tags:
        run.set_tags(tags)
    return run


def _experiment_id(client: Client, name: str | None) -> str:
    name = name or os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if not name and os.environ.get("MLFLOW_EXPERIMENT_ID"):
        return os.environ["MLFLOW_EXPERIMENT_ID"]
    name = name or "Default"
    try:
        found = client.api("GET", "experiments/get-by-name", {"experiment_name": name}, retry_for=60.0)
        return str(found["experiment"]["experiment_id"])
    except TrackingError as error:
        if error.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
    try:
        return str(client.api("POST", "experiments/create", {"name": name}, retry_for=60.0,
                              only_if_unsent=True)["experiment_id"])
    except TrackingError as error:
        if error.error_code != "RESOURCE_ALREADY_EXISTS":  # created meanwhile by another process
            raise
        found = client.api("GET", "experiments/get-by-name", {"experiment_name": name}, retry_for=60.0)
        return str(found["experiment"]["experiment_id"])


def active_run() -> ActiveRun | None:
    return _active


def _require() -> ActiveRun:
    run = _active
    if run is None:
        # mlflow starts a run implicitly; so do we, which inside a job is the Job's Run.
        run = start_run()
    return run


def log_metric(key: str, value: float, step: int | None = None, timestamp: int | None = None) -> None:
    _require().log_metric(key, value, step=step, timestamp=timestamp)


def log_metrics(metrics: dict, step: int | None = None, timestamp: int | None = None) -> None:
    _require().log_metrics(metrics, step=step, timestamp=timestamp)


def log_param(key: str, value) -> None:
    _require().log_param(key, value)


def log_params(params: dict) -> None:
    _require().log_params(params)


def set_tag(key: str, value) -> None:
    _require().set_tag(key, value)


def set_tags(tags: dict) -> None:
    _require().set_tags(tags)


def log_artifact(local_path: str, artifact_path: str | None = None) -> None:
    _require().log_artifact(local_path, artifact_path)


def log_artifacts(local_dir: str, artifact_path: str | None = None) -> None:
    _require().log_artifacts(local_dir, artifact_path)


def flush(timeout: float | None = None) -> bool:
    run = _active
    return True if run is None else run.flush(timeout)


def end_run(status: str = "FINISHED") -> None:
    run = _active
    if run is not None:
        run.end(status)


def get_run(run_id: str | None = None, *, tracking_uri: str | None = None, token: str | None = None) -> dict:
    """A Run as MLflow's `runs/get` returns it (the active Run by default)."""
    if run_id is None and _active is not None and tracking_uri is None:
        return _active.get()
    run_id = run_id or _job_run_id()
    if run_id is None:
        raise TrackingError("get_run() needs a run_id when no Run is active.", "INVALID_PARAMETER_VALUE")
    client = _make_client(tracking_uri, token)
    return client.api("GET", "runs/get", {"run_id": run_id}, retry_for=10.0)["run"]


def get_metric_history(key: str, run_id: str | None = None, *, tracking_uri: str | None = None,
                       token: str | None = None, _client: Client | None = None) -> list[dict]:
    """Every point of one metric series: `[{"key", "value", "timestamp", "step"}, ...]`."""
    if _client is None:
        if run_id is None and _active is not None and tracking_uri is None:
            return _active.get_metric_history(key)
        _client = _make_client(tracking_uri, token)
    run_id = run_id or _job_run_id()
    points, page_token = [], None
    while True:
        query = {"run_id": run_id, "metric_key": key, "max_results": 25000}
        if page_token:
            query["page_token"] = page_token
        page = _client.api("GET", "metrics/get-history", query, retry_for=10.0)
        for point in page.get("metrics", []):
            point["value"] = decode_number(point.get("value"))
            point["step"] = int(point.get("step", 0))
            point["timestamp"] = int(point.get("timestamp", 0))
            points.append(point)
        page_token = page.get("next_page_token")
        if not page_token:
            return points


def _make_client(tracking_uri: str | None, token: str | None) -> Client:
    if _active is not None and tracking_uri is None:
        return _active.client
    return Client(tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", ""),
                  token or os.environ.get("MLFLOW_TRACKING_TOKEN"))


# -- interpreter exit and SIGTERM ---------------------------------------------------------------------

def _at_exit() -> None:
    run = _active
    if run is None:
        return
    timeout = _seconds("MADO_TRACKING_FLUSH_TIMEOUT", 120.0)
    try:
        if run.in_job:
            # The Job's end sets the Run's status from the program's exit; only deliver the points.
            run.ended = True
            _forget(run)
            if not run.metrics.close(timeout):
                print(f"mado_tracking: {run.metrics.unsent()} metric points could not be sent "
                      f"({run.metrics.last_failure})", file=sys.stderr)
            run.metrics.raise_errors()
        else:
            run.end("FINISHED", flush_timeout=timeout)  # as mlflow does for a run left open
    except TrackingError as error:
        print(f"mado_tracking: {error}", file=sys.stderr)


def _on_sigterm(signum, frame) -> None:
    run = _active
    if run is not None:
        started = time.monotonic()
        try:
            delivered = run.metrics.flush(SIGTERM_BUDGET)
            if not delivered:
                print(f"mado_tracking: SIGTERM: {run.metrics.unsent()} metric points could not be sent in "
                      f"{SIGTERM_BUDGET:g} s ({run.metrics.last_failure})", file=sys.stderr, flush=True)
            if not run.in_job:
                left = max(0.5, SIGTERM_BUDGET + 1.5 - (time.monotonic() - started))
                run.ended = True
                _forget(run)
                run.metrics.close(0)
                run.client.api("POST", "runs/update",
                               {"run_id": run.run_id, "status": "KILLED", "end_time": _now_ms()}, timeout=left)
        except Exception as error:  # never keep the program from ending
            print(f"mado_tracking: SIGTERM: {error}", file=sys.stderr, flush=True)
    previous = _previous_sigterm
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    else:  # the default action: end the process by the same signal
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker, a multiprocessing pool) has a copy of the parent's buffer but no
    sender thread, and perhaps a copy of a lock some thread held: the buffered points are the parent's to
    send. The child starts with no active Run, so its exit and its SIGTERM neither send nor report them;
    if it logs itself, it continues (inside a job) the Job's Run with a sender of its own."""
    global _active, _lock
    _lock = threading.RLock()
    _active = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _install_hooks() -> None:
    global _hooks_installed, _previous_sigterm
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(_at_exit)
    if threading.current_thread() is threading.main_thread():
        try:
            previous = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, _on_sigterm)
            _previous_sigterm = previous
        except (ValueError, OSError):  # not the main interpreter, or an embedded one
            pass
