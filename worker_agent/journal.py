"""The worker's state directory: mode 700, never a symlink, with `worker.lock` held (flock) by the
one worker that uses it. A second worker on the same directory is refused with the first one's pid.
Job records (`jobs/<id>.json`, written atomically) arrive with the job part of the agent."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
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
                records.append(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError):
                records.append({"file": path.name, "unreadable": True})
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
