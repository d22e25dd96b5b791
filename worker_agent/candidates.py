"""SSH key and known_hosts candidates offered in Add computer: paths only, never contents.

Looks directly in `~/.ssh` and `MMT_WORKER_SSH_DIR` (top level only). Private keys: `id_*`, `*.pem`,
`*.key`, or any file only its owner can read; `.pub`, `known_hosts*`, `authorized_keys*`, `config`
and similar are never keys. known_hosts: names starting with `known_hosts`. At most 50 of each."""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

LIMIT = 50
NOT_KEYS = {"config", "environment", "rc", "authorized_keys", "authorized_keys2"}
NOT_KEY_SUFFIXES = (".pub", ".old", ".bak", ".swp", ".sock", ".orig", "~")


@dataclass
class Candidates:
    ssh_keys: list[str] = field(default_factory=list)
    known_hosts: list[str] = field(default_factory=list)


def is_key_name(name: str, mode: int) -> bool:
    if name in NOT_KEYS or name.startswith(("known_hosts", "authorized_keys", "config.")) \
            or name.endswith(NOT_KEY_SUFFIXES):
        return False
    if name.startswith("id_") or name.endswith((".pem", ".key")):
        return True
    # Any other file only its owner can read (mode 600 or 400): most keys created by hand look so.
    return bool(mode & stat.S_IRUSR) and not mode & 0o077


def scan(directories: list[Path]) -> Candidates:
    found = Candidates()
    for directory in directories:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        base = os.path.abspath(directory)
        for name in names:
            path = os.path.join(base, name)
            try:
                st = os.stat(path)  # follows links: a linked key is still a key
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if name.startswith("known_hosts"):
                if path not in found.known_hosts and len(found.known_hosts) < LIMIT:
                    found.known_hosts.append(path)
            elif is_key_name(name, st.st_mode):
                if path not in found.ssh_keys and len(found.ssh_keys) < LIMIT:
                    found.ssh_keys.append(path)
    return found
