"""Tracking servers the `mado_tracking` SDK is tested against, as real processes that a test can stop and
start again (the server away mid-run):

- `mado_server`: this project's Django server (`manage.py runserver`) on the pytest-django test database
  (PostgreSQL), its MLflow-compatible API at `<url>/mlflow`, with a personal token (read, runs:write).
- `mlflow_server`: the real MLflow tracking server from PyPI (`mlflow server --serve-artifacts`), a peer that
  speaks the same protocol. It is not a dependency of this repository: it runs from its own venv,
  /tmp/mado-test-mlflow-venv ($MADO_TEST_MLFLOW_VENV), which the first run makes with `pip install
  mlflow==<the version of mlflow-skinny in requirements.txt>` (under a file lock, so concurrent pytest
  processes install it once) and later runs reuse. $MADO_TEST_MLFLOW_SERVER names another `mlflow`
  executable instead. When PyPI cannot be reached the tests fail saying so; they are never skipped."""
from __future__ import annotations

import fcntl
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from django.conf import settings as django_settings

from tests.support import wait_for

ROOT = Path(__file__).resolve().parents[2]
MLFLOW_VENV = Path(os.environ.get("MADO_TEST_MLFLOW_VENV", "/tmp/mado-test-mlflow-venv"))
PIP_TIMEOUT = 1200  # a cold install downloads MLflow and its dependencies (~100 MB) on a busy machine


def mlflow_version() -> str:
    """The server is the release of the client this repository pins (mlflow-skinny in requirements.txt)."""
    found = re.search(r"^mlflow-skinny==(\S+)", (ROOT / "requirements.txt").read_text(), re.MULTILINE)
    assert found, "requirements.txt pins no mlflow-skinny==<version>"
    return found.group(1)


def ensure_mlflow_server() -> str:
    """The `mlflow` executable of the real server: $MADO_TEST_MLFLOW_SERVER, or the cached venv, made once."""
    given = os.environ.get("MADO_TEST_MLFLOW_SERVER")
    if given:
        assert os.access(given, os.X_OK), f"MADO_TEST_MLFLOW_SERVER={given} is not an executable"
        return given
    version = mlflow_version()
    mlflow = MLFLOW_VENV / "bin" / "mlflow"
    ready = MLFLOW_VENV / f".installed-mlflow-{version}"  # written last: a half-made venv is made again
    if ready.exists():
        return str(mlflow)
    MLFLOW_VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{MLFLOW_VENV}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another pytest process may be installing it right now
        if not ready.exists():
            _install_mlflow(version)
            ready.touch()
    return str(mlflow)


def _install_mlflow(version: str) -> None:
    base = getattr(sys, "_base_executable", sys.executable)  # not this repository's venv
    subprocess.run([base, "-m", "venv", "--clear", str(MLFLOW_VENV)], check=True, capture_output=True)
    ran = _pip(f"mlflow=={version}")
    if ran.returncode != 0 and f"found for mlflow-tracing=={version}" in ran.stdout + ran.stderr:
        # mlflow pins mlflow-tracing to its own release, which an index may not carry yet; mlflow-skinny (pinned
        # too) ships the same `mlflow.tracing` modules, so the server runs without it.
        ran = _pip("--no-deps", f"mlflow=={version}")
        if ran.returncode == 0:
            ran = _pip(*_requirements_of_mlflow(without="mlflow-tracing"))
    if ran.returncode != 0:
        said = (ran.stdout + ran.stderr).strip()
        unreachable = any(sign in said for sign in (
            "NewConnectionError", "Failed to establish", "Temporary failure in name resolution", "ConnectTimeout",
            "Max retries exceeded"))
        hint = ("PyPI could not be reached: give this machine access to https://pypi.org (or a mirror in pip's "
                "config), " if unreachable else "")
        pytest.fail(f"Installing the real MLflow server (mlflow=={version}) into {MLFLOW_VENV} failed (pip exit "
                    f"code {ran.returncode}). {hint}or set MADO_TEST_MLFLOW_SERVER to an `mlflow` executable of that "
                    f"release. pip said:\n{said[-3000:]}", pytrace=False)


def _pip(*args: str) -> subprocess.CompletedProcess:
    argv = [str(MLFLOW_VENV / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
            "-q", *args]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`pip install {' '.join(args)}` into {MLFLOW_VENV} took over {PIP_TIMEOUT} s: is PyPI "
                    "reachable from here?", pytrace=False)


def _requirements_of_mlflow(without: str) -> list[str]:
    listed = subprocess.run([str(MLFLOW_VENV / "bin" / "python"), "-c",
                             "import importlib.metadata as m; print(\"\\n\".join(m.requires('mlflow')))"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    return [r for r in listed if "extra ==" not in r and not re.match(rf"{re.escape(without)}\b", r)]


def free_port() -> int:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


class ServerProcess:
    """A tracking server as a process group: `down()` stops it (connections are refused, as during a
    restart), `up()` starts it again on the same port and store."""

    def __init__(self, name: str, argv: list[str], env: dict, port: int, tracking_path: str, health_path: str,
                 log: Path, token: str | None = None):
        self.name, self.argv, self.env, self.port = name, argv, env, port
        self.tracking_uri = f"http://127.0.0.1:{port}{tracking_path}"
        self.health_url = f"http://127.0.0.1:{port}{health_path}"
        self.log = log
        self.token = token
        self.process: subprocess.Popen | None = None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def _answers(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.process.returncode}:\n{self.output()[-3000:]}")
        try:
            return requests.get(self.health_url, timeout=2).status_code < 500
        except requests.RequestException:
            return False

    def up(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for(self._answers, timeout=120, interval=0.2, what=f"{self.name} to answer at {self.health_url}")

    def down(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def refuses(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return False
        except OSError:
            return True

    def env_for_sdk(self, **extra) -> dict:
        """The environment of a program using the SDK (the repository on its path)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "MMT_", "MADO_"))}
        env.update(PYTHONPATH=str(ROOT), MLFLOW_TRACKING_URI=self.tracking_uri, PYTHONUNBUFFERED="1")
        if self.token:
            env["MLFLOW_TRACKING_TOKEN"] = self.token
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def api(self, method: str, endpoint: str, body: dict | None = None) -> dict:
        """A plain MLflow REST call, independent of the SDK, for arranging and checking."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        url = f"{self.tracking_uri}/api/2.0/mlflow/{endpoint}"
        response = (requests.get(url, params=body, headers=headers, timeout=30) if method == "GET"
                    else requests.post(url, json=body or {}, headers=headers, timeout=30))
        assert response.status_code == 200, (endpoint, response.status_code, response.text)
        return response.json()

    def history(self, run_id: str, key: str) -> list[dict]:
        points, page_token = [], None
        while True:
            query = {"run_id": run_id, "metric_key": key, "max_results": 25000}
            if page_token:
                query["page_token"] = page_token
            page = self.api("GET", "metrics/get-history", query)
            points += page.get("metrics", [])
            page_token = page.get("next_page_token")
            if not page_token:
                return points


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    mlflow = ensure_mlflow_server()
    base = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    argv = [mlflow, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{base}/mlflow.db", "--serve-artifacts",
            "--artifacts-destination", str(base / "artifacts")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    server = ServerProcess("the MLflow server", argv, env, port, "", "/health", base / "server.log")
    server.up()
    yield server
    server.down()


@pytest.fixture(scope="module")
def mado_server_process(django_db_setup, tmp_path_factory):
    """This project's server as its own process on the test database, one for a module's tests: it keeps
    nothing of a test between requests (each request reads the database; connections close with it), and
    starting it costs seconds."""
    database = django_settings.DATABASES["default"]
    url = (f"postgres://{database['USER']}@{database['HOST'] or '127.0.0.1'}:{database['PORT'] or 5432}/"
           f"{database['NAME']}")
    base = tmp_path_factory.mktemp("mado-server")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MADO_", "MLFLOW_"))}
    env.update(MADO_DATABASE_URL=url, MADO_VAR_DIR=str(base / "var"), MADO_ALLOWED_HOSTS="127.0.0.1,localhost")
    port = free_port()
    argv = [sys.executable, str(ROOT / "manage.py"), "runserver", f"127.0.0.1:{port}", "--noreload"]
    server = ServerProcess("the Mado server", argv, env, port, "/mlflow", "/mlflow/api/2.0/mlflow/experiments/search",
                           base / "server.log")
    server.up()
    yield server
    server.down()


@pytest.fixture
def mado_server(mado_server_process, transactional_db, world):
    """The module's server process with a token of this test's world; a test can stop and restart it (one
    that failed with it stopped leaves it to the next test to start again)."""
    server = mado_server_process
    if server.process.poll() is not None:
        server.up()
    server.token = world.token(world.member, ["read", "runs:write"])
    return server


class LosingProxy:
    """A TCP forwarder in front of a server; while `lose_answers` is set, requests reach the server but its
    answers never come back (a response lost on the way: the client must send again)."""

    def __init__(self, upstream_port: int):
        import threading

        self.upstream = ("127.0.0.1", upstream_port)
        self.lose_answers = False
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.upstream)
            except OSError:
                return
            for source, sink, answers in ((client, server, False), (server, client, True)):
                threading.Thread(target=self._pump, args=(source, sink, answers), daemon=True).start()

    def _pump(self, source, sink, answers: bool) -> None:
        try:
            while data := source.recv(1 << 16):
                if not (answers and self.lose_answers):
                    sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()


@pytest.fixture
def losing_proxy():
    made = []

    def make(port: int) -> LosingProxy:
        made.append(LosingProxy(port))
        return made[-1]

    yield make
    for proxy in made:
        proxy.close()
