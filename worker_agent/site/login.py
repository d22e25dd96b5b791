"""Logging in to a site's login node: paramiko, through up to 8 jump hosts, with the launcher's own key.

Host keys are checked against the site's pasted known_hosts text only: never a system or user file
(nothing is loaded into paramiko's host key tables; every key goes through `_Verify`, a RejectPolicy
that accepts exactly the keys the text lists for that `host` / `[host]:port`, including hashed names,
wildcards and negations, and refuses `@revoked` keys). A refusal names the fingerprint the server
showed, so the owner can compare it with the one the site publishes.

Jump hosts are `[user@]host[:port]`; each hop is a `direct-tcpip` channel through the previous one,
logged in with the same account and key unless the entry names a user. The connection machinery
(one transport per login, re-opened when it failed, commands with a deadline, a pool that closes idle
connections) is worker_agent.ssh's; only how the transport is made differs."""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import re
import socket
from dataclasses import dataclass

import paramiko

from worker_agent.site.keys import KeyFileError, check_private_file
from worker_agent.ssh import (
    KEEPALIVE_SECONDS,
    CommandTimeout,
    Connection,
    ConnectionPool,
    ConnectError,
    RunResult,
    _transport_factory,
    keyscan_hint,
    known_hosts_name,
    open_socket,
)

log = logging.getLogger("mado.launcher.ssh")

CONNECT_TIMEOUT = 10.0
REUSE_SECONDS = 60.0
MAX_JUMP_HOSTS = 8
JUMP_HOST = re.compile(r"^(?:(?P<user>[A-Za-z0-9_][A-Za-z0-9_.-]{0,63})@)?"
                       r"(?P<host>[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:]{2,39}\])(?::(?P<port>[0-9]{1,5}))?$")
# paramiko's names for the signature algorithms of one known_hosts key type.
_SIGNATURE_TYPES = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")}

__all__ = ["CommandTimeout", "ConnectError", "Hop", "KnownHosts", "RunResult", "SiteConnection", "SiteLogin",
           "SitePool", "run_script"]


@dataclass(frozen=True)
class Hop:
    user: str
    host: str
    port: int = 22

    @property
    def label(self) -> str:
        return f"{self.user}@{self.host}" + (f":{self.port}" if self.port != 22 else "")


def parse_jump(entry: str, default_user: str) -> Hop:
    match = JUMP_HOST.fullmatch(entry.strip())
    if not match or (match["port"] and not 1 <= int(match["port"]) <= 65535):
        raise ConnectError("ssh_configuration", f"The jump host {entry[:80]!r} is not [user@]host[:port]: correct "
                                                "it in the computer's settings.")
    return Hop(match["user"] or default_user, match["host"].strip("[]"), int(match["port"] or 22))


@dataclass(frozen=True)
class SiteLogin:
    """Everything that identifies one login (also the pool's key: a changed setting is a new login)."""
    host: str
    port: int
    user: str
    key_path: str
    known_hosts: str
    jump_hosts: tuple[str, ...] = ()

    def hops(self) -> list[Hop]:
        if len(self.jump_hosts) > MAX_JUMP_HOSTS:
            raise ConnectError("ssh_configuration", f"At most {MAX_JUMP_HOSTS} jump hosts: remove some in the "
                                                    "computer's settings.")
        if not self.host or not 1 <= int(self.port) <= 65535 or not self.user:
            raise ConnectError("ssh_configuration", "The login node's host, port or account is missing: complete "
                                                    "the computer's settings (and My settings for your own account).")
        return [parse_jump(j, self.user) for j in self.jump_hosts] + [Hop(self.user, self.host, int(self.port))]

    @property
    def label(self) -> str:
        return f"{self.user}@{self.host}" + (f":{self.port}" if self.port != 22 else "")


# -- known_hosts ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Line:
    marker: str
    hosts: str
    key_type: str
    blob: bytes

    def matches(self, name: str) -> bool:
        """OpenSSH's matching: hashed names (|1|salt|hmac), wildcards, negations."""
        matched = False
        for pattern in self.hosts.split(","):
            if pattern.startswith("|1|"):
                if _hashed_match(pattern, name):
                    matched = True
                continue
            negated = pattern.startswith("!")
            if _wildcard_match(name, pattern.lstrip("!")):
                if negated:
                    return False
                matched = True
        return matched


def _wildcard_match(name: str, pattern: str) -> bool:
    """OpenSSH patterns: only * and ? are special ([host]:port brackets are literal), case-insensitive."""
    regex = "".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern)
    return re.fullmatch(regex, name, re.IGNORECASE) is not None


def _hashed_match(entry: str, name: str) -> bool:
    try:
        _, _, salt, digest = entry.split("|")
        mac = hmac.new(base64.b64decode(salt), name.encode(), hashlib.sha1).digest()
        return hmac.compare_digest(mac, base64.b64decode(digest))
    except (ValueError, binascii.Error):
        return False


def key_fingerprint(blob: bytes) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


class KnownHosts:
    """The site's pasted known_hosts text. Lines that are not key lines are skipped (the server has
    already refused such text when the owner saved it)."""

    def __init__(self, text: str):
        self.lines: list[_Line] = []
        for raw in (text or "").splitlines():
            fields = raw.split()
            if not fields or fields[0].startswith("#"):
                continue
            marker = fields.pop(0) if fields[0].startswith("@") else ""
            if len(fields) < 3:
                continue
            try:
                blob = base64.b64decode(fields[2], validate=True)
            except (binascii.Error, ValueError):
                continue
            self.lines.append(_Line(marker, fields[0], fields[1], blob))

    def keys_for(self, hop: Hop) -> list[_Line]:
        return [line for line in self.lines if not line.marker and line.matches(known_hosts_name(hop))]

    def is_revoked(self, blob: bytes) -> bool:
        return any(line.marker == "@revoked" and line.blob == blob for line in self.lines)

    def key_types_for(self, hop: Hop) -> set[str]:
        types: set[str] = set()
        for line in self.keys_for(hop):
            types.update(_SIGNATURE_TYPES.get(line.key_type, (line.key_type,)))
        return types


class HostKeyRefused(paramiko.SSHException):
    def __init__(self, error: ConnectError):
        super().__init__(error.detail)
        self.error = error


class _Verify(paramiko.RejectPolicy):
    """Called for every host key (paramiko's own tables stay empty): accepts exactly the pasted keys."""

    def __init__(self, known: KnownHosts, hop: Hop):
        self.known = known
        self.hop = hop

    def missing_host_key(self, client, hostname, key):
        blob = key.asbytes()
        listed = self.known.keys_for(self.hop)
        seen = f"{key_fingerprint(blob)} ({key.get_name()})"
        name, keyscan = known_hosts_name(self.hop), keyscan_hint(self.hop)
        if self.known.is_revoked(blob):
            raise HostKeyRefused(ConnectError(
                "host_key_changed", f"The host key of {name} is {seen}, which the computer's "
                                    "known_hosts marks @revoked: the launcher does not log in there."))
        if any(line.blob == blob for line in listed):
            return
        if not listed:
            raise HostKeyRefused(ConnectError(
                "host_key_unknown",
                f"The host key of {name} is {seen}, and the computer's known_hosts has no key for "
                f"{name}. Compare that fingerprint with the one the site publishes; if it matches, "
                f"paste the output of {keyscan} into known_hosts in the computer's settings."))
        expected = ", ".join(sorted({key_fingerprint(line.blob) for line in listed}))
        raise HostKeyRefused(ConnectError(
            "host_key_changed",
            f"The host key of {name} is {seen}, but the computer's known_hosts lists {expected}. "
            f"If the site was reinstalled, verify the new fingerprint with the site and paste the output of "
            f"{keyscan} into known_hosts; otherwise treat it as an attack."))


# -- connections ---------------------------------------------------------------------------------

def _load_key(path: str) -> paramiko.PKey:
    try:
        check_private_file(path)
        return paramiko.Ed25519Key(filename=path)
    except FileNotFoundError:
        raise ConnectError("ssh_configuration", "The launcher has no key for this login yet: it makes one on its "
                                                "next poll; register the public key, then try again.") from None
    except KeyFileError as exc:
        raise ConnectError("ssh_configuration", str(exc)) from None
    except (paramiko.SSHException, OSError, ValueError):
        raise ConnectError("ssh_configuration", "The launcher's key for this login cannot be read: delete it in the "
                                                "launcher's state directory so a new one is made.") from None


# worker_agent.ssh.open_socket's sentences, in the launcher's words.
SOCKET_ERRORS = {
    socket.gaierror: "The host name {host} cannot be resolved on the launcher's host: check the host (or the first "
                     "jump host).",
    ConnectionRefusedError: "The connection to {where} was refused: check the host and port.",
    TimeoutError: "No answer from {where} within {timeout:.0f} s: check the host, the port and any firewall between "
                  "the launcher and the site.",
    OSError: "Cannot connect to {where} ({error}).",
}


def _tunnel(via: paramiko.SSHClient, previous: Hop, hop: Hop, timeout: float) -> paramiko.Channel:
    try:
        return via.get_transport().open_channel("direct-tcpip", (hop.host, hop.port), ("127.0.0.1", 0),
                                                timeout=timeout)
    except (paramiko.SSHException, EOFError, OSError):
        raise ConnectError("ssh_failed", f"The jump host {previous.host} could not open a connection to "
                                         f"{hop.host}:{hop.port}: check that host and port, and that the jump host "
                                         "allows TCP forwarding.") from None


def _login(hop: Hop, sock, pkey: paramiko.PKey, known: KnownHosts, timeout: float, what: str) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(_Verify(known, hop))
    wanted = known.key_types_for(hop)

    def factory(channel_or_socket, **kwargs):
        transport = _transport_factory(channel_or_socket, **kwargs)
        options = transport.get_security_options()
        # Ask for a host key of a type the site's known_hosts lists, so a server that offers several
        # keys shows the one that can be verified.
        preferred = tuple(t for t in options.key_types if t in wanted)
        if preferred:
            options.key_types = preferred
        return transport

    try:
        client.connect(hop.host, port=hop.port, username=hop.user, pkey=pkey, sock=sock, timeout=timeout,
                       banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout, allow_agent=False,
                       look_for_keys=False, transport_factory=factory)
    except HostKeyRefused as exc:
        client.close()
        raise exc.error from None
    except paramiko.AuthenticationException:
        client.close()
        raise ConnectError("ssh_failed", f"{what} {hop.label} refused the launcher's key: add the public key shown in "
                                         f"the computer's details to ~{hop.user}/.ssh/authorized_keys there (or "
                                         "register it by the site's method).") from None
    except (paramiko.SSHException, EOFError, OSError):
        client.close()
        raise ConnectError("ssh_failed", f"The SSH handshake with {what} {hop.host}:{hop.port} failed: check that "
                                         "it is an SSH server that accepts the launcher's connection.") from None
    client.get_transport().set_keepalive(KEEPALIVE_SECONDS)
    return client


class SiteConnection(Connection):
    """worker_agent.ssh.Connection whose transport is made through the jump hosts with the pasted keys."""

    target: SiteLogin

    def __init__(self, login: SiteLogin, *, connect_timeout: float = CONNECT_TIMEOUT):
        super().__init__(login, connect_timeout=connect_timeout)  # type: ignore[arg-type]
        self._jumps: list[paramiko.SSHClient] = []

    def _connect(self) -> None:
        self._close_client()
        login = self.target
        hops = login.hops()
        pkey = _load_key(login.key_path)
        known = KnownHosts(login.known_hosts)
        clients: list[paramiko.SSHClient] = []
        try:
            sock = open_socket(hops[0].host, hops[0].port, self.connect_timeout, SOCKET_ERRORS)
            for index, hop in enumerate(hops):
                if index:
                    sock = _tunnel(clients[-1], hops[index - 1], hop, self.connect_timeout)
                what = "the login node" if index == len(hops) - 1 else f"jump host {index + 1}"
                clients.append(_login(hop, sock, pkey, known, self.connect_timeout, what))
        except BaseException:
            for client in reversed(clients):
                client.close()
            raise
        self._jumps = clients[:-1]
        self._client = clients[-1]
        log.debug("logged in to %s through %d jump host(s)", login.label, len(self._jumps))

    def _close_client(self) -> None:
        super()._close_client()
        for client in reversed(getattr(self, "_jumps", [])):
            try:
                client.close()
            except Exception:  # a dead transport: gone either way
                pass
        self._jumps = []


class SitePool(ConnectionPool):
    """One connection per login, closed after 60 s unused."""

    def __init__(self, *, idle_seconds: float = REUSE_SECONDS, connect_timeout: float = CONNECT_TIMEOUT):
        super().__init__(idle_seconds=idle_seconds, connect_timeout=connect_timeout)

    def _new(self, target: SiteLogin):  # type: ignore[override]
        return SiteConnection(target, connect_timeout=self.connect_timeout)


def run_script(connection, script: str, *, timeout: float) -> RunResult:
    """Run a bash script on the login node: the text goes on stdin (`bash -s`), never on a command line."""
    return connection.run(["bash", "-s"], stdin=script.encode("utf-8"), timeout=timeout)
