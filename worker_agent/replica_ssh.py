"""SSH between the replicas of a cluster job (docs/cluster-jobs.md, "SSH between replicas"; seed 004:
"connect to the sub containers only from the main container … just by running `ssh sub1`").

Per job the worker makes an Ed25519 key pair (`cryptography`, which paramiko depends on; no
subprocess; `ssh-keygen` only where `cryptography` is missing, as on a site's compute node). Before any
replica starts, each replica's computer authorizes the public key for the job's life only, over the
worker's own SSH connection (worker_agent/authorized_keys.py runs there): one line in the SSH user's
`~/.ssh/authorized_keys` with `expiry-time=` and the comment `mado-job-<id>@<worker>`. The worker
removes it when the job ends (finished, failed, canceled, start failed, lease lost), and sweeps its
lines of jobs it no longer runs whenever it authorizes a new job there; a worker that never comes back
leaves the line to its expiry time.

Each replica's workspace gets `ssh/`: the private key (600), `known_hosts` with the host keys the worker
already trusts for those computers under the replica names (`HostKeyAlias`), `config` with a `Host`
block per replica, and `bin/ssh`, a wrapper that runs the real ssh with `-F config`; `ssh/bin` goes in
front of PATH, so `ssh sub1`, `mpirun` (its rsh agent is `ssh` from PATH) and pdsh (DeepSpeed) use the
replica names. Python runtime on SSH computers only: a container has no sshd of its own.

The site runner (worker_agent/site/runner.py, "ssh between replicas") uses this module too: it is bundled
into the spec directory, so paramiko and cryptography are imported only where they are used."""
from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import tempfile

from worker_agent import authorized_keys, jobenv
from worker_agent.core import ship

log = logging.getLogger("mado.worker.jobs")

SSH_DIR = "ssh"  # in each replica's workspace
KEY_PATH = f"{SSH_DIR}/id_ed25519"
KNOWN_HOSTS_PATH = f"{SSH_DIR}/known_hosts"
CONFIG_PATH = f"{SSH_DIR}/config"
BIN_DIR = f"{SSH_DIR}/bin"
WRAPPER_PATH = f"{BIN_DIR}/ssh"
PROGRAM = ship.Program.of_file(authorized_keys.__file__)  # run on each replica's computer by its hash
# The key outlives the walltime by this much (stopping, uploads); without a walltime it expires after
# NO_WALLTIME_SECONDS unless the worker removed it first.
EXPIRY_MARGIN_SECONDS = 3600
NO_WALLTIME_SECONDS = 30 * 86400


class ReplicaSshError(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def unsupported(job: dict) -> str | None:
    """Why this cluster job gets no SSH between its replicas, or None when it does."""
    runtime = str(job.get("runtime") or "python")
    if runtime != "python":
        return f"the {runtime} runtime has no sshd in its containers; ssh between replicas is for python jobs"
    kinds = {str((r.get("computer") or {}).get("kind") or "ssh") for r in job.get("replicas") or []}
    if kinds != {"ssh"}:
        return "ssh between replicas needs every replica on an SSH computer"
    return None


def new_key_pair(tag: str) -> dict:
    """{"private": OpenSSH private key text, "public": "ssh-ed25519 AAAA… <tag>"}."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    except ImportError:  # a site's Python without it: OpenSSH's own tool makes the same kind of key
        return ssh_keygen_pair(tag)
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption()).decode("ascii")
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode("ascii")
    return {"private": private, "public": f"{public} {tag}"}


def ssh_keygen_pair(tag: str) -> dict:
    """`new_key_pair` made by `ssh-keygen -t ed25519` in a private temporary directory."""
    with tempfile.TemporaryDirectory(prefix="mado-job-key-") as directory:
        path = os.path.join(directory, "id_ed25519")
        try:
            ran = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", tag, "-f", path],
                                 capture_output=True, timeout=60, stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ReplicaSshError(f"no Ed25519 key could be made: neither the Python module cryptography nor "
                                  f"ssh-keygen is usable here ({exc})") from None
        if ran.returncode != 0:
            tail = ran.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
            raise ReplicaSshError(f"ssh-keygen could not make an Ed25519 key ({tail[0] if tail else ran.returncode})")
        with open(path, encoding="ascii") as private, open(path + ".pub", encoding="ascii") as public:
            words = public.read().split()
            return {"private": private.read(), "public": f"{words[0]} {words[1]} {tag}"}


def key_lifetime(walltime_seconds) -> int:
    """Seconds from the authorization until sshd refuses the key on its own (`expiry-time=`)."""
    return int(walltime_seconds) + EXPIRY_MARGIN_SECONDS if walltime_seconds else NO_WALLTIME_SECONDS


def host_label(computer: dict) -> str:
    """The computer as its known_hosts names it: `host`, or `[host]:port` off port 22."""
    port = int(computer.get("port") or 22)
    host = str(computer.get("host") or "")
    return host if port == 22 else f"[{host}]:{port}"


def trusted_host_keys(computer: dict) -> list[tuple[str, str]]:
    """(key type, base64) of every host key the worker trusts for this computer (its known_hosts file
    on the worker machine, hashed names included)."""
    import paramiko

    path = str(computer.get("known_hosts_path") or "")
    try:
        entry = paramiko.HostKeys(path).lookup(host_label(computer)) if path else None
    except (OSError, paramiko.SSHException, ValueError):
        entry = None
    if not entry:
        raise ReplicaSshError(f"the worker's known_hosts file has no host key for {computer.get('name')} "
                              f"({host_label(computer)})")
    return [(kind, entry[kind].get_base64()) for kind in entry.keys()]


def _word(value: str, what: str) -> str:
    if not value or any(ch.isspace() or ch in "\"'\\#" for ch in value):
        raise ReplicaSshError(f"{what} {value!r} cannot go into an ssh_config")
    return value


def _path(value: str) -> str:
    if any(ch in value for ch in "\"\n\r\0"):
        raise ReplicaSshError(f"the workspace path {value!r} cannot go into an ssh_config")
    return f'"{value}"'


def peers(replicas: list[dict]) -> list[dict]:
    """name, address, port, user of every replica, as ssh reaches it from any replica: its computer's
    host (also for replicas on the replica's own computer: an sshd may listen on that address only)."""
    items = sorted(replicas, key=lambda r: int(r["index"]))
    return [{"name": _word(str(r["name"]), "the replica name"),
             "address": _word(jobenv.computer_address(dict(r.get("computer") or {})), "the host"),
             "port": int((r.get("computer") or {}).get("port") or 22),
             "user": _word(str((r.get("computer") or {}).get("ssh_user") or ""), "the SSH user")} for r in items]


def known_hosts_text(replicas: list[dict]) -> str:
    """One `NAME TYPE BASE64` line per replica and trusted key: ssh looks them up by HostKeyAlias."""
    lines = []
    for replica in sorted(replicas, key=lambda r: int(r["index"])):
        for kind, blob in trusted_host_keys(dict(replica.get("computer") or {})):
            lines.append(f"{replica['name']} {kind} {blob}")
    return "\n".join(lines) + "\n"


def config_text(entries: list[dict], *, job_dir: str) -> str:
    """The replica's ssh_config: a Host block per replica (first match wins, so they come before the
    user's own ~/.ssh/config, which is included for every other host)."""
    identity, known_hosts = _path(f"{job_dir}/{KEY_PATH}"), _path(f"{job_dir}/{KNOWN_HOSTS_PATH}")
    blocks = ["# Mado: ssh between the replicas of this job (docs/cluster-jobs.md). Generated; do not edit.\n"]
    for entry in entries:
        blocks.append(
            f"Host {entry['name']}\n"
            f"  HostName {entry['address']}\n"
            f"  Port {int(entry['port'])}\n"
            f"  User {entry['user']}\n"
            f"  HostKeyAlias {entry['name']}\n"
            f"  IdentityFile {identity}\n"
            "  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {known_hosts}\n"
            "  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n"
            "  UpdateHostKeys no\n"
            "  CheckHostIP no\n"
            "  BatchMode yes\n"
            "  LogLevel ERROR\n")
    blocks.append("Match all\n  Include ~/.ssh/config\n")
    return "\n".join(blocks)


def wrapper_text(*, job_dir: str) -> str:
    """`ssh` on the job's PATH: the first other ssh on PATH, with the job's config."""
    bin_dir, config = shlex.quote(f"{job_dir}/{BIN_DIR}"), shlex.quote(f"{job_dir}/{CONFIG_PATH}")
    return ("#!/bin/sh\n"
            "# Mado: ssh with this job's replica names (main1, sub1, ...), key and host keys.\n"
            f"self={bin_dir}\n"
            "set -f\n"
            "IFS=:\n"
            "for dir in $PATH; do\n"
            '  [ "$dir" = "$self" ] && continue\n'
            f'  [ -f "$dir/ssh" ] && [ -x "$dir/ssh" ] && exec "$dir/ssh" -F {config} "$@"\n'
            "done\n"
            'echo "ssh: no OpenSSH client on PATH besides the job\'s wrapper; install openssh-client" >&2\n'
            "exit 127\n")


def replica_files(*, job_dir: str, peers: list[dict], known_hosts: str, private_key: str) -> list[dict]:
    """The spec `files` of one replica's `ssh/` (paths relative to its workspace); `peers` and
    `known_hosts` as `peers` and `known_hosts_text` made them when the job was set up (journaled)."""
    return [{"path": KEY_PATH, "content": private_key, "mode": 0o600},
            {"path": KNOWN_HOSTS_PATH, "content": known_hosts, "mode": 0o644},
            {"path": CONFIG_PATH, "content": config_text(peers, job_dir=job_dir), "mode": 0o644},
            {"path": WRAPPER_PATH, "content": wrapper_text(job_dir=job_dir), "mode": 0o755}]


# -- authorized_keys on the replicas' computers -------------------------------------------------------

def edit(connection, python: str, op: dict, *, timeout: float = 60.0) -> dict:
    """Run one authorized_keys operation (worker_agent/authorized_keys.py) on a computer."""
    ran = ship.run(connection, python, PROGRAM, [json.dumps(op, sort_keys=True)], timeout=timeout)
    text = ran.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        answer = json.loads(text[-1]) if text else {}
    except ValueError:
        answer = {}
    if ran.exit_code != 0 or "error" in answer or "removed" not in answer:
        tail = ran.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
        raise ReplicaSshError(answer.get("error") or (tail[0] if tail else f"exit code {ran.exit_code}"))
    return answer


def authorize_op(*, public_key: str, tag: str, seconds: int, worker_id: str, keep) -> dict:
    return {"add": public_key, "tag": tag, "seconds": int(seconds), "worker": worker_id,
            "keep": sorted(int(k) for k in keep)}


def revoke_op(tags) -> dict:
    return {"add": None, "remove": sorted(tags)}
