"""Settings come from the environment; bad values stop start-up naming the variable."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_manage(args: list[str], env: dict[str, str], tmp_path) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MADO_") and k != "DJANGO_ALLOW_ASYNC_UNSAFE"}
    base.update({"MADO_VAR_DIR": str(tmp_path)}, **env)
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=base, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("name,value", [
    ("MADO_DEBUG", "maybe"),
    ("MADO_DEV_MODE", "2"),
    ("MADO_DATABASE_URL", "mysql://root@localhost/db"),
    ("MADO_PUBLIC_URL", "ftp://example.org"),
    ("MADO_SECRET_KEY", "short"),
    ("MADO_HSTS_SECONDS", "a year"),
    ("MADO_TOKEN_ISSUE_RATE", "lots"),
    ("MADO_TIME_ZONE", "Mars/Olympus"),
    ("MADO_LOG_LEVEL", "chatty"),
    ("MADO_ALLOWED_HOSTS", " , "),
    ("MADO_MAX_OUTPUT_FILES", "0"),
])
def test_a_bad_value_stops_start_up_naming_the_variable(name, value, tmp_path):
    result = run_manage(["check"], {name: value}, tmp_path)
    assert result.returncode != 0
    assert name in result.stderr


def test_the_servers_output_file_maximum_is_above_the_workers_default(tmp_path):
    """MMT_WORKER_MAX_OUTPUT_FILES (seed 001, 10 000 by default) is the setting a user raises; the server's
    MADO_MAX_OUTPUT_FILES is only its ceiling, so by default a raised worker setting takes effect."""
    from worker_agent.config import DEFAULT_MAX_OUTPUT_FILES

    show = ["shell", "-c", "from django.conf import settings; print(settings.MAX_OUTPUT_FILES)"]
    assert int(run_manage(show, {}, tmp_path).stdout.split()[-1]) == 100_000 > DEFAULT_MAX_OUTPUT_FILES
    assert run_manage(show, {"MADO_MAX_OUTPUT_FILES": "25000"}, tmp_path).stdout.split()[-1] == "25000"


def test_the_demo_secret_key_is_generated_once_into_var_with_mode_600(tmp_path):
    assert run_manage(["check"], {}, tmp_path).returncode == 0
    key_file = tmp_path / "secret_key"
    first = key_file.read_text()
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    assert run_manage(["check"], {}, tmp_path).returncode == 0
    assert key_file.read_text() == first


PRODUCTION = {
    "MADO_DEBUG": "false",
    "MADO_SECRET_KEY": "p" * 20 + "-production-secret-key-that-is-long-and-random-4f9a2c",
    "MADO_PUBLIC_URL": "https://mado.example.org",
    "MADO_ALLOWED_HOSTS": "mado.example.org",
    "MADO_DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres",
}


def test_check_deploy_passes_with_production_like_values(tmp_path):
    result = run_manage(["check", "--deploy", "--fail-level", "WARNING"], PRODUCTION, tmp_path)
    assert result.returncode == 0, result.stderr + result.stdout


def test_check_deploy_warns_when_served_over_plain_http(tmp_path):
    result = run_manage(["check", "--deploy", "--fail-level", "WARNING"],
                        {**PRODUCTION, "MADO_PUBLIC_URL": "http://mado.example.org"}, tmp_path)
    assert result.returncode != 0
    assert "SECURE_SSL_REDIRECT" in result.stderr + result.stdout
