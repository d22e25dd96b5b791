"""The production server exactly as deploy/ describes it: deploy/mado-server.env.example's settings (an
https public URL behind a TLS proxy, persistent database connections, static files served by gunicorn through
WhiteNoise) and deploy/mado-server.service's ExecStart command line, started the way systemd starts a
Type=notify unit (NOTIFY_SOCKET), on the suite's PostgreSQL database. Only what the test must change is
changed: the checkout's path, the port, the secret key, the database and the state directory."""
from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import requests
from django.conf import settings
from django.db import connection

from tests.peers.sshd import free_port
from tests.support import wait_for

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "mado-server.service"
ENV_FILE = ROOT / "deploy" / "mado-server.env.example"
HOST = "compute.example.org"
PROXIED = {"Host": HOST, "X-Forwarded-Proto": "https"}


def unit_value(name: str) -> str:
    text = re.sub(r"\\\n\s*", " ", UNIT.read_text())
    return next(line.split("=", 1)[1] for line in text.splitlines() if line.startswith(f"{name}="))


def env_file_values() -> dict[str, str]:
    values = {}
    for line in ENV_FILE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            values[name] = value
    return values


def database_url() -> str:
    db = settings.DATABASES["default"]
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{db['USER']}{password}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@pytest.fixture
def production_env():
    """The environment file with this machine's database, a real key and a throw-away MADO_VAR_DIR."""
    var_dir = tempfile.mkdtemp(prefix="mado-production-")
    values = env_file_values()
    assert values["MADO_PUBLIC_URL"] == f"https://{HOST}" and values["MADO_BEHIND_PROXY"] == "true"
    values.update(MADO_SECRET_KEY=secrets.token_urlsafe(64), MADO_DATABASE_URL=database_url(), MADO_VAR_DIR=var_dir)
    base = {k: v for k, v in os.environ.items() if not k.startswith("MADO_") and k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
    yield {**base, **values}
    subprocess.run(["rm", "-rf", var_dir], check=False)


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_check_deploy_is_clean_with_the_production_environment_file(production_env):
    result = manage(production_env, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def other_sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid()")
        return cursor.fetchone()[0]


def test_the_systemd_command_line_serves_the_schema_static_files_and_keeps_connections(
        transactional_db, world, production_env, tmp_path):
    collected = manage(production_env, "collectstatic", "--no-input")
    assert collected.returncode == 0, collected.stderr
    static_root = Path(production_env["MADO_VAR_DIR"]) / "static"
    hashed_css = json.loads((static_root / "staticfiles.json").read_text())["paths"]["css/mado.css"]
    assert hashed_css != "css/mado.css"

    argv = shlex.split(unit_value("ExecStart"))
    assert argv[0] == "/opt/mado/.venv/bin/gunicorn" and unit_value("WorkingDirectory") == "/opt/mado"
    argv[0] = str(Path(sys.executable).parent / "gunicorn")
    port = free_port()
    argv[argv.index("--bind") + 1] = f"127.0.0.1:{port}"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(120)
    log = open(tmp_path / "gunicorn.log", "wb")
    server = subprocess.Popen(argv, cwd=ROOT, env={**production_env, "NOTIFY_SOCKET": str(tmp_path / "notify")},
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # Type=notify: systemd counts the unit started when gunicorn says READY=1.
        assert notify.recv(4096).startswith(b"READY=1"), "gunicorn tells systemd it is ready"
        url = f"http://127.0.0.1:{port}"

        schema = requests.get(f"{url}/api/schema/", headers=PROXIED, timeout=60)
        assert schema.status_code == 200, schema.text[:500]
        assert schema.text.startswith("openapi: 3") and "title: Mado Compute API" in schema.text
        assert "max-age=31536000" in schema.headers["Strict-Transport-Security"]

        plain = requests.get(f"{url}/api/schema/", headers={"Host": HOST}, allow_redirects=False, timeout=60)
        assert plain.status_code == 301, "without the proxy's X-Forwarded-Proto: https the request is plain HTTP"
        assert plain.headers["Location"] == f"https://{HOST}/api/schema/"

        page = requests.get(f"{url}/login/", headers=PROXIED, timeout=60)
        assert page.status_code == 200
        assert f'/static/{hashed_css}"' in page.text, "pages link the content-hashed file"
        css = requests.get(f"{url}/static/{hashed_css}", headers={**PROXIED, "Accept-Encoding": "gzip"}, timeout=60)
        assert css.status_code == 200
        assert css.headers["Content-Encoding"] == "gzip"
        assert "immutable" in css.headers["Cache-Control"]
        assert css.text == (ROOT / "static" / "css" / "mado.css").read_text()

        # MADO_DB_POOL_SIZE (the env file): the pool keeps the connection of a request open for the next one.
        me = requests.get(f"{url}/api/auth/token", headers={**PROXIED, "Authorization": f"Bearer {world.worker_token}"},
                          timeout=60)
        assert me.status_code == 200, me.text
        wait_for(lambda: other_sessions() >= 1, timeout=30, what="gunicorn's database connection")
    finally:
        # systemctl stop: SIGTERM to gunicorn, which lets its workers finish (KillMode=mixed).
        os.killpg(server.pid, signal.SIGTERM)
        code = server.wait(timeout=int(unit_value("TimeoutStopSec")))
        log.close()
        notify.close()
    assert code == 0, (tmp_path / "gunicorn.log").read_text()[-2000:]
    wait_for(lambda: other_sessions() == 0, timeout=30, what="gunicorn's connections to close")
