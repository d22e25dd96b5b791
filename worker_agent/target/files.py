"""A job's files on its target, one program with a command per task (worker_agent.remote_files is the
worker's side); joined after worker_agent.core.source and worker_agent.core.outputs, whose code it runs
(`ship.Program.of_modules`). Commands:

    source JOB_DIR archive          the .tar.gz on stdin unpacked into JOB_DIR/source
    source JOB_DIR git URL REF      a clone of URL at REF into JOB_DIR/source
        -> one JSON line: {ok: true, existing: bool, files?: n} or {ok: false, code, error}
    list OUTPUTS_DIR MAX_FILES      -> one JSON line: read_outputs with result and manifest base64, or {error}
    cat PATH OFFSET LENGTH          -> the bytes [OFFSET, OFFSET + LENGTH) of PATH (fewer if it is shorter)
    frames OUTPUTS_DIR              stdin: the JSON list of {path, size} -> their frames (iter_frames)

JOB_DIR is `<working dir>/.mmt/jobs/<id>`: the working directory must exist; `.mmt`, `jobs` and the job's
directory are made 700 where missing and refused when one is a symbolic link or not a directory."""
import base64
import json
import os
import stat
import sys
import tarfile

from worker_agent.core.outputs import iter_frames, read_outputs
from worker_agent.core.source import SourceError, clone_source, unpack_source

GIT_TIMEOUT = 1800


def job_directory(job_dir):
    """Makes JOB_DIR (700) under its existing working directory; a refusal as {ok: false, code, error}, else None."""
    parts = job_dir.rstrip("/").split("/")
    working_dir = "/".join(parts[:-3]) or "/"
    if parts[-3:-1] != [".mmt", "jobs"] or not os.path.isdir(working_dir):
        return {"ok": False, "code": "working_dir_missing",
                "error": "The working directory %s does not exist on the target." % working_dir}
    path = working_dir
    for part in parts[-3:]:
        path = os.path.join(path, part)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            return {"ok": False, "code": "symlink_refused",
                    "error": "%s is a symbolic link or not a directory: remove it." % path}
    os.chmod(job_dir, 0o700)
    return None


def fetch_source(job_dir, kind, rest, stdin):
    """The `source` command's answer."""
    refused = job_directory(job_dir)
    if refused:
        return refused
    if os.path.lexists(os.path.join(job_dir, "source")):
        return {"ok": True, "existing": True}
    try:
        if kind == "archive":
            return {"ok": True, "existing": False, "files": unpack_source(stdin, job_dir)}
        clone_source(rest[0], rest[1], job_dir, "on the target", GIT_TIMEOUT)
        return {"ok": True, "existing": False}
    except SourceError as exc:
        return {"ok": False, "code": exc.code, "error": str(exc)}
    except (OSError, tarfile.TarError, EOFError) as exc:
        return {"ok": False, "code": "source_failed",
                "error": "The source could not be unpacked on the target: %s." % exc}


def list_outputs(outputs_dir, max_files):
    """The `list` command's answer: read_outputs as JSON (result and manifest base64)."""
    try:
        listing = read_outputs(outputs_dir, max_files)
    except ValueError as exc:
        return {"error": str(exc)}
    for key in ("result", "manifest"):
        if listing[key] is not None:
            listing[key] = base64.b64encode(listing[key]).decode()
    return listing


def byte_range(path, offset, length):
    """The blocks of [offset, offset + length) of the file at `path`, never through a symbolic link."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        while length > 0:
            data = os.pread(fd, min(length, 1 << 20), offset)
            if not data:
                return
            offset += len(data)
            length -= len(data)
            yield data
    finally:
        os.close(fd)


def main(argv, stdin, stdout):
    """Runs one command; `stdin`, `stdout` binary files. 2 for a command it does not know."""
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    if command == "source":
        blocks = [json_line(fetch_source(args[0], args[1], args[2:], stdin))]
    elif command == "list":
        blocks = [json_line(list_outputs(args[0], int(args[1])))]
    elif command == "cat":
        blocks = byte_range(args[0], int(args[1]), int(args[2]))
    elif command == "frames":
        blocks = iter_frames(args[0], json.loads(stdin.read()))
    else:
        sys.stderr.write("usage: files.py source|list|cat|frames ARGS\n")
        return 2
    for block in blocks:
        stdout.write(block)
    stdout.flush()
    return 0


def json_line(answer):
    return (json.dumps(answer) + "\n").encode("utf-8")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], sys.stdin.buffer, sys.stdout.buffer))
