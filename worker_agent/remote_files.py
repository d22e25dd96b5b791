"""Files of a job on its target, moved over the job's connection with small standard-library programs
(`python3 -I -c SCRIPT …`, nothing installed on the target):

- `fetch_source`: the job's source into `<job_dir>/source` before the supervisor starts: an uploaded
  archive (.tar.gz, streamed from the worker on stdin, extracted with only regular files and
  directories accepted) or a git URL and ref (`git clone` + `git checkout` on the target). The result
  appears under its final name only when complete, so a worker killed halfway fetches again.
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
from worker_agent.ssh import CommandTimeout, ConnectError

SOURCE_SCRIPT = r'''
import json, os, shutil, stat, subprocess, sys, tarfile, uuid

def out(**kw):
    print(json.dumps(kw)); sys.exit(0)

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
final = os.path.join(job_dir, "source")
if os.path.lexists(final):
    out(ok=True, existing=True)
tmp = os.path.join(job_dir, ".source-" + uuid.uuid4().hex[:8])
os.mkdir(tmp, 0o700)
try:
    if kind == "archive":
        count = 0
        with tarfile.open(fileobj=sys.stdin.buffer, mode="r|gz") as archive:
            for member in archive:
                name = member.name
                while name.startswith("./"):
                    name = name[2:]
                name = name.rstrip("/")
                if not name or name == ".":
                    continue
                pieces = name.split("/")
                if name.startswith("/") or ".." in pieces or "\0" in name:
                    out(ok=False, code="source_unsafe", error=f"The source archive holds the unsafe path {name!r}.")
                target = os.path.join(tmp, *pieces)
                if member.isdir():
                    os.makedirs(target, 0o755, exist_ok=True)
                elif member.isfile():
                    os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
                    data = archive.extractfile(member)
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                                 0o755 if member.mode & 0o111 else 0o644)
                    with os.fdopen(fd, "wb") as f:
                        shutil.copyfileobj(data, f, 1 << 20)
                    count += 1
                elif member.issym() or member.islnk():
                    out(ok=False, code="source_unsafe", error=f"The source archive holds the link {name!r}; "
                        "links are not accepted in a source archive.")
                else:
                    out(ok=False, code="source_unsafe", error=f"The source archive holds {name!r}, which is not a "
                        "file or a directory.")
    else:
        url, ref = sys.argv[3], sys.argv[4]
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR") or
               k.startswith(("GIT_SSH", "SSH_AUTH", "http_", "https_", "HTTP_", "HTTPS_", "no_proxy", "NO_PROXY"))}
        env["GIT_TERMINAL_PROMPT"] = "0"
        for argv in (["git", "clone", "--quiet", "--no-checkout", "--", url, tmp + "/repo"],
                     ["git", "-C", tmp + "/repo", "checkout", "--quiet", "--detach", ref]):
            try:
                ran = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=1800)
            except FileNotFoundError:
                out(ok=False, code="git_missing", error="git is not installed on the target: install it, or upload "
                    "the source as an archive.")
            if ran.returncode != 0:
                tail = ran.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
                out(ok=False, code="git_failed", error=f"{' '.join(argv[:2])} failed: " + " | ".join(tail))
        os.rename(tmp + "/repo", final)
        out(ok=True, existing=False)
    os.rename(tmp, final)
    out(ok=True, existing=False, files=count)
except (OSError, tarfile.TarError, EOFError) as exc:
    out(ok=False, code="source_failed", error=f"The source could not be unpacked on the target: {exc}.")
finally:
    if os.path.lexists(tmp):
        shutil.rmtree(tmp, ignore_errors=True)
'''

LIST_SCRIPT = r'''
import base64, hashlib, json, os, stat, sys

root, max_files = sys.argv[1], int(sys.argv[2])
try:
    st = os.lstat(root)
except FileNotFoundError:
    print(json.dumps({"files": [], "result": None, "manifest": None, "missing": True})); sys.exit(0)
if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
    print(json.dumps({"error": "The outputs directory is a symbolic link or not a directory."})); sys.exit(0)
''' + inspect.getsource(results.file_sha256) + inspect.getsource(results.walk_outputs) + r'''
files, too_many = walk_outputs(root, max_files)

def read(rel, limit):
    try:
        fd = os.open(os.path.join(root, rel), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return base64.b64encode(f.read(limit + 1)).decode()

def regular(rel):
    try:
        return stat.S_ISREG(os.lstat(os.path.join(root, rel)).st_mode)
    except OSError:
        return False

# A listing cut short (too_many) may stop before result.json: the job still declared its outputs.
has_result = any(f["path"] == "result.json" and f["kind"] == "file" for f in files) or \
    (too_many and regular("result.json"))
result = read("result.json", 1024 * 1024) if has_result else None
manifest = None
if result is not None:
    try:
        name = json.loads(base64.b64decode(result)).get("artifactsManifest")
    except Exception:
        name = None
    if isinstance(name, str) and name and ".." not in name.split("/") and not name.startswith("/") and \
            any(f["path"] == name and f["kind"] == "file" for f in files):
        manifest = read(name, max_files * 4096)  # results.decode_manifest's limit
print(json.dumps({"files": files, "result": result, "manifest": manifest, "too_many": too_many}))
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
