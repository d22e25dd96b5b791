"""Fixtures of the sites tests: a launcher, host keys for known_hosts, the fields of a valid site, and
the real Slurm and Grid Engine (session-scoped, from tests/peers)."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from jobs.models import Job
from mado.services import Actor
from sites import services
from sites.models import Launcher

LOGIN_HOST = "login.hpc.example.org"
JUMP_HOST = "gw.hpc.example.org"
# The hosts the tests' launchers may log in to (sites.allowed_hosts): a new launcher logs in nowhere.
TEST_ALLOWED_HOSTS = ["*.example.org", "10.0.0.*", "127.0.0.1", "h.example"]


@dataclass
class HostKeys:
    """known_hosts lines as ssh-keyscan prints them, and the fingerprints ssh-keygen -l prints."""

    login_line: str
    login_fingerprint: str
    jump_line: str
    jump_fingerprint: str
    rsa_line: str
    rsa_fingerprint: str


def _key(directory: Path, name: str, key_type: str, hosts: str) -> tuple[str, str]:
    path = directory / name
    bits = ["-b", "2048"] if key_type == "rsa" else []
    subprocess.run(["ssh-keygen", "-q", "-t", key_type, *bits, "-N", "", "-C", "", "-f", str(path)], check=True)
    public = Path(f"{path}.pub")
    kind, blob = public.read_text().split()[:2]
    listing = subprocess.run(["ssh-keygen", "-l", "-f", str(public)], capture_output=True,
                             text=True, check=True).stdout.split()
    return f"{hosts} {kind} {blob}", listing[1]


@pytest.fixture(scope="session")
def host_keys(tmp_path_factory) -> HostKeys:
    directory = tmp_path_factory.mktemp("host-keys")
    login_line, login_fp = _key(directory, "login.key", "ed25519", f"{LOGIN_HOST},10.0.0.5")
    jump_line, jump_fp = _key(directory, "jump.key", "ed25519", f"[{JUMP_HOST}]:2222")
    rsa_line, rsa_fp = _key(directory, "login-rsa.key", "rsa", LOGIN_HOST)
    return HostKeys(login_line, login_fp, jump_line, jump_fp, rsa_line, rsa_fp)


@pytest.fixture
def launcher(world) -> Launcher:
    return Launcher.objects.create(name="hpc-launcher", created_by=world.global_admin,
                                   allowed_hosts=TEST_ALLOWED_HOSTS)


@pytest.fixture
def site_fields(launcher, host_keys):
    """The fields of a valid automatic, shared-account Slurm site; keyword arguments replace fields."""

    def fields(**overrides) -> dict:
        data = {
            "name": "hpc-cluster", "submission": "automatic", "account": "shared", "launcher": launcher.pk,
            "host": LOGIN_HOST, "port": 22, "ssh_user": "mmtshared", "jump_hosts": [],
            "known_hosts": host_keys.login_line + "\n", "working_dir": "/work/mmt", "runner_python": "/usr/bin/python3",
            "runner_api_url": "https://tracking.example.org", "variables": "PARTITION=gpu\nCPUS=4",
            "template": "slurm",
        }
        data.update(overrides)
        return data

    return fields


@pytest.fixture
def make_site(site_fields):
    def make(user, **overrides):
        return services.create_site(Actor(user), site_fields(**overrides))

    return make


def make_job(target, user, project, **fields) -> Job:
    return Job.objects.create(project=project, created_by=user, target=target, command=["python", "train.py"],
                              **fields)
