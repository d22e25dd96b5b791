"""Fixtures of the sites-agent tests: the shared real sshd as a site's login node, a second sshd as a
jump host, keys of a launcher state directory authorized on them, directories in the login user's
home, and the live server with a site, a registered launcher and its token."""
from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.peers.sshd import Sshd, sshd, start_sshd  # noqa: F401  (sshd: the shared fixture)
from worker_agent.site.keys import KeyStore
from worker_agent.site.login import SiteLogin, SitePool


@pytest.fixture(scope="session")
def jump_sshd():
    """A second sshd on another port: the jump host."""
    server = start_sshd()
    yield server
    server.stop()


def authorize(server: Sshd, public_key: str) -> None:
    """What the site's owner does with the key the computer's details show."""
    with open(server.server_dir / "authorized_keys", "a") as handle:
        handle.write(public_key.strip() + "\n")


def known_hosts_text(*servers: Sshd) -> str:
    return "".join(server.known_hosts_path.read_text() for server in servers)


def fingerprint_of(public_key_file: Path) -> str:
    return subprocess.run(["ssh-keygen", "-l", "-f", str(public_key_file)], capture_output=True, text=True,
                          check=True).stdout.split()[1]


@pytest.fixture
def keystore(tmp_path) -> KeyStore:
    state = tmp_path / "launcher-state"
    state.mkdir(mode=0o700)
    return KeyStore(state)


@pytest.fixture
def site_key(keystore, sshd, jump_sshd):
    """The launcher's key for computer 1 (shared account), authorized on the login node and the jump host."""
    pair, _ = keystore.ensure(1, None)
    authorize(sshd, pair.public_key)
    authorize(jump_sshd, pair.public_key)
    return pair


@pytest.fixture
def login(sshd, site_key):
    def make(**overrides) -> SiteLogin:
        fields = {"host": "127.0.0.1", "port": sshd.port, "user": sshd.user, "key_path": str(site_key.path),
                  "known_hosts": known_hosts_text(sshd)}
        fields.update(overrides)
        return SiteLogin(**fields)

    return make


@pytest.fixture
def pool():
    p = SitePool()
    yield p
    p.close_all()


@pytest.fixture
def remote_dir(sshd):
    """A path in the login user's home that does not exist yet (the writer creates it), removed afterwards."""
    path = sshd.home / f"site-{uuid.uuid4().hex[:8]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def isolated_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in list(os.environ):
        if name.startswith("MMT_") or name == "XDG_STATE_HOME":
            monkeypatch.delenv(name, raising=False)
    return home
