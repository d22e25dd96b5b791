"""Files of a job on its target, moved over the job's connection with small standard-library programs
(`python3 -I -c SCRIPT …`, nothing installed on the target):

- `fetch_source`: the job's source into `<job_dir>/source` before the supervisor starts
  (worker_agent.core.source on the target): an uploaded archive (.tar.gz, streamed from the worker on
  stdin) or a git URL and ref.
- `list_outputs`: the outputs directory as the result.json validator wants it (path, size, sha256,
  kind; symbolic links are reported, never followed) plus the bytes of result.json and of the
  artifacts manifest it names.
- `RemoteRange`: a byte range of one output file read over one stream, as a file-like body for an
  upload (`read(n)`, `__len__`); a file that turns out shorter raises instead of sending less."""
from __future__ import annotations

import base64
import inspect
import json

from worker_agent import results
from worker_agent.core import outputs as core_outputs
from worker_agent.core import source as core_source
from worker_agent.ssh import CommandTimeout, ConnectError

SOURCE_SCRIPT = r'''
import json, os, stat, sys

def out(**kw):
    print(json.dumps(kw)); sys.exit(0)

''' + inspect.getsource(core_source) + r'''
job_dir, kind = sys.argv[1], sys.argv[2]
parts = job_dir.rstrip("/").split("/")
working_dir = "/".join(parts[:-3]) or "/"
if parts[-3:-1] != [".mmt", "jobs"] or not os.path.isdir(working_dir):
    out(ok=False, code="working_dir_missing",
        error=f"The working directory {working_dir} does not exist on the target.")
path = working_dir
for part in parts[-3:]:
    path = os.path.join(path, part)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        out(ok=False, code="symlink_refused", error=f"{path} is a symbolic link or not a directory: remove it.")
os.chmod(job_dir, 0o700)
if os.path.lexists(os.path.join(job_dir, "source")):
    out(ok=True, existing=True)
try:
    if kind == "archive":
        out(ok=True, existing=False, files=unpack_source(sys.stdin.buffer, job_dir))
    clone_source(sys.argv[3], sys.argv[4], job_dir, "on the target", 1800)
    out(ok=True, existing=False)
except SourceError as exc:
    out(ok=False, code=exc.code, error=str(exc))
except (OSError, tarfile.TarError, EOFError) as exc:
    out(ok=False, code="source_failed", error=f"The source could not be unpacked on the target: {exc}.")
'''

LIST_SCRIPT = r'''
import base64, hashlib, json, os, stat, sys

''' + inspect.getsource(results.file_sha256) + inspect.getsource(results.walk_outputs) + \
    inspect.getsource(core_outputs.read_limited) + inspect.getsource(core_outputs.read_outputs) + r'''
try:
    listing = read_outputs(sys.argv[1], int(sys.argv[2]))
except ValueError as exc:
    print(json.dumps({"error": str(exc)})); sys.exit(0)
for key in ("result", "manifest"):
    if listing[key] is not None:
        listing[key] = base64.b64encode(listing[key]).decode()
print(json.dumps(listing))
'''

CAT_SCRIPT = r'''
import os, sys
path, offset, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
out = sys.stdout.buffer
while length > 0:
    data = os.pread(fd, min(length, 1 << 20), offset)
    if not data:
        break
    out.write(data)
    offset += len(data)
    length -= len(data)
out.flush()
'''


class RemoteFileError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def _last_json(stdout: bytes) -> dict | None:
    try:
        value = json.loads(stdout.decode("utf-8").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return value if isinstance(value, dict) else None


def fetch_source(connection, *, python: str, job_dir: str, source: dict, archive=None) -> dict:
    """Put the job's source at `<job_dir>/source` (nothing happens if it is there already). `archive`
    is an open binary file with the .tar.gz for an archive source."""
    if source.get("kind") == "archive":
        argv = [python, "-I", "-c", SOURCE_SCRIPT, job_dir, "archive"]
        ran = connection.run(argv, stdin=archive, timeout=1800)
    elif source.get("kind") == "git":
        argv = [python, "-I", "-c", SOURCE_SCRIPT, job_dir, "git", str(source.get("url") or ""),
                str(source.get("ref") or "HEAD")]
        ran = connection.run(argv, timeout=3600)
    else:
        raise RemoteFileError("source_invalid", f"The worker does not know the source kind {source.get('kind')!r}.")
    answer = _last_json(ran.stdout)
    if answer is None:
        tail = ran.stderr.decode("utf-8", "replace").strip().splitlines()[-2:]
        raise RemoteFileError("source_failed", f"Fetching the source on the target failed (exit code {ran.exit_code})"
                              + (": " + " | ".join(tail) if tail else "."))
    if not answer.get("ok"):
        raise RemoteFileError(str(answer.get("code") or "source_failed"), str(answer.get("error") or "failed"))
    return answer


def list_outputs(connection, *, python: str, outputs_dir: str, max_files: int) -> dict:
    """{"files": [{path, size, sha256, kind}], "result": bytes | None, "manifest": bytes | None,
    "too_many": bool}."""
    ran = connection.run([python, "-I", "-c", LIST_SCRIPT, outputs_dir, str(max_files)], timeout=3600)
    answer = _last_json(ran.stdout)
    if answer is None or answer.get("error"):
        detail = (answer or {}).get("error") or " | ".join(
            ran.stderr.decode("utf-8", "replace").strip().splitlines()[-2:])
        raise RemoteFileError("outputs_unreadable", f"The outputs directory could not be listed: {detail}")
    for key in ("result", "manifest"):
        if answer.get(key) is not None:
            answer[key] = base64.b64decode(answer[key])
    return answer


class RemoteRange:
    """Bytes `[offset, offset + length)` of a file on the target, read over one stream."""

    def __init__(self, connection, *, python: str, path: str, offset: int, length: int, timeout: float = 60.0):
        self.length = length
        self._left = length
        self._stream = None
        self._buffer = b""
        self._argv = [python, "-I", "-c", CAT_SCRIPT, path, str(offset), str(length)]
        self._connection = connection
        self._timeout = timeout

    def __len__(self) -> int:
        return self.length

    def read(self, n: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        if self._stream is None:
            self._stream = self._connection.stream(self._argv, stdin=b"", timeout=self._timeout)
        if n is None or n < 0:
            n = self._left
        while len(self._buffer) < min(n, self._left):
            block = self._stream.read(1 << 20)
            if not block:
                raise OSError(f"The file on the target ended {self._left - len(self._buffer)} bytes early "
                              "(it changed after it was listed).")
            self._buffer += block
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        self._left -= len(data)
        return data

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def __enter__(self) -> RemoteRange:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


TRANSIENT = (ConnectError, CommandTimeout, ConnectionError, OSError, EOFError)
