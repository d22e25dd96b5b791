"""Tracking throughput: our MLflow-compatible API (`<server>/mlflow`) against the real MLflow tracking
server, both on the same PostgreSQL, with the same client workloads, measured in the same run:

- `log_batch`: N metric points (default 100,000) through the real MLflow client's `MlflowClient().log_batch`
  in batches of 1000, and through the `mado_tracking` SDK (`log_metric` per point, batched by its thread);
- one `log_metric` call (median of `--calls`, default 200; for the SDK: `log_metric` + `flush()`);
- `get_metric_history` of the N-point series;
- the baseline of our own storage: the same N rows written straight into our metric table (psycopg COPY,
  and the Django ORM's bulk_create in batches of 1000), without HTTP, authentication or validation;
- the floor the MLflow client sets: its log_batch, log_metric and get_metric_history against a stub server
  (another process) that answers every call at once with a canned answer. No server gets more through
  this client on this machine: with 100,000 points its get_metric_history spends seconds parsing the answer.

    .venv/bin/python bench/tracking_throughput.py [--points 100000] [--calls 200] [--server gunicorn|runserver]
    .venv/bin/python bench/tracking_throughput.py --quick   # 20,000 points, 50 calls: a try in about a minute

Our server runs as docs/deployment.md recommends (gunicorn, gthread, 2 processes x 8 threads, MADO_DEBUG=false,
PostgreSQL). gunicorn is not in requirements.txt, so the benchmark installs it with `pip --target` into
bench/.venvs/gunicorn and puts it on our server's PYTHONPATH; `--server runserver` uses `manage.py runserver`
(one process) instead. MLflow's server (`mlflow server --workers 2`, the `mlflow` package from PyPI, plus
psycopg2-binary) is installed into its own venv bench/.venvs/mlflow, reused when present.

Needs PostgreSQL at 127.0.0.1:5432 (user postgres, trust auth) and PyPI (first run only). Creates and drops
two databases; stops both servers and drops the databases on every exit, Ctrl-C included. Prints
`name: value unit` lines, the ratios ours/MLflow and ours/bare and the goals of issue 16 as information;
asserts nothing about time. A call that fails is printed as FAILED with the server's answer and makes the
exit status 1."""
from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
VENVS = ROOT / "bench" / ".venvs"
MLFLOW_VENV = VENVS / "mlflow"
GUNICORN_DIR = VENVS / "gunicorn"
from harness import PG, free_port, stop, wait_ready  # noqa: E402
TAG = uuid.uuid4().hex[:8]
DB = f"mado_bench_{TAG}"
MLFLOW_DB = f"mlflow_bench_{TAG}"
VAR = Path(tempfile.mkdtemp(prefix="mado-bench-tracking-"))
SERVER_ENV = {
    "MADO_DATABASE_URL": f"{PG}/{DB}",
    "MADO_DEBUG": "false",
    "MADO_DEV_MODE": "false",
    "MADO_SECRET_KEY": secrets.token_urlsafe(64),
    "MADO_ALLOWED_HOSTS": "127.0.0.1,localhost",
    "MADO_VAR_DIR": str(VAR),
}
os.environ.update(SERVER_ENV)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mado.settings")
KEY = "loss"
# The figures issue 16 aims for (information, not assertions).
GOAL_BATCH = 20_000  # points/s through log_batch, and at least MLflow's own server
GOAL_LOG_METRIC_MS = 10.0
GOAL_HISTORY_S = 1.0

failures: list[str] = []
SKIPPED = "skipped"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=100_000, help="metric points per series (default 100000)")
    parser.add_argument("--calls", type=int, default=200, help="log_metric calls whose median is printed")
    parser.add_argument("--server", choices=("gunicorn", "runserver"), default="gunicorn",
                        help="how our server runs (default: gunicorn as docs/deployment.md recommends)")
    parser.add_argument("--servers", default="ours,mlflow",
                        help="ours,mlflow (default) or one of them, for a quick try")
    parser.add_argument("--quick", action="store_true",
                        help="a quick try: 20,000 points and 50 calls unless --points/--calls say otherwise")
    args = parser.parse_args()
    if args.quick:
        defaults = {a.dest: a.default for a in parser._actions}
        args.points = 20_000 if args.points == defaults["points"] else args.points
        args.calls = 50 if args.calls == defaults["calls"] else args.calls
    signal.signal(signal.SIGTERM, _terminated)

    import psycopg

    processes: list[subprocess.Popen] = []
    created: list[str] = []
    try:
        args.servers = set(args.servers.split(","))
        mlflow_bin = ensure_mlflow() if "mlflow" in args.servers else None
        gunicorn_path = ensure_gunicorn() if args.server == "gunicorn" else None
        with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
            for name in (DB, MLFLOW_DB) if mlflow_bin else (DB,):
                admin.execute(f'CREATE DATABASE "{name}"')
                created.append(name)
        token = prepare_ours()
        print(f"points: {args.points} per series; log_metric calls: {args.calls}; our server: {args.server}; "
              f"MLflow server: {mlflow_version(mlflow_bin) + ' --workers 2' if mlflow_bin else 'skipped'}; "
              f"client: mlflow-skinny {client_version()}; each server measured alone, once its start-up "
              "settled")
        servers = {}
        if "ours" in args.servers:
            servers["ours"] = (lambda: start_ours(args.server, gunicorn_path, processes), token)
        if mlflow_bin:
            servers["mlflow"] = (lambda: start_mlflow(mlflow_bin, processes), None)
        run(args.points, args.calls, servers, processes)
    except KeyboardInterrupt:
        print("interrupted: stopping the servers and dropping the databases", file=sys.stderr)
        failures.append("interrupted")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not skip the clean-up
        for process in processes:
            stop(process)
            if set(failures) - {"interrupted"} and process.log_path.exists():  # the servers' side of a failed call
                tail = process.log_path.read_text(errors="replace").splitlines()[-40:]
                print(f"--- last lines of {process.name}'s log ---", *tail, sep="\n", file=sys.stderr)
        from django.db import connections

        connections.close_all()
        with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
            for name in created:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        shutil.rmtree(VAR, ignore_errors=True)
    if failures:
        print(f"failed: {', '.join(failures)}", file=sys.stderr)
        sys.exit(1)


def _terminated(signum, frame):
    raise KeyboardInterrupt  # SIGTERM cleans up as Ctrl-C does


# Installing the peers ---------------------------------------------------------------------------------

def _pip(python: Path | str, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args], check=True)


def ensure_mlflow() -> Path:
    """The real MLflow tracking server from PyPI, in its own venv (the newest release pip can install)."""
    mlflow = MLFLOW_VENV / "bin" / "mlflow"
    python = MLFLOW_VENV / "bin" / "python"
    if mlflow.exists() and subprocess.run([str(python), "-c", "import mlflow.server, psycopg2"],
                                          capture_output=True).returncode == 0:
        return mlflow
    print(f"installing mlflow and psycopg2-binary into {MLFLOW_VENV.relative_to(ROOT)} ...", file=sys.stderr)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--clear", str(MLFLOW_VENV)], check=True)
    _pip(python, "mlflow", "psycopg2-binary")
    return mlflow


def ensure_gunicorn() -> Path:
    """gunicorn for our server (docs/deployment.md installs it next to requirements.txt; it is not in it)."""
    if shutil.which("gunicorn", path=str(Path(sys.executable).parent)):
        return Path()  # already in our venv
    if not (GUNICORN_DIR / "gunicorn").is_dir():
        print(f"installing gunicorn into {GUNICORN_DIR.relative_to(ROOT)} ...", file=sys.stderr)
        _pip(sys.executable, "--target", str(GUNICORN_DIR), "gunicorn")
    return GUNICORN_DIR


def mlflow_version(mlflow_bin: Path) -> str:
    return subprocess.run([str(mlflow_bin.with_name("python")), "-c", "import mlflow; print(mlflow.__version__)"],
                          capture_output=True, text=True).stdout.strip()


def client_version() -> str:
    import mlflow

    return mlflow.__version__


# The two servers --------------------------------------------------------------------------------------

def prepare_ours() -> str:
    """Migrations, a user who is admin of project `bench`, and a personal token with read,runs:write
    (manage.py create_project and create_token, called in this process)."""
    import io

    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    User.objects.create_user("bench", password=secrets.token_urlsafe(16))
    call_command("create_project", "bench", admin="bench", stdout=io.StringIO())
    out = io.StringIO()
    call_command("create_token", "bench", project="bench", scopes="read,runs:write", stdout=out)
    return out.getvalue().strip()


def start_ours(kind: str, gunicorn_path: Path | None, processes: list) -> str:
    port = free_port()
    env = dict(os.environ, **SERVER_ENV, MADO_PUBLIC_URL=f"http://127.0.0.1:{port}")
    if kind == "gunicorn":
        if gunicorn_path and str(gunicorn_path) != ".":
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(gunicorn_path), env.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "gunicorn", "mado.wsgi", "--bind", f"127.0.0.1:{port}",
                   "--worker-class", "gthread", "--workers", "2", "--threads", "8", "--log-level", "warning"]
    else:
        command = [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"]
    processes.append(_start(command, env, "ours"))
    url = f"http://127.0.0.1:{port}"
    wait_ready(processes[-1], f"{url}/api/health", processes[-1].log_path, "our server")
    return f"{url}/mlflow"


def start_mlflow(mlflow_bin: Path, processes: list) -> str:
    port = free_port()
    artifacts = VAR / "mlflow-artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MADO_", "MLFLOW_", "DJANGO_"))}
    command = [str(mlflow_bin), "server", "--backend-store-uri",
               f"postgresql+psycopg2://postgres@127.0.0.1:5432/{MLFLOW_DB}",
               "--host", "127.0.0.1", "--port", str(port), "--workers", "2", "--serve-artifacts",
               "--artifacts-destination", str(artifacts)]
    processes.append(_start(command, env, "mlflow"))
    url = f"http://127.0.0.1:{port}"
    wait_ready(processes[-1], f"{url}/health", processes[-1].log_path, "MLflow's server", timeout=300)
    return url


def settle(process: subprocess.Popen, name: str, quiet_cpu: float = 0.1, timeout: float = 120) -> None:
    """Until the server's processes (its session) used under `quiet_cpu` s of CPU over 2 s: done starting."""
    tick = os.sysconf("SC_CLK_TCK")

    def cpu() -> float:
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == process.pid:  # the session id: the server and everything it started
                total += int(fields[11]) + int(fields[12])
        return total / tick

    started, before = time.monotonic(), cpu()
    while time.monotonic() - started < timeout:
        time.sleep(2)
        now = cpu()
        if now - before < quiet_cpu:
            break
        before = now
    print(f"{name}: start-up settled after {time.monotonic() - started:.0f} s", flush=True)


def _start(command: list[str], env: dict, name: str) -> subprocess.Popen:
    log = open(VAR / f"{name}.log", "wb")
    process = subprocess.Popen(command, cwd=ROOT if name == "ours" else VAR, env=env, stdout=log,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    process.log_path = VAR / f"{name}.log"
    process.name = "our server" if name == "ours" else "MLflow's server"
    return process


# The workloads ----------------------------------------------------------------------------------------

def run(points: int, calls: int, servers: dict, processes: list) -> None:
    """Each server started, measured and stopped in turn: MLflow 3's server starts about ten background
    processes (job consumers) that take some 25 s of CPU as they start, which would otherwise fall on
    whichever server is measured meanwhile. The client's floor and the bare inserts run with no server."""
    results: dict[str, float | None] = {}
    for name, (start, auth) in servers.items():
        uri = start()
        settle(processes[-1], name)
        results[f"http_roundtrip_{name}"] = http_roundtrip(name, uri, calls)
        results.update({f"{k}_{name}": v for k, v in client_workloads(name, uri, auth, points, calls).items()})
        results.update({f"{k}_{name}": v for k, v in sdk_workloads(name, uri, auth, points, calls).items()})
        stop(processes[-1])
    copy_rate, orm_rate = bare_inserts(points)
    results["bare_copy"], results["bare_orm"] = copy_rate, orm_rate
    results.update({f"{k}_floor": v for k, v in client_floor(points, calls).items()})

    print()
    print(f"bare_copy_into_metric_table: {copy_rate:,.0f} points/s")
    print(f"bare_orm_bulk_create: {orm_rate:,.0f} points/s")
    _line("client_log_batch_floor", results["client_log_batch_floor"], "points/s",
          "the MLflow client alone, against a stub that answers at once")
    _ratio("client_log_batch_ours_vs_floor", results.get("client_log_batch_ours", SKIPPED),
           results["client_log_batch_floor"])
    for what in ("client_log_batch", "sdk_log_metric_batched"):
        ours_rate, theirs_rate = results.get(f"{what}_ours", SKIPPED), results.get(f"{what}_mlflow", SKIPPED)
        _line(f"{what}_ours", ours_rate, "points/s", f"goal >= {GOAL_BATCH:,} and >= MLflow's")
        _line(f"{what}_mlflow", theirs_rate, "points/s")
        _ratio(f"{what}_ours_vs_mlflow", ours_rate, theirs_rate, "goal >= 1")
        _ratio(f"{what}_ours_vs_bare_copy", ours_rate, copy_rate)
        _ratio(f"{what}_ours_vs_bare_orm", ours_rate, orm_rate)
    _line("http_roundtrip_ours", _ms(results.get("http_roundtrip_ours", SKIPPED)), "ms median",
          "GET /api/health: the floor of one call to our server")
    _line("http_roundtrip_mlflow", _ms(results.get("http_roundtrip_mlflow", SKIPPED)), "ms median", "GET /health")
    _line("client_log_metric_floor", _ms(results["client_log_metric_floor"]), "ms median",
          "the MLflow client alone, against a stub that answers at once")
    for what in ("client_log_metric", "sdk_log_metric_flush"):
        _line(f"{what}_ours", _ms(results.get(f"{what}_ours", SKIPPED)), "ms median",
              f"goal <= {GOAL_LOG_METRIC_MS:g} ms")
        _line(f"{what}_mlflow", _ms(results.get(f"{what}_mlflow", SKIPPED)), "ms median")
        _ratio(f"{what}_ours_vs_mlflow", results.get(f"{what}_ours", SKIPPED), results.get(f"{what}_mlflow", SKIPPED),
               "time: below 1 is faster")
    _line("client_get_metric_history_floor", results["client_get_metric_history_floor"], f"s for {points:,} points",
          "the MLflow client alone, parsing a canned answer")
    for what in ("client_get_metric_history", "sdk_get_metric_history"):
        _line(f"{what}_ours", results.get(f"{what}_ours", SKIPPED), f"s for {points:,} points",
              f"goal <= {GOAL_HISTORY_S:g} s for 100,000")
        _line(f"{what}_mlflow", results.get(f"{what}_mlflow", SKIPPED), f"s for {points:,} points")
        _ratio(f"{what}_ours_vs_mlflow", results.get(f"{what}_ours", SKIPPED), results.get(f"{what}_mlflow", SKIPPED),
               "time: below 1 is faster")


def _ms(seconds):
    return seconds * 1000 if isinstance(seconds, float) else seconds


def _line(name: str, value: float | None | str, unit: str, note: str = "") -> None:
    if value == SKIPPED:
        print(f"{name}: not measured (--servers)")
        return
    if value is None:
        print(f"{name}: FAILED (see above)")
        return
    shown = f"{value:,.0f}" if value >= 100 else f"{value:.3g}" if value < 10 else f"{value:.1f}"
    print(f"{name}: {shown} {unit}" + (f" ({note})" if note else ""))


def _ratio(name: str, ours, other, note: str = "") -> None:
    if not isinstance(ours, float) or not isinstance(other, float) or not other:
        print(f"{name}: n/a")
        return
    print(f"{name}: {ours / other:.2f} ratio" + (f" ({note})" if note else ""))


def _attempt(label: str, server: str, work):
    """One workload; a failure is printed with the server's answer, recorded, and the rest carries on."""
    try:
        return work()
    except KeyboardInterrupt:
        raise
    except Exception as error:  # noqa: BLE001 — the benchmark reports every failing call and goes on
        detail = getattr(error, "message", None) or str(error)
        code = getattr(error, "error_code", None)
        status = getattr(error, "status", None) or getattr(error, "get_http_status_code", lambda: None)()
        print(f"FAILED {label} against {server}: {type(error).__name__}"
              f"{f' {code}' if code else ''}{f' (HTTP {status})' if status else ''}: {detail[:600]}", file=sys.stderr)
        if os.environ.get("BENCH_TRACEBACK"):
            traceback.print_exc()
        failures.append(f"{label}@{server}")
        return None


def http_roundtrip(server: str, uri: str, calls: int) -> float | None:
    """The floor under one call: the median GET of the server's health check over a kept-alive connection."""
    import requests

    base = uri.removesuffix("/mlflow")
    url = f"{base}/api/health" if server == "ours" else f"{base}/health"

    def measure() -> float:
        with requests.Session() as session:
            session.get(url, timeout=30).raise_for_status()
            times = []
            for _ in range(calls):
                started = time.perf_counter()
                session.get(url, timeout=30).raise_for_status()
                times.append(time.perf_counter() - started)
        return statistics.median(times)

    value = _attempt(f"GET {url}", server, measure)
    print(f"http_roundtrip[{server}]: {_fmt(_ms(value), 'ms median')}", flush=True)
    return value


def client_workloads(server: str, uri: str, token: str | None, points: int, calls: int) -> dict:
    """The real MLflow client (mlflow-skinny in .venv): log_batch, log_metric, get_metric_history."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    if token:
        os.environ["MLFLOW_TRACKING_TOKEN"] = token
    else:
        os.environ.pop("MLFLOW_TRACKING_TOKEN", None)
    client = MlflowClient(tracking_uri=uri)
    out: dict[str, float | None] = dict.fromkeys(
        ("client_log_batch", "client_log_metric", "client_get_metric_history"))
    experiment = _attempt("MlflowClient.create_experiment", server,
                          lambda: client.create_experiment(f"bench-client-{TAG}"))
    if experiment is None:
        return out
    batch_run = _attempt("MlflowClient.create_run", server, lambda: client.create_run(experiment).info.run_id)
    if batch_run is None:
        return out
    base = int(time.time() * 1000)

    def log_batch() -> float:
        started = time.perf_counter()
        for start in range(0, points, 1000):
            client.log_batch(batch_run, metrics=[Metric(KEY, 1.0 / (i + 1), base + i, i)
                                                 for i in range(start, min(start + 1000, points))])
        return points / (time.perf_counter() - started)

    out["client_log_batch"] = _attempt("MlflowClient.log_batch", server, log_batch)
    print(f"client_log_batch[{server}]: {_fmt(out['client_log_batch'], 'points/s')}", flush=True)

    def log_metric() -> float:
        run_id = client.create_run(experiment).info.run_id
        client.log_metric(run_id, KEY, 0.0, step=0)  # warm the connection
        times = []
        for i in range(1, calls + 1):
            started = time.perf_counter()
            client.log_metric(run_id, KEY, 1.0 / i, step=i)
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    out["client_log_metric"] = _attempt("MlflowClient.log_metric", server, log_metric)
    print(f"client_log_metric[{server}]: {_fmt(_ms(out['client_log_metric']), 'ms median')}", flush=True)

    def history() -> float:
        started = time.perf_counter()
        series = client.get_metric_history(batch_run, KEY)
        elapsed = time.perf_counter() - started
        if len(series) != points:
            raise AssertionError(f"get_metric_history returned {len(series)} points, expected {points}")
        return elapsed

    if out["client_log_batch"] is not None:
        out["client_get_metric_history"] = _attempt("MlflowClient.get_metric_history", server, history)
        print(f"client_get_metric_history[{server}]: {_fmt(out['client_get_metric_history'], 's')}", flush=True)
    return out


def sdk_workloads(server: str, uri: str, token: str | None, points: int, calls: int) -> dict:
    """The mado_tracking SDK: log_metric per point (its thread sends batches of 1000), flush, history."""
    import mado_tracking

    out: dict[str, float | None] = dict.fromkeys(
        ("sdk_log_metric_batched", "sdk_log_metric_flush", "sdk_get_metric_history"))
    experiment = f"bench-sdk-{TAG}"

    def batched() -> tuple[float, str]:
        run = mado_tracking.start_run(tracking_uri=uri, token=token, experiment=experiment, run_name="throughput")
        try:
            started = time.perf_counter()
            for i in range(points):
                run.log_metric(KEY, 1.0 / (i + 1), step=i)
            if not run.flush(timeout=600):
                raise TimeoutError(f"{run.metrics.unsent()} points still unsent after 600 s "
                                   f"(last failure: {run.metrics.last_failure})")
            rate = points / (time.perf_counter() - started)
        finally:
            _end(run)
        return rate, run

    result = _attempt("mado_tracking.log_metric+flush", server, batched)
    out["sdk_log_metric_batched"], batch_run = result if result else (None, None)
    print(f"sdk_log_metric_batched[{server}]: {_fmt(out['sdk_log_metric_batched'], 'points/s')}", flush=True)

    def latency() -> float:
        run = mado_tracking.start_run(tracking_uri=uri, token=token, experiment=experiment, run_name="latency")
        try:
            run.log_metric(KEY, 0.0, step=0)
            run.flush(timeout=60)
            times = []
            for i in range(1, calls + 1):
                started = time.perf_counter()
                run.log_metric(KEY, 1.0 / i, step=i)
                run.flush(timeout=60)
                times.append(time.perf_counter() - started)
        finally:
            _end(run)
        return statistics.median(times)

    out["sdk_log_metric_flush"] = _attempt("mado_tracking.log_metric+flush (one point)", server, latency)
    print(f"sdk_log_metric_flush[{server}]: {_fmt(_ms(out['sdk_log_metric_flush']), 'ms median')}", flush=True)

    def history() -> float:
        started = time.perf_counter()
        series = batch_run.get_metric_history(KEY)
        elapsed = time.perf_counter() - started
        if len(series) != points:
            raise AssertionError(f"get_metric_history returned {len(series)} points, expected {points}")
        return elapsed

    if batch_run is not None:
        out["sdk_get_metric_history"] = _attempt("mado_tracking.get_metric_history", server, history)
        print(f"sdk_get_metric_history[{server}]: {_fmt(out['sdk_get_metric_history'], 's')}", flush=True)
    return out


def _end(run) -> None:
    try:
        run.end("FINISHED", flush_timeout=5)
    except Exception as error:  # noqa: BLE001 — a failing end is reported, the figures stand
        print(f"(ending SDK run {run.run_id}: {error})", file=sys.stderr)


def _fmt(value: float | None, unit: str) -> str:
    return "FAILED" if value is None else f"{value:,.4g} {unit}" if value < 1000 else f"{value:,.0f} {unit}"


# A stub MLflow server for the client's floor: keep-alive HTTP/1.1, each answer written in one send (a
# header and body written apart would wait for the client's delayed ACK, 40 ms, and measure that instead).
STUB_SERVER = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
points = int(sys.argv[1])
history = json.dumps({"metrics": [{"key": "loss", "value": 1.0 / (i + 1), "timestamp": 1700000000000 + i, "step": i}
                                  for i in range(points)]}, separators=(",", ":")).encode()
class Stub(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self, body):
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        self.wfile.write(head + body)
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.answer(b"{}")
    def do_GET(self):
        self.answer(history if "get-history" in self.path else b"{}")
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def client_floor(points: int, calls: int) -> dict:
    """The MLflow client's own cost: the client workloads against STUB_SERVER, in its own process."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    stub = subprocess.Popen([sys.executable, "-c", STUB_SERVER, str(points)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    stub.log_path, stub.name = Path(os.devnull), "the stub server"
    out: dict[str, float | None] = dict.fromkeys(
        ("client_log_batch", "client_log_metric", "client_get_metric_history"))

    def measure() -> None:
        port = int(stub.stdout.readline())
        os.environ["MLFLOW_TRACKING_TOKEN"] = "stub"
        client = MlflowClient(tracking_uri=f"http://127.0.0.1:{port}/mlflow")
        run_id, base = "0" * 32, int(time.time() * 1000)
        started = time.perf_counter()
        for start in range(0, points, 1000):
            client.log_batch(run_id, metrics=[Metric(KEY, 1.0 / (i + 1), base + i, i)
                                              for i in range(start, min(start + 1000, points))])
        out["client_log_batch"] = points / (time.perf_counter() - started)
        times = []
        for i in range(calls):
            started = time.perf_counter()
            client.log_metric(run_id, KEY, 1.0 / (i + 1), step=i)
            times.append(time.perf_counter() - started)
        out["client_log_metric"] = statistics.median(times)
        started = time.perf_counter()
        if len(client.get_metric_history(run_id, KEY)) != points:
            raise AssertionError("the stub's history came back short")
        out["client_get_metric_history"] = time.perf_counter() - started

    try:
        _attempt("MLflow client floor", "stub", measure)
    finally:
        stop(stub)
    print(f"client_floor: log_batch {_fmt(out['client_log_batch'], 'points/s')}, log_metric "
          f"{_fmt(_ms(out['client_log_metric']), 'ms median')}, get_metric_history "
          f"{_fmt(out['client_get_metric_history'], 's')}", flush=True)
    return out


def bare_inserts(points: int) -> tuple[float, float]:
    """The same rows straight into our metric table: psycopg COPY, then ORM bulk_create (1000 a batch)."""
    from django.contrib.auth.models import User
    from django.db import connection, transaction

    from mado.models import Project
    from tracking import services
    from tracking.models import Metric, Run

    project = Project.objects.get(slug="bench")
    experiment = services.default_experiment(project)
    user = User.objects.get(username="bench")
    base = int(time.time() * 1000)
    rows = [(KEY, 1.0 / (i + 1), base + i, i) for i in range(points)]

    copy_run = Run.objects.create(experiment=experiment, project=project, created_by=user, name="bare-copy")
    # Any other column the model has (is_nan, ...) takes its default, so the row is what the server would store.
    named = ("run_id", "key", "value", "timestamp", "step")
    others = [f for f in Metric._meta.concrete_fields if not f.primary_key and f.attname not in named]
    columns = ", ".join([*named, *(f'"{f.column}"' for f in others)])
    defaults = tuple(f.get_db_prep_save(f.get_default(), connection) for f in others)
    started = time.perf_counter()
    with transaction.atomic():
        cursor = connection.cursor()
        with cursor.copy(f'COPY "{Metric._meta.db_table}" ({columns}) FROM STDIN') as copy:
            for row in rows:
                copy.write_row((copy_run.pk, *row, *defaults))
    copy_rate = points / (time.perf_counter() - started)
    assert Metric.objects.filter(run=copy_run).count() == points
    print(f"bare_copy: {copy_rate:,.0f} points/s", flush=True)

    orm_run = Run.objects.create(experiment=experiment, project=project, created_by=user, name="bare-orm")
    started = time.perf_counter()
    for start in range(0, points, 1000):
        with transaction.atomic():
            Metric.objects.bulk_create([Metric(run_id=orm_run.pk, key=k, value=v, timestamp=t, step=s)
                                        for k, v, t, s in rows[start:start + 1000]])
    orm_rate = points / (time.perf_counter() - started)
    print(f"bare_orm: {orm_rate:,.0f} points/s", flush=True)
    return copy_rate, orm_rate


if __name__ == "__main__":
    main()
