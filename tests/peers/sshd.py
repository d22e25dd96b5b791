"""A real OpenSSH server on a free loopback port, for tests (recipe: shared/peers/README.md).

Generated host key and client key, a login user `mmt` (created if missing, password locked with `*`
so `UsePAM no` accepts it), `StrictModes no`, and a known_hosts written by `ssh-keyscan`. Stopped by
its PID."""
from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = "/usr/sbin/sshd"
LOGIN_USER = "mmt"

CONFIG = """\
Port {port}
ListenAddress 127.0.0.1
HostKey {dir}/host_ed25519
PidFile {dir}/sshd.pid
AuthorizedKeysFile {dir}/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin no
UsePAM no
AllowUsers {user}
StrictModes no
Subsystem sftp internal-sftp
LogLevel VERBOSE
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_login_user(name: str = LOGIN_USER) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True)
        subprocess.run(["usermod", "-p", "*", name], check=True)
        return pwd.getpwnam(name)


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "mado-test", "-f", str(path)], check=True)
    return (path.with_suffix(".pub") if path.suffix else Path(str(path) + ".pub")).read_text().strip()


@dataclass
class Sshd:
    port: int
    user: str
    home: Path
    server_dir: Path
    client_dir: Path
    key_path: Path
    known_hosts_path: Path
    process: subprocess.Popen

    def connection(self, **overrides) -> dict:
        """Connection fields as the server sends them in a check or read."""
        fields = {"kind": "ssh", "host": "127.0.0.1", "port": self.port, "ssh_user": self.user,
                  "ssh_key_path": str(self.key_path), "known_hosts_path": str(self.known_hosts_path)}
        fields.update(overrides)
        return fields

    def host_public_key(self) -> str:
        return (self.server_dir / "host_ed25519.pub").read_text().strip()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.server_dir, ignore_errors=True)
        shutil.rmtree(self.client_dir, ignore_errors=True)


def start_sshd() -> Sshd:
    user = ensure_login_user()
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    # The server side must be readable by the login user: sshd reads authorized_keys as that user.
    server_dir = Path(tempfile.mkdtemp(prefix="mado-sshd-"))
    os.chmod(server_dir, 0o755)
    client_dir = Path(tempfile.mkdtemp(prefix="mado-ssh-client-"))  # mode 700: the worker's ~/.ssh
    keygen(server_dir / "host_ed25519")
    client_public = keygen(client_dir / "id_ed25519")
    (server_dir / "authorized_keys").write_text(client_public + "\n")
    os.chmod(server_dir / "authorized_keys", 0o644)
    port = free_port()
    config = server_dir / "sshd_config"
    config.write_text(CONFIG.format(port=port, dir=server_dir, user=user.pw_name))
    log = open(server_dir / "sshd.log", "wb")
    process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        if process.poll() is not None:
            raise RuntimeError("sshd exited: " + (server_dir / "sshd.log").read_text())
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                raise RuntimeError("sshd did not listen within 10 s") from None
            time.sleep(0.02)
    scan = subprocess.run(["ssh-keyscan", "-t", "ed25519", "-p", str(port), "127.0.0.1"], capture_output=True,
                          text=True, timeout=10, check=True)
    known_hosts = client_dir / "known_hosts"
    known_hosts.write_text(scan.stdout)
    os.chmod(known_hosts, 0o644)
    return Sshd(port=port, user=user.pw_name, home=Path(user.pw_dir), server_dir=server_dir, client_dir=client_dir,
                key_path=client_dir / "id_ed25519", known_hosts_path=known_hosts, process=process)


@pytest.fixture(scope="session")
def sshd() -> Sshd:
    """A real sshd for the tests of one directory; its conftest imports this fixture."""
    server = start_sshd()
    yield server
    server.stop()
