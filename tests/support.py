"""Small helpers shared by the test directories."""
from __future__ import annotations

import io
import os
import signal
import tarfile
import time
from contextlib import contextmanager


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.05, what="condition"):
    """Poll `predicate` until it returns something true; fail with `what` after `timeout` seconds (a
    callable `what` is asked then, to describe the state that the wait found)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what() if callable(what) else what}")
        time.sleep(interval)



def tar_gz(files: dict) -> bytes:
    """A .tar.gz of `files` (name -> bytes or text), regular files with mode 644, as a source upload."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()

# A program that prints numbered lines of 100 bytes until `size` bytes (argv[1]): used by the log
# volume test and bench/log_throughput.py to check that every line arrives once and in order.
NUMBERED_LINES = '''\
import sys
size = int(sys.argv[1])
pad = "x" * 88
out = sys.stdout.buffer
written = i = 0
block = []
while written < size:
    line = f"{i:010d} {pad}\\n".encode()
    block.append(line)
    written += len(line)
    i += 1
    if len(block) == 1000:
        out.write(b"".join(block))
        block = []
out.write(b"".join(block))
out.flush()
'''


def processes_under(path: str) -> list[int]:
    """PIDs whose command line mentions `path` (supervisors and jobs of a working directory)."""
    found = []
    needle = path.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmdline and state not in (b"Z", b"X"):
            found.append(int(name))
    return found


def kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_processes_under(path: str) -> None:
    """SIGKILL to what a test left running under `path` (supervisors and job code)."""
    kill_all(processes_under(path))


def run_periodic() -> None:
    """One round of every time-based rule, as `manage.py mado_periodic` does in production: pages and API
    reads no longer apply deadlines themselves, so a test that moved a clock back runs this before reading."""
    from io import StringIO

    from django.core.management import call_command

    call_command("mado_periodic", "--once", stdout=StringIO())


@contextmanager
def mlflow_sessions_closed():
    """The MLflow client keeps its HTTP sessions (keep-alive connections) in a process-wide cache, so the
    live server keeps a thread, and that thread its database session, per connection. Inside this block
    the sessions the client opens are noted; at its end they are closed and the cache forgotten, or a later
    test's check that no database session is left would wait for nothing."""
    from mlflow.utils import request_utils

    opened = []
    original = request_utils._get_request_session

    def noting(*args, **kwargs):
        session = original(*args, **kwargs)
        opened.append(session)
        return session

    request_utils._get_request_session = noting
    try:
        yield
    finally:
        request_utils._get_request_session = original
        request_utils._cached_get_request_session.cache_clear()
        for session in opened:
            session.close()


def database_now():
    """The database's clock, to compare with pg_stat_activity's times."""
    from django.db import connection
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def other_sessions(since=None) -> list:
    """Database sessions of the live server and agents, other than the test's own connection. With `since`,
    a session idle since before then is left out: another test's keep-alive connection (its client kept it
    open), which holds no lock and answers nothing of this test, so waiting for it would wait for nothing."""
    from django.db import connection
    query = ("SELECT pid, state, left(query, 80) FROM pg_stat_activity "
             "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    params: list = []
    if since is not None:
        query += " AND (state <> 'idle' OR state_change >= %s)"
        params.append(since)
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall()
