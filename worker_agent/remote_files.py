"""Files of a job on its target, moved over the job's connection by the `files` program
(worker_agent/target/files.py joined after worker_agent.core.source and worker_agent.core.outputs,
shipped by worker_agent.core.ship: sent once, then run by its hash):

- `fetch_source`: the job's source into `<job_dir>/source` before the supervisor starts: an uploaded
  archive (.tar.gz, streamed from the worker on stdin) or a git URL and ref.
- `list_outputs`: the outputs directory as the result.json validator wants it (path, size, sha256,
  kind; symbolic links are reported, never followed) plus the bytes of result.json and of the
  artifacts manifest it names.
- `RemoteRange`: a byte range of one output file read over one stream, as a file-like body for an
  upload (`read(n)`, `__len__`); a file that turns out shorter raises instead of sending less.
- `open_frames`: many small outputs as the frames of one batch upload (a FramedBody).

`net_fact` runs a cluster job's network questions (worker_agent/target/net.py) the same way."""
from __future__ import annotations

import base64
import json

from worker_agent.core import outputs as core_outputs
from worker_agent.core import ship
from worker_agent.core import source as core_source
from worker_agent.ssh import CommandTimeout, ConnectError
from worker_agent.target import files as target_files
from worker_agent.target import net as target_net

FILES = ship.Program.of_modules(core_source, core_outputs, target_files)
NET = ship.Program.of_file(target_net.__file__)


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
        ran = ship.run(connection, python, FILES, ["source", job_dir, "archive"], stdin=archive, timeout=1800)
    elif source.get("kind") == "git":
        ran = ship.run(connection, python, FILES, ["source", job_dir, "git", str(source.get("url") or ""),
                                                   str(source.get("ref") or "HEAD")], timeout=3600)
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
    ran = ship.run(connection, python, FILES, ["list", outputs_dir, str(max_files)], timeout=3600)
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
        self._python = python
        self._args = ["cat", path, str(offset), str(length)]
        self._connection = connection
        self._timeout = timeout

    def __len__(self) -> int:
        return self.length

    def read(self, n: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        if self._stream is None:
            self._stream = ship.stream(self._connection, self._python, FILES, self._args, timeout=self._timeout)
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


def open_frames(connection, python: str, outputs_dir: str, files: list[dict], *,
                timeout: float = 60.0) -> core_outputs.FramedBody:
    """`files` ([{path, size}] under `outputs_dir` on the target) as the body of one batch upload,
    read there by one program over one stream."""
    stream = ship.stream(connection, python, FILES, ["frames", outputs_dir], stdin=json.dumps(files).encode(),
                         timeout=timeout)
    return core_outputs.FramedBody(files, stream)


def net_fact(connection, python: str, *args: str) -> str:
    """`free-port` or `resolve NAME…` (worker_agent/target/net.py) on the target: its stdout, stripped.
    RemoteFileError("target_failed") with the last line of its stderr when it fails."""
    ran = ship.run(connection, python, NET, args, timeout=30)
    if ran.exit_code != 0:
        tail = ran.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
        raise RemoteFileError("target_failed", f"{python} on the computer exited with {ran.exit_code}"
                              + (f": {tail[0]}" if tail else "."))
    return ran.stdout.decode("utf-8", "replace").strip()


TRANSIENT = (ConnectError, CommandTimeout, ConnectionError, OSError, EOFError)
