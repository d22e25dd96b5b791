"""Pasted known_hosts text: parsed line by line, with each key's SHA256 fingerprint computed the way
`ssh-keygen -l` prints it, so the owner can compare it with the site's published fingerprints before
saving. Standard library only (plus Django's gettext for the messages)."""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct
from dataclasses import dataclass

from django.utils.translation import gettext as _

KEY_TYPES = {
    "ssh-ed25519", "ssh-rsa", "ssh-dss", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com", "ssh-ed448",
}
MARKERS = {"@cert-authority", "@revoked"}


class KnownHostsError(ValueError):
    pass


@dataclass(frozen=True)
class HostKey:
    line: int
    marker: str
    hosts: str
    key_type: str
    key: bytes
    comment: str

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256(self.key).digest()
        return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")

    @property
    def hashed(self) -> bool:
        return self.hosts.startswith("|1|")

    def matches(self, host: str, port: int) -> bool:
        """True when this line applies to host:port, as OpenSSH matches: `[host]:port` for ports other
        than 22, hashed names (|1|salt|hmac), wildcards and negations."""
        name = host if port == 22 else f"[{host}]:{port}"
        if self.hashed:
            return any(_hashed_match(entry, name) for entry in self.hosts.split(","))
        matched = False
        for pattern in self.hosts.split(","):
            negated = pattern.startswith("!")
            if _pattern_match(name, pattern.lstrip("!")):
                if negated:
                    return False
                matched = True
        return matched

    def display(self) -> dict:
        return {"line": self.line, "hosts": "(hashed)" if self.hashed else self.hosts, "key_type": self.key_type,
                "fingerprint": self.fingerprint, "marker": self.marker or None}


def parse(text: str) -> list[HostKey]:
    """Every key line of the text; KnownHostsError naming the first line that is not a known_hosts line."""
    keys = []
    for number, raw in enumerate(text.replace("\r\n", "\n").split("\n"), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        marker = ""
        if fields[0].startswith("@"):
            if fields[0] not in MARKERS:
                raise KnownHostsError(_("Line %(number)s: unknown marker %(marker)s.") % {
                    "number": number, "marker": fields[0][:40]})
            marker, fields = fields[0], fields[1:]
        if len(fields) < 3:
            raise KnownHostsError(_("Line %(number)s: expected 'host key-type base64-key', as ssh-keyscan prints.")
                                  % {"number": number})
        hosts, key_type, blob = fields[0], fields[1], fields[2]
        if key_type not in KEY_TYPES:
            raise KnownHostsError(_("Line %(number)s: unknown key type %(type)s.") % {
                "number": number, "type": key_type[:40]})
        try:
            key = base64.b64decode(blob, validate=True)
        except (binascii.Error, ValueError):
            raise KnownHostsError(_("Line %(number)s: the key is not valid base64.") % {"number": number}) from None
        if _embedded_type(key) != key_type:
            raise KnownHostsError(_("Line %(number)s: the key data is not a %(type)s key.") % {
                "number": number, "type": key_type})
        keys.append(HostKey(number, marker, hosts, key_type, key, " ".join(fields[3:])))
    return keys


def keys_for(keys: list[HostKey], host: str, port: int) -> list[HostKey]:
    return [k for k in keys if k.marker == "" and k.matches(host, port)]


def _embedded_type(key: bytes) -> str | None:
    """An SSH public key blob starts with its type as a length-prefixed string."""
    if len(key) < 4:
        return None
    (length,) = struct.unpack(">I", key[:4])
    if length > 64 or len(key) < 4 + length:
        return None
    try:
        return key[4:4 + length].decode("ascii")
    except UnicodeDecodeError:
        return None


def _pattern_match(name: str, pattern: str) -> bool:
    """OpenSSH host patterns: `*` and `?` are the only wildcards (brackets are literal, as in [host]:port)."""
    regex = "".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern.lower())
    return re.fullmatch(regex, name.lower()) is not None


def _hashed_match(entry: str, name: str) -> bool:
    parts = entry.split("|")
    if len(parts) != 4 or parts[1] != "1":
        return False
    try:
        salt = base64.b64decode(parts[2])
        expected = base64.b64decode(parts[3])
    except (binascii.Error, ValueError):
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), expected)
