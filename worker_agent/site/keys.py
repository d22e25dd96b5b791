"""The launcher's login keys: one ed25519 key per site for a shared account, one per (site, person) for
personal accounts. Made with the `cryptography` package (paramiko depends on it, so no ssh-keygen is
needed on the launcher's host), kept in `<state dir>/keys/` (700; private keys 600). Only the public
key ever leaves this module's files: the launcher publishes it with `POST /api/launcher/keys`."""
from __future__ import annotations

import base64
import hashlib
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

log = logging.getLogger("mado.launcher.keys")


class KeyFileError(Exception):
    """A key file is unusable; the message says what to do."""


@dataclass(frozen=True)
class KeyPair:
    computer: int
    user: int | None
    path: Path
    public_key: str

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.public_key)

    def load(self) -> paramiko.PKey:
        check_private_file(self.path)
        try:
            return paramiko.Ed25519Key(filename=str(self.path))
        except (paramiko.SSHException, OSError, ValueError):
            raise KeyFileError(f"The launcher's key file {self.path} cannot be read as an ed25519 key: delete it (and "
                            f"its .pub), and the launcher makes and publishes a new one.") from None


def fingerprint(public_key: str) -> str:
    """`SHA256:…` as `ssh-keygen -l` prints it, from an OpenSSH public key line."""
    parts = public_key.split()
    blob = base64.b64decode(parts[1]) if len(parts) >= 2 else b""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def check_private_file(path: Path) -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        raise KeyFileError(f"{path} must be a regular file, not a link: delete it and the launcher makes a new key.")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise KeyFileError(f"The private key {path} has mode {stat.S_IMODE(st.st_mode):o}, so other users may have "
                        f"read it: delete it (and its .pub) so the launcher makes and publishes a new key.")


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Write a file that must not exist yet (O_EXCL, never through a link), then fsync it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class KeyStore:
    """`<state dir>/keys/<computer>-shared` and `<computer>-user-<id>` (with `.pub`)."""

    def __init__(self, state_dir: Path):
        self.dir = Path(state_dir) / "keys"

    def ensure_dir(self) -> None:
        if not os.path.lexists(self.dir):
            os.mkdir(self.dir, 0o700)
        st = os.lstat(self.dir)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise KeyFileError(f"{self.dir} must be a directory (not a link): move it away and start the launcher "
                               "again.")
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(self.dir, 0o700)

    def path(self, computer: int, user: int | None) -> Path:
        name = f"{int(computer)}-shared" if user is None else f"{int(computer)}-user-{int(user)}"
        return self.dir / name

    def get(self, computer: int, user: int | None) -> KeyPair | None:
        """The key pair if it exists (None otherwise); never creates one."""
        path = self.path(computer, user)
        public = Path(f"{path}.pub")
        if not path.exists() or not public.exists():
            return None
        return KeyPair(int(computer), user, path, public.read_text(encoding="ascii").strip())

    def recreate(self, computer: int, user: int | None) -> KeyPair:
        """A new key pair for (computer, user), replacing the old one."""
        path = self.path(computer, user)
        for old in (path, Path(f"{path}.pub")):
            if os.path.lexists(old):
                os.unlink(old)
        pair, _ = self.ensure(computer, user)
        return pair

    def ensure(self, computer: int, user: int | None) -> tuple[KeyPair, bool]:
        """The key pair for (computer, user), made now if missing. Returns (pair, created)."""
        existing = self.get(computer, user)
        if existing is not None:
            return existing, False
        self.ensure_dir()
        path = self.path(computer, user)
        private = Ed25519PrivateKey.generate()
        private_bytes = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                              serialization.NoEncryption())
        who = "shared" if user is None else f"user-{int(user)}"
        public = private.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                   serialization.PublicFormat.OpenSSH).decode("ascii")
        public = f"{public} mado-launcher-{int(computer)}-{who}"
        for stale in (path, Path(f"{path}.pub")):  # a half-made pair from an earlier crash
            if os.path.lexists(stale):
                os.unlink(stale)
        _write_new(path, private_bytes, 0o600)
        _write_new(Path(f"{path}.pub"), (public + "\n").encode("ascii"), 0o600)
        pair = KeyPair(int(computer), user, path, public)
        log.info("made a new ed25519 key for computer %s (%s): %s", computer, who, pair.fingerprint)
        return pair, True
