"""Spec directories: what the launcher (over SSH) or `mado-tracking submit` (locally) writes for each Job
of a submission before running the job shell (docs/sites-protocol.md):

    <spec_dir>/            700, a direct child of <spec_root> (<working dir>/.mmt-submissions)
        job.json           600  {format: 1, api_url, token, job}
        mmt-runner         700  #!/bin/sh wrapper: exec <runner_python> -I <spec_dir>/lib/worker_agent/site/runner.py
        lib/worker_agent/{__init__,supervisor,runtimes,jobenv,results,authorized_keys,replica_ssh}.py,
        lib/worker_agent/core/*.py,
        lib/worker_agent/site/{__init__,runner}.py

The writer below is standard library only and free of annotations, so the very same functions run
in-process for `submit` and, sent as program text (`remote_command`), under the site's Python on a
login node, with the payload (files base64-encoded, JSON) on stdin. From the spec root down nothing is
followed through a symbolic link: every directory is opened with O_NOFOLLOW relative to its parent,
and a link, a non-directory or a directory of another user is refused. Files are written to a
temporary name and renamed into place."""
from __future__ import annotations

import base64
import inspect
import json
import os
import posixpath
import shlex
from pathlib import Path

import worker_agent

SPEC_ROOT = ".mmt-submissions"
RUNNER_NAME = "mmt-runner"
BUNDLE = (
    "worker_agent/__init__.py", "worker_agent/supervisor.py", "worker_agent/runtimes.py", "worker_agent/jobenv.py",
    "worker_agent/results.py", "worker_agent/authorized_keys.py", "worker_agent/replica_ssh.py",
    "worker_agent/core/__init__.py", "worker_agent/core/api.py",
    "worker_agent/core/lifecycle.py", "worker_agent/core/outputs.py", "worker_agent/core/ship.py",
    "worker_agent/core/source.py", "worker_agent/core/tokens.py",
    "worker_agent/site/__init__.py", "worker_agent/site/runner.py",
)
RUNNER_IN_LIB = "lib/worker_agent/site/runner.py"


class SpecError(Exception):
    """A spec directory cannot be written; the message says where and why."""


# -- building the payload (launcher / submit side) -----------------------------------------------

def bundle() -> dict[str, bytes]:
    """The runner's modules, read from the installed package (so a runner always matches its launcher)."""
    base = Path(worker_agent.__file__).resolve().parent.parent
    files = {}
    for rel in BUNDLE:
        try:
            files[rel] = (base / rel).read_bytes()
        except OSError as exc:
            raise SpecError(f"The installed mado-tracking lacks {rel} ({exc.strerror}): reinstall the package.") \
                from None
    return files


def wrapper(runner_python: str, spec_dir: str) -> str:
    runner = posixpath.join(spec_dir, RUNNER_IN_LIB)
    return ("#!/bin/sh\n"
            "# Mado Compute runner for this spec directory: the bundled runner in lib/, started with -I so\n"
            "# neither the environment (PYTHONPATH) nor the account's site-packages change what runs.\n"
            f"exec {shlex.quote(runner_python)} -I {shlex.quote(runner)} \"$@\"\n")


def _absolute(value, what: str) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\x00" in value or "\n" in value:
        raise SpecError(f"The {what} {str(value)[:80]!r} is not an absolute path: check the computer's settings.")
    return posixpath.normpath(value)


def build_payload(submission: dict) -> dict:
    """The writer's input for one submission (every Job of an array)."""
    spec_root = _absolute(submission.get("spec_root"), "spec root")
    runner_python = _absolute(submission.get("runner_python"), "runner Python")
    api_url = submission.get("api_url")
    if not isinstance(api_url, str) or not api_url.startswith(("http://", "https://")):
        raise SpecError("The submission has no runner API URL: set it in the computer's settings.")
    dirs = []
    for item in submission.get("jobs") or []:
        spec_dir = _absolute(item.get("spec_dir"), "spec directory")
        if posixpath.dirname(spec_dir) != spec_root:
            raise SpecError(f"The spec directory {spec_dir} is not inside {spec_root}.")
        job_json = json.dumps({"format": 1, "api_url": api_url, "token": item.get("token"), "job": item.get("job")})
        dirs.append({"path": spec_dir, "files": {
            "job.json": [0o600, _b64(job_json.encode("utf-8"))],
            RUNNER_NAME: [0o700, _b64(wrapper(runner_python, spec_dir).encode("utf-8"))],
        }})
    if not dirs:
        raise SpecError("The submission names no Jobs.")
    lib = {rel: _b64(data) for rel, data in bundle().items()}
    return {"spec_root": spec_root, "lib": lib, "dirs": dirs}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def write_local(submission: dict) -> None:
    """`mado-tracking submit`: write the spec directories on this machine."""
    try:
        write_spec_dirs(build_payload(submission))
    except OSError as exc:
        raise SpecError(f"Cannot write the spec directories under {submission.get('spec_root')}: "
                        f"{exc.strerror or exc}.") from None
    except ValueError as exc:  # the writer's own refusals
        raise SpecError(str(exc)) from None


def remote_command(runner_python: str) -> list[str]:
    """argv that runs the writer on the login node under the runner's Python (python3 when that path
    does not exist there); the payload goes on stdin as JSON."""
    launcher = 'p=$1; shift; [ -x "$p" ] || p=python3; exec "$p" -I -c "$1"'
    return ["sh", "-c", launcher, "mmt-spec", runner_python, remote_program()]


def remote_program() -> str:
    sources = "\n\n".join(inspect.getsource(f) for f in (_open_dir, _write_file, _remove_tree, write_spec_dirs))
    return ("import base64, json, os, stat, sys\n\n" + sources + "\n\n"
            "try:\n"
            "    write_spec_dirs(json.load(sys.stdin))\n"
            "except OSError as exc:\n"
            "    sys.stderr.write('%s: %s\\n' % (exc.filename or 'spec directory', exc.strerror or exc))\n"
            "    sys.exit(2)\n"
            "except ValueError as exc:\n"
            "    sys.stderr.write('%s\\n' % exc)\n"
            "    sys.exit(2)\n"
            "print('ok')\n")


def remote_error(stderr: bytes, host: str) -> str:
    lines = [line for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    detail = lines[-1][:300] if lines else "no message"
    return f"Writing the spec directories on {host} failed: {detail}"


# -- the writer (standard library only, no annotations: it also runs as program text) ------------

def _open_dir(parent_fd, name):
    """Open (creating, mode 700) the directory `name` in `parent_fd` without following a link."""
    import stat as _stat
    if name in ("", ".", "..") or "/" in name:
        raise ValueError("Refusing the path part %r." % name)
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    except FileExistsError:
        pass
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
    except OSError:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        if _stat.S_ISLNK(st.st_mode):
            raise ValueError("%s is a symbolic link: the launcher does not write through links. Remove it." % name)
        raise ValueError("%s exists and is not a directory: remove it." % name)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        os.close(fd)
        raise ValueError("%s belongs to another user: remove it or choose another working directory." % name)
    if _stat.S_IMODE(st.st_mode) != 0o700:
        os.fchmod(fd, 0o700)
    return fd


def _write_file(dir_fd, name, data, mode):
    tmp = ".%s.%d.tmp" % (name, os.getpid())
    try:
        os.unlink(tmp, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)  # whatever the umask
    finally:
        os.close(fd)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _remove_tree(parent_fd, name):
    """Remove `name` (a file, a link or a whole directory) in `parent_fd`, never following links."""
    import stat as _stat
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not _stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent_fd)
        return
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
    try:
        for entry in os.listdir(fd):
            _remove_tree(fd, entry)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)


def write_spec_dirs(payload):
    """Write every spec directory of one submission. ValueError for a refusal, OSError for the rest."""
    root = payload["spec_root"].rstrip("/")
    parent, root_name = os.path.split(root)
    if not os.path.isabs(root) or not root_name:
        raise ValueError("The spec root %r is not an absolute path." % root)
    # The working directory is the owner's setting and may lie under a linked /home: opened normally.
    os.makedirs(parent, mode=0o700, exist_ok=True)
    parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        root_fd = _open_dir(parent_fd, root_name)
    finally:
        os.close(parent_fd)
    try:
        lib = dict((rel, base64.b64decode(data)) for rel, data in payload["lib"].items())
        for item in payload["dirs"]:
            where, name = os.path.split(item["path"].rstrip("/"))
            if where != root:
                raise ValueError("The spec directory %r is not directly inside %r." % (item["path"], root))
            dir_fd = _open_dir(root_fd, name)
            try:
                for file_name, (mode, data) in item["files"].items():
                    _write_file(dir_fd, file_name, base64.b64decode(data), mode)
                _remove_tree(dir_fd, "lib")  # exactly the bundled modules, none left from an older version
                lib_fd = _open_dir(dir_fd, "lib")
                try:
                    for rel, data in sorted(lib.items()):
                        parts = rel.split("/")
                        fds = [lib_fd]
                        try:
                            for part in parts[:-1]:
                                fds.append(_open_dir(fds[-1], part))
                            _write_file(fds[-1], parts[-1], data, 0o600)
                        finally:
                            for fd in fds[1:]:
                                os.close(fd)
                finally:
                    os.close(lib_fd)
            finally:
                os.close(dir_fd)
    finally:
        os.close(root_fd)


def write_remote(connection, submission: dict, *, timeout: float = 60.0) -> None:
    """The launcher: write the spec directories over the SSH connection in one command."""
    payload = json.dumps(build_payload(submission)).encode("utf-8")
    result = connection.run(remote_command(submission["runner_python"]), stdin=payload, timeout=timeout)
    if result.exit_code != 0 or result.stdout.strip() != b"ok":
        raise SpecError(remote_error(result.stderr, getattr(connection.target, "host", "the login node")))
