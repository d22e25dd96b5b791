"""Fixtures of the worker-agent tests: a real sshd (session-wide), a connection pool, and helpers to
prepare files on the target as its login user."""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from tests.peers.sshd import Sshd, sshd, start_sshd  # noqa: F401  (sshd: the shared fixture)
from worker_agent.ssh import ConnectionPool


@pytest.fixture
def pool():
    p = ConnectionPool()
    yield p
    p.close_all()


@pytest.fixture
def target_dir(sshd):
    """A fresh directory in the login user's home, owned by that user, removed afterwards."""
    path = sshd.home / f"t-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    os.chown(path, _uid(sshd), _gid(sshd))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _uid(sshd) -> int:
    return sshd.home.stat().st_uid


def _gid(sshd) -> int:
    return sshd.home.stat().st_gid


def chown_tree(sshd, path: Path) -> None:
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), _uid(sshd), _gid(sshd))
    os.lchown(path, _uid(sshd), _gid(sshd))


def listing(*roots: Path, skip=lambda path: False) -> dict[str, tuple]:
    """Every path under `roots` with its kind, owner, size and mtime: what a check must leave
    unchanged. `skip` leaves out directories that other tests (maybe of another run on this machine)
    change meanwhile."""
    seen = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if not skip(os.path.join(dirpath, d))]
            for name in dirnames + filenames:
                p = os.path.join(dirpath, name)
                try:
                    st = os.lstat(p)
                except FileNotFoundError:  # removed by someone else while we looked
                    continue
                seen[p] = (st.st_mode, st.st_uid, st.st_size, 0 if os.path.isdir(p) else st.st_mtime_ns)
    return seen


@pytest.fixture
def isolated_home(tmp_path, monkeypatch):
    """HOME (and the XDG variables) pointing into a temporary directory."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("XDG_STATE_HOME", "XDG_CONFIG_HOME", "MMT_API_URL", "MMT_API_TOKEN", "MMT_API_TOKEN_FILE",
                 "MMT_WORKER_ID", "MMT_WORKER_TARGET_IDS", "MMT_WORKER_STATE_DIR", "MMT_WORKER_SSH_DIR",
                 "MADO_DEV_MODE", "MMT_ALLOW_LOCAL_EXECUTOR"):
        monkeypatch.delenv(name, raising=False)
    return home
