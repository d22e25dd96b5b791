"""The worker's state directory: mode 700, never a symlink, with `worker.lock` held (flock) by the
one worker that uses it. A second worker on the same directory is refused with the first one's pid.

`JobJournal` keeps one JSON record per job in `jobs/<id>.json` (mode 600, replaced atomically): the
claim payload, the lease, the job token, how far the job got (`step`), the byte offsets of the logs
delivered so far, the chunks of a log batch in flight, and a completion not yet accepted by the
server. A worker started again reads them back (see `worker_agent.jobs`), so a SIGKILL at any moment
loses nothing: at worst a log batch or a completion is sent once more, and the server ignores what
it already has."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import threading
from pathlib import Path

LOCK_NAME = "worker.lock"


class StateDirError(Exception):
    """The state directory is unusable; the message says how to fix it."""


class LockHeld(StateDirError):
    def __init__(self, message: str, pid: int | None):
        super().__init__(message)
        self.pid = pid


def check_state_dir(path: Path) -> list[str]:
    """Problems with an existing state directory, as sentences (empty when fine)."""
    problems = []
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return [f"The state directory {path} does not exist: run `mado-tracking-worker install` or create it with "
                f"mkdir -m 700 -p {path}."]
    if stat.S_ISLNK(st.st_mode):
        problems.append(f"The state directory {path} is a symbolic link: use a real directory (mode 700).")
    elif not stat.S_ISDIR(st.st_mode):
        problems.append(f"The state directory {path} is not a directory.")
    else:
        if stat.S_IMODE(st.st_mode) & 0o077:
            problems.append(f"The state directory {path} has mode {stat.S_IMODE(st.st_mode):o}: it holds job tokens, "
                            f"so run chmod 700 {path}.")
        if st.st_uid != os.geteuid():
            problems.append(f"The state directory {path} belongs to another user: the worker's user must own it.")
    return problems


class StateDir:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock_fd: int | None = None

    @property
    def lock_path(self) -> Path:
        return self.path / LOCK_NAME

    def ensure(self) -> None:
        """Create the directory (mode 700) if missing; refuse one that is unsafe."""
        if not os.path.lexists(self.path):
            old = os.umask(0o077)
            try:
                self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as exc:
                raise StateDirError(f"Cannot create the state directory {self.path} ({exc.strerror}): set "
                                    "MMT_WORKER_STATE_DIR to a directory this user can create.") from None
            finally:
                os.umask(old)
        problems = check_state_dir(self.path)
        if problems:
            raise StateDirError(" ".join(problems))

    def lock(self) -> None:
        """Take `worker.lock` for this process; `LockHeld` when another worker has it."""
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                pid = lock_holder(self.path)
                raise LockHeld(
                    f"Another worker{f' (pid {pid})' if pid else ''} is already using the state directory "
                    f"{self.path}. Stop it first, or give this one its own MMT_WORKER_STATE_DIR.", pid) from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        os.fsync(fd)
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            try:
                os.ftruncate(self._lock_fd, 0)
            except OSError:
                pass
            os.close(self._lock_fd)
            self._lock_fd = None

    def job_records(self) -> list[dict]:
        jobs_dir = self.path / "jobs"
        records = []
        for path in sorted(jobs_dir.glob("*.json")) if jobs_dir.is_dir() else []:
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                records.append({"file": path.name, "unreadable": True})
                continue
            if isinstance(record, dict):
                # What `status` shows: never the job token.
                record = {k: v for k, v in record.items() if k != "job_token"}
                if isinstance(record.get("job"), dict):
                    record["job"] = {k: v for k, v in record["job"].items() if k != "job_token"}
            records.append(record)
        return records


def lock_holder(path: Path) -> int | None:
    try:
        text = (Path(path) / LOCK_NAME).read_text().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def is_locked(path: Path) -> bool:
    """Whether some process holds `worker.lock` in `path` right now (without taking it for long)."""
    lock_path = Path(path) / LOCK_NAME
    try:
        fd = os.open(lock_path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class JobJournal:
    """`<state dir>/jobs/<id>.json`, one record per job this worker holds."""

    def __init__(self, state_dir: Path):
        self.dir = Path(state_dir) / "jobs"
        self._lock = threading.Lock()

    def ensure(self) -> None:
        if not os.path.lexists(self.dir):
            os.mkdir(self.dir, 0o700)
        st = os.lstat(self.dir)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise StateDirError(f"{self.dir} must be a directory (not a link): remove it and start the worker again.")
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(self.dir, 0o700)

    def path(self, job_id) -> Path:
        return self.dir / f"{int(job_id)}.json"

    def load_all(self) -> dict[int, dict]:
        records: dict[int, dict] = {}
        if not self.dir.is_dir():
            return records
        for path in sorted(self.dir.glob("*.json")):
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
                job_id = int(record["job_id"])
            except (OSError, ValueError, KeyError, TypeError):
                # A record nobody can read cannot be resumed; the server's resume hands the job back.
                bad = path.with_name(path.name + ".unreadable")
                os.replace(path, bad)
                continue
            records[job_id] = record
        return records

    def save(self, record: dict, *, durable: bool = True) -> None:
        """Replace the record atomically. `durable` also fsyncs (leases, tokens, completions); log
        offsets skip it: a worker killed at any moment still finds the last write in the page cache."""
        self.ensure()
        path = self.path(record["job_id"])
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        data = json.dumps(record, sort_keys=True).encode("utf-8")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def remove(self, job_id) -> None:
        try:
            os.unlink(self.path(job_id))
        except FileNotFoundError:
            pass
