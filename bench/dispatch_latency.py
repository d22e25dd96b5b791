"""Dispatch latency: from `POST /api/projects/{p}/jobs` until the job's own process runs, with a real
worker, on the Local computer and on a loopback sshd target (issue 19, item 1).

The server runs as docs/deployment.md says (gunicorn gthread 2 processes x 8 threads, `MADO_DEBUG=false`,
PostgreSQL, `MADO_DB_CONN_MAX_AGE=60`), on a database this script creates and drops. The worker is a real
`mado-tracking-worker run` (.venv/bin), configured like tests/agent_e2e_jobs (token file, state directory,
`MMT_WORKER_SSH_DIR`, `MADO_DEV_MODE` + `MMT_ALLOW_LOCAL_EXECUTOR` for the Local computer). The SSH
target is this script's own sshd on a free loopback port with its own host key and known_hosts
(`tests.peers.sshd.start_sshd`, the class behind the tests' sshd fixture).

Each job's command writes `time.time()` to a file as its first statement; the figure is that time minus
the time just before the POST. Jobs go one after another (the next is created once the last has ended and
the worker waits in its claim long-poll again):

- first: the first job on each computer's fresh working directory (builds the venv), printed apart;
- warm: `--jobs` (default 10) per computer with the worker connected;
- cold: `--cold` (default 3) per computer, each the first job after a restarted worker opened its claim
  long-poll (its SSH transport is not open yet).

Beside them, from the job detail: created -> claimed (claimed_at) and created -> started (started_at),
and started -> the process's own time, so the figures say where the time goes. Baselines in the same
run, against the same sshd: one exec over an open paramiko transport with TCP_NODELAY, and a fresh
paramiko connect + auth + exec, each until the same one-liner has written its time; a `GET /api/health`
round trip. Prints the load average and the goals of issue 19 beside the figures; asserts nothing.

    .venv/bin/python bench/dispatch_latency.py [--jobs 10] [--cold 3]

Needs root (sshd and the `mmt` login user, as the e2e tests) and PostgreSQL at 127.0.0.1:5432 (user
postgres, trust auth). Stops every process it started (process groups; supervisors and jobs by their
working directories) and drops its database on every exit, Ctrl-C included."""
from __future__ import annotations

import argparse
import io
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent
from harness import PG, ensure_gunicorn, free_port, start, stop, wait_ready, wait_until  # noqa: E402

TAG = uuid.uuid4().hex[:8]
DB = f"mado_bench_dispatch_{TAG}"
VAR = Path(tempfile.mkdtemp(prefix="mado-bench-dispatch-"))
SERVER_ENV = {
    "MADO_DATABASE_URL": f"{PG}/{DB}",
    "MADO_DEBUG": "false",
    "MADO_DEV_MODE": "false",
    "MADO_DB_CONN_MAX_AGE": "60",  # docs/deployment.md: keep persistent connections on in production
    "MADO_SECRET_KEY": secrets.token_urlsafe(64),
    "MADO_ALLOWED_HOSTS": "127.0.0.1,localhost",
    "MADO_VAR_DIR": str(VAR / "var"),
}
os.environ.update(SERVER_ENV)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mado.settings")
TARGET_PYTHON = "/usr/bin/python3"
# The job's first statement: its own start time into the file named by argv[1].
STAMP = "import time,sys; open(sys.argv[1],'w').write(repr(time.time()))"
ENDED = ("finished", "failed", "canceled")
# The goals of issue 19 (information, not assertions).
GOAL_WARM_SSH_MS = 150
GOAL_LOCAL_MS = 100
GOAL_COLD_SSH_X_FRESH = 2.0
GOAL_IDLE_X = 1.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10, help="warm jobs per computer (default 10)")
    parser.add_argument("--cold", type=int, default=3, help="worker restarts per computer (default 3)")
    parser.add_argument("--keep-logs", type=Path, help="copy the worker's (debug) and the server's log here")
    parser.add_argument("--idle", type=int, default=0,
                        help="then again with this many idle workers of another project, each with its three "
                             "long-polls (checks, reads, jobs) open, as `mado-tracking-worker run` keeps them")
    parser.add_argument("--threads", type=int, default=8, help="gunicorn threads per process (default 8)")
    parser.add_argument("--pool", type=int, default=0,
                        help="MADO_DB_POOL_SIZE for the server (default 0: persistent connections per thread)")
    args = parser.parse_args()
    if args.pool:
        SERVER_ENV.update(MADO_DB_POOL_SIZE=str(args.pool))
        del SERVER_ENV["MADO_DB_CONN_MAX_AGE"]
    signal.signal(signal.SIGTERM, _terminated)
    import psycopg

    bench = None
    created = False
    try:
        ensure_gunicorn()
        with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{DB}"')
            created = True
        bench = Bench(threads=args.threads, idle=args.idle)
        bench.setup()
        run(bench, args.jobs, args.cold, args.idle)
    except KeyboardInterrupt:
        print("interrupted: stopping everything and dropping the database", file=sys.stderr)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not skip the clean-up
        if bench is not None:
            if sys.exc_info()[0] not in (None, KeyboardInterrupt):  # the worker's and server's side of it
                for log in ("worker.log", "server.log"):
                    tail = (VAR / log).read_text(errors="replace").splitlines()[-40:] if (VAR / log).exists() else []
                    print(f"--- last lines of {log} ---", *tail, sep="\n", file=sys.stderr)
            bench.close()
        if args.keep_logs:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for log in VAR.glob("*.log"):
                shutil.copy(log, args.keep_logs / log.name)
        from django.db import connections

        connections.close_all()
        if created:
            with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        shutil.rmtree(VAR, ignore_errors=True)


def _terminated(signum, frame):
    raise KeyboardInterrupt  # SIGTERM cleans up as Ctrl-C does


class Bench:
    """The server, the sshd, the two computers, the tokens and the worker of one run."""

    def __init__(self, *, threads: int = 8, idle: int = 0):
        self.threads, self.idle = threads, idle
        self.idle_polls: list = []
        self.idle_stop = None
        self.server = self.worker = self.sshd = None
        self.worker_log = VAR / "worker.log"
        self.dirs: list[Path] = []

    def setup(self) -> None:
        from tests.peers.sshd import start_sshd

        (VAR / "var").mkdir()
        self.sshd = start_sshd()
        self.prepare_database()
        self.start_server()

    def prepare_database(self) -> None:
        """Migrations; a member of project `bench` with a personal token; a service account set up by a
        global administrator with a worker token (as tests/conftest.World); an SSH and a Local computer."""
        import django

        django.setup()
        from django.contrib.auth.models import User
        from django.core.management import call_command

        from computers.models import ComputeTarget
        from mado import services
        from mado.choices import Role, TokenKind
        from mado.models import Membership, Project

        call_command("migrate", verbosity=0, stdout=io.StringIO())
        project = Project.objects.create(slug="bench", name="Bench")
        admin = User.objects.create_superuser("root", password=secrets.token_urlsafe(16))
        member = User.objects.create_user("member", password=secrets.token_urlsafe(16))
        Membership.objects.create(project=project, user=member, role=Role.MEMBER)
        account = services.create_service_account(services.Actor(admin), project, name="bench-worker",
                                                  role=Role.ADMIN)
        _, self.member_token = services.issue_token(
            services.SYSTEM, user=member, project=project, kind=TokenKind.PERSONAL,
            scopes=services.allowed_scopes(member, project, TokenKind.PERSONAL), expires_in_days=None)
        _, worker_token = services.issue_token(
            services.SYSTEM, user=account.user, project=project, kind=TokenKind.SERVICE,
            scopes=["read", "worker:execute", "artifacts:write"], expires_in_days=None)
        if self.idle:
            idle_project = Project.objects.create(slug="idle", name="Idle")
            idle_account = services.create_service_account(services.Actor(admin), idle_project, name="idle-workers",
                                                           role=Role.ADMIN)
            _, self.idle_token = services.issue_token(
                services.SYSTEM, user=idle_account.user, project=idle_project, kind=TokenKind.SERVICE,
                scopes=["read", "worker:execute"], expires_in_days=None)
        self.token_file = VAR / "worker-token"
        self.token_file.write_text(worker_token + "\n")
        self.token_file.chmod(0o600)
        common = dict(owner=admin, visibility="public", enabled=True, python_path=TARGET_PYTHON,
                      runtimes=["python"], gpu_ids=[], concurrency=1)
        self.ssh_dir = self.working_dir(self.sshd.home, pwd.getpwnam(self.sshd.user))
        self.local_dir = self.working_dir(VAR, pwd.getpwuid(os.getuid()))
        self.ssh = ComputeTarget.objects.create(
            name=f"sshd-{TAG}", kind="ssh", host="127.0.0.1", port=self.sshd.port, ssh_user=self.sshd.user,
            ssh_key_path=str(self.sshd.key_path), known_hosts_path=str(self.sshd.known_hosts_path),
            working_dir=str(self.ssh_dir), **common)
        self.local = ComputeTarget.objects.create(name=f"local-{TAG}", kind="local",
                                                  working_dir=str(self.local_dir), **common)

    def working_dir(self, parent: Path, owner: pwd.struct_passwd) -> Path:
        """A working directory owned by the login user, with a `marks` folder any job may write to."""
        path = parent / f"bench-dispatch-{TAG}"
        (path / "marks").mkdir(parents=True)
        path.chmod(0o755)
        (path / "marks").chmod(0o777)
        os.chown(path, owner.pw_uid, owner.pw_gid)
        self.dirs.append(path)
        return path

    def start_server(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        env = dict(os.environ, **SERVER_ENV, MADO_PUBLIC_URL=self.url)
        self.server = start([str(BIN / "gunicorn"), "mado.wsgi", "--bind", f"127.0.0.1:{port}",
                             "--worker-class", "gthread", "--workers", "2", "--threads", str(self.threads),
                             "--log-level", "warning"], env, VAR / "server.log")
        wait_ready(self.server, f"{self.url}/api/health", VAR / "server.log")

    def health(self) -> float | None:
        started = time.perf_counter()
        try:
            urllib.request.urlopen(f"{self.url}/api/health", timeout=2).read()
        except OSError:
            return None
        return time.perf_counter() - started

    # -- the worker --------------------------------------------------------------------------------

    def start_worker(self) -> float:
        """A fresh worker; returns the seconds until its job claim long-poll waits in the server."""
        self.stop_worker()
        home = VAR / "worker-home"
        home.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MMT_", "MADO_", "DJANGO_"))}
        env.update(HOME=str(home), MMT_API_URL=self.url, MMT_API_TOKEN_FILE=str(self.token_file),
                   MMT_WORKER_ID=f"bench-{TAG}", MMT_WORKER_STATE_DIR=str(VAR / "worker-state"),
                   MMT_WORKER_SSH_DIR=str(self.sshd.client_dir), MMT_LOG_LEVEL="debug",
                   MMT_WORKER_TARGET_IDS=f"{self.ssh.pk},{self.local.pk}",
                   MADO_DEV_MODE="true", MMT_ALLOW_LOCAL_EXECUTOR="true")
        since = self.listeners()[1]
        started = time.perf_counter()
        self.worker = start([str(BIN / "mado-tracking-worker"), "run"], env, self.worker_log)
        self.wait_listening(since)
        return time.perf_counter() - started

    def stop_worker(self) -> None:
        """SIGTERM (the worker says goodbye), then until the server has ended the long-poll the worker left
        open (up to its 20 s wait): a job created before would be claimed by that dead request."""
        stop(self.worker)
        wait_until(lambda: self.listeners()[0] == 0, 60, "the stopped worker's long-poll to end", interval=0.1)

    def listeners(self) -> tuple[int, int]:
        """Job claim long-polls waiting in the server now, and those opened so far, summed over its
        processes: each process's long-poll listener shows them in its pg_stat_activity application_name
        (`mado-longpoll jobs=1/57 ...`, mado.longpoll)."""
        from django.db import connection

        from jobs.services import JOBS_CHANNEL

        with connection.cursor() as cursor:
            cursor.execute("SELECT application_name FROM pg_stat_activity WHERE datname = %s "
                           "AND application_name LIKE 'mado-longpoll %%'", [DB])
            labels = [row[0] for row in cursor.fetchall()]
        key = JOBS_CHANNEL.removeprefix("mado_") + "="
        counts = [part.removeprefix(key).split("/") for label in labels for part in label.split()
                  if part.startswith(key)]
        return sum(int(waiting) for waiting, _ in counts), sum(int(opened) for _, opened in counts)

    def wait_listening(self, since: int) -> None:
        """Until the worker's job claim waits in the server: a long-poll opened after `since` (a count
        from listeners()) that is waiting."""
        def listening():
            if self.worker.poll() is not None:
                raise SystemExit("the worker exited:\n" + self.worker_log.read_text()[-3000:])
            waiting, opened = self.listeners()
            return waiting > 0 and opened > since

        wait_until(listening, 60, "the worker's claim long-poll", interval=0.005)

    # -- jobs --------------------------------------------------------------------------------------

    def api(self, method: str, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(
            f"{self.url}{path}", method=method, data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self.member_token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    def dispatch(self, computer) -> dict:
        """One job, from just before its POST until its process wrote its time; then until it ended."""
        mark = Path(computer.working_dir) / "marks" / uuid.uuid4().hex
        body = {"computer": computer.pk, "runtime": "python", "command": ["python", "-c", STAMP, str(mark)]}
        since = self.listeners()[1]
        posted = time.time()
        job = self.api("POST", "/api/projects/bench/jobs", body)
        answered = time.time()
        wait_until(lambda: mark.exists() and mark.stat().st_size, 120,
                   f"job {job['id']} to start (worker log: {self.worker_log})", interval=0.002)
        ran = float(mark.read_text())
        detail = wait_until(lambda: (d := self.api("GET", f"/api/jobs/{job['id']}"))["status"] in ENDED and d,
                            120, f"job {job['id']} to end", interval=0.05)
        if detail["status"] != "finished":
            raise SystemExit(f"job {job['id']} {detail['status']}: {detail.get('error')}")
        created, claimed, begun = (_epoch(detail[k]) for k in ("created_at", "claimed_at", "started_at"))
        self.wait_listening(since)  # the next job finds the worker waiting, as a queue's next job would
        return {"load": os.getloadavg()[0], "total": ran - posted, "post": answered - posted, "claimed": claimed - created,
                "started": begun - created, "process_after_started": ran - begun}

    # -- idle workers ------------------------------------------------------------------------------

    def open_idle_polls(self) -> float:
        """`--idle` workers of project `idle` say hello and keep their three long-polls open (each poll
        again as soon as one ends, as the worker does); returns the seconds until every job poll waits."""
        import threading

        self.idle_stop = threading.Event()
        started = time.perf_counter()
        since = self.listeners()[1]
        for n in range(self.idle):
            worker_id = f"idle-{n}"
            self.idle_api("/api/worker/hello", {"worker_id": worker_id, "version": "0.1.0", "hostname": worker_id,
                                                "parallel_jobs": 1, "capabilities": ["checks", "reads", "jobs"]})
            for what in ("checks/claim", "reads/claim", "claim"):
                thread = threading.Thread(target=self._idle_poll, args=(f"/api/worker/{what}", worker_id),
                                          daemon=True)
                thread.start()
                self.idle_polls.append(thread)
        wait_until(lambda: self.listeners()[0] >= self.idle and self.listeners()[1] >= since + self.idle, 300,
                   f"{self.idle} idle job long-polls waiting", interval=0.1)
        return time.perf_counter() - started

    def _idle_poll(self, path: str, worker_id: str) -> None:
        while not self.idle_stop.is_set():
            try:
                self.idle_api(path, {"worker_id": worker_id, "wait": 20, "active_job_ids": []}, timeout=60)
            except OSError as exc:
                self.idle_errors = getattr(self, "idle_errors", 0) + 1
                print(f"idle poll {path} of {worker_id}: {exc}", file=sys.stderr)
                self.idle_stop.wait(1)

    def idle_api(self, path: str, body: dict, timeout: float = 30) -> dict:
        request = urllib.request.Request(f"{self.url}{path}", method="POST", data=json.dumps(body).encode(),
                                         headers={"Authorization": f"Bearer {self.idle_token}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return json.loads(answer.read())

    def close(self) -> None:
        from tests.support import kill_processes_under

        if self.idle_stop is not None:
            self.idle_stop.set()
        stop(self.worker)
        stop(self.server)
        for path in self.dirs:  # supervisors and job code left by the worker, on both computers
            kill_processes_under(str(path))
            shutil.rmtree(path, ignore_errors=True)
        if self.sshd is not None:
            self.sshd.stop()


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# Baselines: paramiko against the same sshd ----------------------------------------------------------

def paramiko_client(sshd):
    import logging

    import paramiko

    logging.getLogger("paramiko").setLevel(logging.WARNING)  # not a line per connection

    sock = socket.create_connection(("127.0.0.1", sshd.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    client = paramiko.SSHClient()
    client.load_host_keys(str(sshd.known_hosts_path))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect("127.0.0.1", port=sshd.port, username=sshd.user, key_filename=str(sshd.key_path), sock=sock,
                   allow_agent=False, look_for_keys=False, timeout=10)
    return client


def exec_stamp(client, marks: Path) -> float:
    """The same one-liner as the jobs, over `client`; returns its own start time."""
    mark = marks / uuid.uuid4().hex
    _, stdout, _ = client.exec_command(f"{TARGET_PYTHON} -c \"{STAMP}\" {mark}")
    if stdout.channel.recv_exit_status() != 0:
        raise SystemExit("the baseline command failed on the sshd")
    return float(mark.read_text())


def baselines(bench: Bench, count: int) -> dict[str, list[float]]:
    marks = bench.ssh_dir / "marks"
    client = paramiko_client(bench.sshd)
    try:
        exec_stamp(client, marks)  # the first exec on a transport pays for its first channel
        open_exec = []
        for _ in range(count):
            before = time.time()
            open_exec.append(exec_stamp(client, marks) - before)
    finally:
        client.close()
    fresh = []
    for _ in range(count):
        before = time.time()
        client = paramiko_client(bench.sshd)
        try:
            fresh.append(exec_stamp(client, marks) - before)
        finally:
            client.close()
    local = []
    for _ in range(count):
        mark = marks / uuid.uuid4().hex
        before = time.time()
        subprocess.run([TARGET_PYTHON, "-c", STAMP, str(mark)], check=True)
        local.append(float(mark.read_text()) - before)
    health = [bench.health() for _ in range(count)]
    return {"open_exec": open_exec, "fresh_exec": fresh, "local_spawn": local, "health": health}


# The run --------------------------------------------------------------------------------------------

def run(bench: Bench, jobs: int, cold: int, idle: int = 0) -> None:
    print(f"load average at start: {_load()}; warm jobs per computer: {jobs}; worker restarts per computer: {cold}; "
          f"gunicorn gthread 2 x {bench.threads} threads; MADO_DB_POOL_SIZE={SERVER_ENV.get('MADO_DB_POOL_SIZE', 0)}")
    base = baselines(bench, jobs)
    first_poll = bench.start_worker()
    results = {"first ssh": [bench.dispatch(bench.ssh)], "first local": [bench.dispatch(bench.local)]}
    for kind, computer in (("ssh", bench.ssh), ("local", bench.local)):
        results[f"warm {kind}"] = [bench.dispatch(computer) for _ in range(jobs)]
    if idle:
        opened = bench.open_idle_polls()
        print(f"{idle} idle workers ({idle * 3} long-polls) waiting after {opened:.1f} s; database sessions: "
              f"{database_sessions()}")
        for kind, computer in (("ssh", bench.ssh), ("local", bench.local)):
            results[f"warm {kind} with {idle} idle"] = [bench.dispatch(computer) for _ in range(jobs)]
        print(f"database sessions after: {database_sessions()}; idle poll errors: {getattr(bench, 'idle_errors', 0)}")
        bench.idle_stop.set()
    restarts = []
    for kind, computer in (("ssh", bench.ssh), ("local", bench.local)):
        results[f"cold {kind}"] = []
        for _ in range(cold):
            restarts.append(bench.start_worker())
            results[f"cold {kind}"].append(bench.dispatch(computer))
    base_after = baselines(bench, jobs)  # the load moves: the baselines once before, once after the jobs
    report(results, {k: base[k] + base_after[k] for k in base}, [first_poll, *restarts])


def database_sessions() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [DB])
        return cursor.fetchone()[0]


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" (1/5/15 min, {os.cpu_count()} CPUs)"


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


def report(results: dict[str, list[dict]], base: dict[str, list[float]], restarts: list[float]) -> None:
    print(f"load average at end: {_load()}")
    print()
    for name, values in base.items():
        print(f"baseline {name}: p50 {_ms(statistics.median(values))}, p95 {_ms(_p(values, 0.95))} (n={len(values)})")
    print("  (open_exec: one exec over an open paramiko transport with TCP_NODELAY until the one-liner runs; "
          "fresh_exec: paramiko connect + auth + exec; local_spawn: subprocess.run of the one-liner; "
          "health: GET /api/health)")
    print(f"worker start until its claim long-poll is open: p50 {_ms(statistics.median(restarts))} "
          f"(n={len(restarts)}, not counted in any figure below)")
    print()
    for name, rows in results.items():
        totals = [r["total"] for r in rows]
        median = {k: _ms(statistics.median(r[k] for r in rows)) for k in rows[0] if k != "load"}
        print(f"dispatch {name}: p50 {_ms(statistics.median(totals))}, p95 {_ms(_p(totals, 0.95))}, "
              f"max {_ms(max(totals))} (n={len(rows)}); medians: POST answered after {median['post']}, "
              f"created->claimed {median['claimed']}, created->started {median['started']}, "
              f"started->process {median['process_after_started']}; "
              f"1-min load average {min(r['load'] for r in rows):.1f}-{max(r['load'] for r in rows):.1f}")
    print()
    warm_ssh, warm_local, cold_ssh = (statistics.median(r["total"] for r in results[k])
                                      for k in ("warm ssh", "warm local", "cold ssh"))
    open_exec, fresh = statistics.median(base["open_exec"]), statistics.median(base["fresh_exec"])
    local_spawn = statistics.median(base["local_spawn"])
    print(f"warm ssh p50 {_ms(warm_ssh)}: goal <= {GOAL_WARM_SSH_MS} ms; {warm_ssh / open_exec:.1f}x one exec "
          f"over an open transport")
    print(f"warm local p50 {_ms(warm_local)}: goal <= {GOAL_LOCAL_MS} ms; {warm_local / local_spawn:.1f}x "
          f"a local spawn of the one-liner")
    print(f"cold ssh p50 {_ms(cold_ssh)}: {cold_ssh / fresh:.2f}x a fresh connect + exec "
          f"(goal <= {GOAL_COLD_SSH_X_FRESH:g}x)")
    for kind in ("ssh", "local"):
        idle = [name for name in results if name.startswith(f"warm {kind} with ")]
        if idle:
            busy = statistics.median(r["total"] for r in results[idle[0]])
            quiet = statistics.median(r["total"] for r in results[f"warm {kind}"])
            print(f"{idle[0]} p50 {_ms(busy)}: {busy / quiet:.2f}x without them (goal <= {GOAL_IDLE_X:g}x)")


if __name__ == "__main__":
    main()
