"""The job keys of cluster jobs in `~/.ssh/authorized_keys` (docs/cluster-jobs.md, "SSH between replicas").

Standard library only: the worker runs this file on a replica's computer as the computer's SSH user, shipped
by worker_agent.core.ship (sent once, then run by its hash) with the operation as its argument
(worker_agent/replica_ssh.py). One operation:

    {"add": "<options-free public key line>" | null, "tag": "mado-job-42@gpu-host-1" | null,
     "seconds": 90000, "remove": ["mado-job-40@gpu-host-1", …], "worker": "gpu-host-1", "keep": [42, 43]}

- `add` + `tag`: the line `expiry-time="YYYYMMDDHHMM",no-agent-forwarding,no-X11-forwarding <key> <tag>`
  replaces any line of the same tag. The expiry is `seconds` from now in the computer's local time (how
  sshd reads it); it is left out where the OpenSSH found there is older than 8.2 (such an sshd refuses
  the whole line for an option it does not know).
- `remove`: the lines of those tags go.
- `worker` + `keep`: this worker's lines of jobs not in `keep` go (the sweep of jobs it no longer runs).
- `expired: true`: every line of ours whose `expiry-time` has passed goes (the site runner's sweep of
  lines whose runner was killed before it could remove them).

Every other line is kept byte for byte. The file is rewritten atomically (a temporary file in the same
directory, fsync, rename) with its mode, owner and group kept, under an flock, so two jobs editing at
once (one worker, or several computers sharing an NFS home) lose nothing. A file that is a symbolic link
keeps its link: the link's target is rewritten. Nothing is written when nothing changes.

Prints one JSON line: {"added": bool, "removed": n, "expiry": "YYYYMMDDHHMM" | null, "path": "…"}."""
from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import time

TAG_PREFIX = "mado-job-"
# The comment that ends every line of ours: the job's id and the worker that authorized it.
TAG = re.compile(rb"(?:^|[ \t])mado-job-(\d+)@([A-Za-z0-9][A-Za-z0-9._-]{0,63})[ \t]*\r?$")
EXPIRY = re.compile(rb'^expiry-time="(\d{12})"')
# No forwarding of any kind: the key starts commands between replicas (mpirun, pdsh), nothing else.
OPTIONS = "no-agent-forwarding,no-X11-forwarding,no-port-forwarding"
LOCK_NAME = ".mado-authorized_keys.lock"
EXPIRY_SINCE = (8, 2)  # OpenSSH's expiry-time= option


def job_tag(job_id, worker_id: str) -> str:
    return f"{TAG_PREFIX}{int(job_id)}@{worker_id}"


def tag_of(line: bytes) -> tuple[int, str] | None:
    """(job id, worker id) of a line of ours, or None for any other line."""
    found = TAG.search(line.rstrip(b"\n"))
    return (int(found.group(1)), found.group(2).decode("ascii")) if found else None


def key_line(public_key: str, tag: str, expiry: str | None) -> bytes:
    """The line for a job's key: its options, the key type and blob (any comment of the key dropped), the tag."""
    words = public_key.split()
    if len(words) < 2 or not words[0].startswith(("ssh-", "ecdsa-")):
        raise ValueError("not an OpenSSH public key line")
    options = (f'expiry-time="{expiry}",' if expiry else "") + OPTIONS
    return f"{options} {words[0]} {words[1]} {tag}\n".encode("ascii")


def split_lines(data: bytes) -> list[bytes]:
    """The file's lines with their own endings (the last may have none): joined, they are `data` again."""
    return re.findall(rb"[^\n]*\n|[^\n]+$", data)


def rewrite(data: bytes, *, add: bytes | None = None, remove=(), worker: str | None = None,
            keep=None, expired_before: str | None = None) -> tuple[bytes, int]:
    """The new content and how many lines of ours went (a replaced line is not counted). Lines not
    ours are never touched; a line of ours goes when its tag is in `remove`, when it is `worker`'s and
    its job is not in `keep`, when its expiry-time is before `expired_before` ("YYYYMMDDHHMM"), or when
    `add` carries the same tag (it is replaced)."""
    add_tag = tag_of(add) if add else None
    removing = {tag_of(t.encode("ascii") if isinstance(t, str) else t) for t in remove} - {None}
    keep = None if keep is None else {int(k) for k in keep}
    kept, removed = [], 0
    for line in split_lines(data):
        tag = tag_of(line)
        if tag is not None and tag == add_tag:
            continue  # replaced by `add`
        if tag is not None and (tag in removing or (worker is not None and keep is not None and tag[1] == worker
                                                    and tag[0] not in keep)):
            removed += 1
            continue
        expiry = EXPIRY.match(line) if tag is not None and expired_before else None
        if expiry and expiry.group(1).decode("ascii") < expired_before:
            removed += 1
            continue
        kept.append(line)
    out = b"".join(kept)
    if add:
        # After the last line, or before the first where the last has no end of line: then removing ours
        # gives back the very bytes that were there.
        out = out + add if not out or out.endswith(b"\n") else add + out
    return out, removed


def openssh_version() -> tuple[int, int] | None:
    for argv in (["ssh", "-V"], ["/usr/sbin/sshd", "-V"], ["sshd", "-V"]):
        try:
            ran = subprocess.run(argv, capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            continue
        found = re.search(rb"OpenSSH_(\d+)\.(\d+)", ran.stdout + ran.stderr)
        if found:
            return int(found.group(1)), int(found.group(2))
    return None


def write_atomically(path: str, data: bytes, like: os.stat_result | None) -> None:
    directory = os.path.dirname(path)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.mado-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if like is not None:
            try:
                os.fchown(fd, like.st_uid, like.st_gid)
            except OSError:
                pass  # another owner or group we may not give: the mode still is the file's
            os.fchmod(fd, like.st_mode & 0o7777)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.rename(tmp, path)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def apply(op: dict, home: str | None = None) -> dict:
    home = home or os.path.expanduser("~")
    ssh_dir = os.path.join(home, ".ssh")
    if not os.path.isdir(ssh_dir):
        if not op.get("add"):
            return {"added": False, "removed": 0, "expiry": None, "path": None}
        os.mkdir(ssh_dir, 0o700)
    path = os.path.realpath(os.path.join(ssh_dir, "authorized_keys"))
    expiry = None
    add = None
    if op.get("add"):
        version = openssh_version()
        if version is None or version >= EXPIRY_SINCE:
            expiry = time.strftime("%Y%m%d%H%M", time.localtime(time.time() + int(op.get("seconds") or 0) + 60))
        add = key_line(str(op["add"]), str(op["tag"]), expiry)
    lock = os.open(os.path.join(ssh_dir, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path, "rb") as handle:
                like = os.fstat(handle.fileno())
                data = handle.read()
        except FileNotFoundError:
            like, data = None, b""
        now = time.strftime("%Y%m%d%H%M", time.localtime()) if op.get("expired") else None
        new, removed = rewrite(data, add=add, remove=op.get("remove") or (), worker=op.get("worker"),
                               keep=op.get("keep"), expired_before=now)
        if new != data:
            write_atomically(path, new, like)
    finally:
        os.close(lock)
    return {"added": add is not None, "removed": removed, "expiry": expiry, "path": path}


def main(argv: list[str]) -> int:
    try:
        answer = apply(json.loads(argv[1]))
    except OSError as exc:
        print(json.dumps({"error": f"{exc.strerror or exc} ({exc.filename or '~/.ssh/authorized_keys'})"}))
        return 1
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
