"""What the benchmarks share: a PostgreSQL database of their own, gunicorn as docs/deployment.md runs it,
server processes in their own sessions, and waiting on a condition. Imported as `harness` (a benchmark
runs as `python bench/<name>.py`, so this folder is on sys.path)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG = "postgresql://postgres@127.0.0.1:5432"
GUNICORN = "gunicorn==23.0.0"


@contextmanager
def own_database(name: str):
    """Create `name` (the benchmark's MADO_DATABASE_URL points at it) and drop it afterwards, whatever happened."""
    import psycopg

    with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield
    finally:
        if "django.db" in sys.modules:
            from django.db import connections

            connections.close_all()
        with psycopg.connect(f"{PG}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def ensure_gunicorn() -> Path:
    """The venv's gunicorn: docs/deployment.md installs it next to requirements.txt (it is not in it)."""
    gunicorn = Path(sys.executable).with_name("gunicorn")
    if not gunicorn.exists():
        print(f"installing {GUNICORN} into the venv (docs/deployment.md) ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", GUNICORN],
                       check=True)
    return gunicorn


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(command: list[str], env: dict, log: Path) -> subprocess.Popen:
    """A process in its own session, so that stop() reaches its children (gunicorn's workers)."""
    with open(log, "ab") as out:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def stop(process: subprocess.Popen | None, timeout: float = 15) -> None:
    """SIGTERM to the process group, SIGKILL after `timeout` s."""
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def wait_until(predicate, timeout: float, what: str, interval: float = 0.01):
    """Poll `predicate` until it returns something true; stop the benchmark after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def wait_ready(process: subprocess.Popen, url: str, log: Path, what: str = "the server", timeout: float = 120) -> None:
    """Until `url` answers 200; the log's tail if the process exits or never answers."""
    import requests

    deadline = time.monotonic() + timeout
    while process.poll() is None and time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    state = (f"exited ({process.returncode})" if process.poll() is not None
             else f"did not answer {url} within {timeout} s")
    raise SystemExit(f"{what} {state}:\n{log.read_text()[-3000:]}")
