"""The job supervisor: a standard-library program that runs one job on a target and outlives the worker.

It is sent to the target as text (Python >= 3.11 there; it imports nothing but the standard library)
and works in the job's workspace `<working_dir>/.mmt/jobs/<jobId>/` (mode 700; refused when it, or a
directory between it and the working directory, is a symbolic link). Subcommands, each printing one
JSON object on stdout (exit 0; a refusal prints `{"error", "code"}` and exits 3):

    start  <job_dir>   spec JSON on stdin (see runtimes.build_spec). Idempotent under `start.lock`
                       (flock): an existing state.json must belong to the same job, lease and spec
                       hash, and is returned instead of starting twice (anything else is refused with
                       `state_mismatch`). Otherwise writes spec.json (0600: it holds the job token),
                       the files of the spec, a copy of this program, and forks the supervisor daemon
                       into a new session (stdin /dev/null, SIGHUP ignored), so an SSH drop or a worker
                       restart does not touch it (a recovery spawns the workspace's copy instead).
    poll   <job_dir> [--facts=<container binary>]
                       the state. Liveness is decided by process identity `<boot_id>:<start time>`
                       from /proc/<pid>/stat, so a reused PID never counts as alive. If the supervisor
                       is gone before writing an end state, the status is `unknown` (`stored_status`
                       keeps what it last wrote; `process_alive` says whether the job's process still
                       runs); the job is never started again (see "Recovery"). With --facts, a job
                       still to start (absent, or recoverable) also gets the target's `facts` (below),
                       so the worker learns both in one run.
    facts  <container binary or "">
                       the target user's uid/gid and `<binary> exec --help` (runtimes.read_facts).
    release <job_dir>  for a spec with `hold` (the replicas of a cluster job): lets the job's process
                       start. Such a supervisor prepares (venv, `docker container create`), then says
                       `held: true` (status still `starting`, `prepared_at` set) and waits for this, so
                       the worker starts every replica's process together once all are prepared
                       (docs/cluster-jobs.md, step 1). Idempotent; a stop request wins over it; after
                       `hold_seconds` (default a day) unreleased it ends `failed_to_start`/`hold_expired`.
    cancel <job_dir> [wait_seconds]
                       writes cancel.request and waits for the end state: SIGTERM to the job's process
                       group, SIGKILL after the grace (10 s; `grace_seconds` in the spec), then waits
                       until no member of the group is left. Docker: `docker stop -t <grace>`, then
                       `docker rm -v`. With the supervisor gone, cancel does the same itself.
    follow <job_dir> <stdout_offset> <stderr_offset>
                       one long-lived stream of both logs from those byte offsets (DESIGN §13: one
                       channel is ~150x faster than many small reads), until the job has ended and
                       both files are drained; then a final state frame. Framing (binary, compact):
                       the magic `MMTF1\\n`, then frames of a 13-byte header `>cQI` (kind, offset,
                       length) and the payload. Kinds: `o` stdout bytes, `e` stderr bytes (cut at a
                       UTF-8 character boundary, at most 256 KiB), `s` state JSON (on each change;
                       the last one has `"final": true`), `k` keepalive every 5 s while idle.
    run    <job_dir> [--recover]
                       the daemon itself (spawned by start; not for callers).

The daemon records itself in state.json, prepares (python runtime: a venv per requirements hash under
`<working_dir>/.mmt-cache/venvs/`, built under a lock, read-only once complete, and reused; docker:
`docker container create`),
starts the job in its own session and process group with stdout.log/stderr.log appended, enforces the
walltime (SIGTERM, SIGKILL after the grace; status `timed_out`), and after the job's main process has
ended also stops what is left of its process group, so nothing runs unsupervised once a job has ended.
It is a child subreaper where Linux allows, so orphaned grandchildren are reaped rather than left as
zombies. SIGTERM or SIGINT to the daemon writes cancel.request (the job is then stopped as by cancel).
Notes of the supervisor go into stderr.log prefixed `[mado] `; for each one `order.log` records where it
falls between the job's stdout and stderr bytes (`n <stderr size> <stdout size>` before the note is
written, `d <end of the note in stderr.log>` after), so a follower sends notes and the job's output in
the order they happened (`LogOrder`): a note written before the job's first line comes before it,
although the two are in different files.

Statuses: starting, running, exited, canceled, timed_out, failed_to_start (terminal: the last four),
and unknown (from poll only).

Recovery: `start` on a workspace whose supervisor is gone spawns a new supervisor only where that
cannot run the job a second time: for docker (it re-attaches to the existing container: waits for the
old `docker start -a` client, or `docker attach`es; it never starts a container that has started
before) and for a job whose process was never spawned (the supervisor died while preparing). A host
process whose supervisor is gone stays `unknown`; `cancel` can still stop it.

The second half of this file is the worker's side (`Remote`, `FrameReader`): the worker runs each
command by this program's sha256 (worker_agent.core.ship: the target keeps a copy per content under
~/.cache/mado/programs and gets the program only when it lacks it), stdin the command's payload, so
each command runs the very program the worker has, and a workspace's daemon runs the copy that
started it (supervisor.py in the workspace)."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time

FORMAT = 1
TERMINAL = ("exited", "canceled", "timed_out", "failed_to_start")
DEFAULT_GRACE = 10  # seconds from SIGTERM to SIGKILL
CHUNK = 256 * 1024
MAGIC = b"MMTF1\n"
HEADER = struct.Struct(">cQI")
KEEPALIVE_SECONDS = 5.0
NOTE = "[mado] "
JOB_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
RUNTIMES = ("python", "docker", "apptainer", "singularity", "process")
SPEC_FILE, STATE_FILE, LOCK_FILE, CANCEL_FILE = "spec.json", "state.json", "start.lock", "cancel.request"
RELEASE_FILE = "release"
HOLD_SECONDS = 24 * 3600  # a held supervisor whose worker never comes back gives up after this
STDOUT_FILE, STDERR_FILE, SUPERVISOR_LOG, PROGRAM_FILE = "stdout.log", "stderr.log", "supervisor.log", "supervisor.py"
ORDER_FILE = "order.log"  # where each note falls between stdout and stderr (see LogOrder)
# A note begun but not finished this long ago (its supervisor died between two writes) no longer holds
# the job's stdout back.
UNFINISHED_NOTE_SECONDS = 5.0
POLL_INTERVAL = 0.05
# The environment of preparation steps (venv, pip): the host pass-through of jobs plus what pip needs to
# reach a package index (proxies, certificates, its config).
PREPARE_PASS_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "TMPDIR", "http_proxy", "https_proxy",
                    "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR",
                    "REQUESTS_CA_BUNDLE", "XDG_CONFIG_HOME", "XDG_CACHE_HOME")


class Refused(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


# -- process identity ---------------------------------------------------------------------------

_boot_id: str | None = None


def boot_id() -> str:
    global _boot_id
    if _boot_id is None:
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                _boot_id = f.read().strip()
        except OSError:
            _boot_id = "unknown-boot"
    return _boot_id


def proc_stat(pid) -> tuple[str, int, str] | None:
    """(state, process group, start time in clock ticks) of a process, or None."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            data = f.read()
    except (OSError, ValueError, TypeError):
        return None
    fields = data[data.rindex(b")") + 2:].split()
    try:
        return fields[0].decode(), int(fields[2]), fields[19].decode()
    except (IndexError, ValueError):
        return None


def identity(pid) -> str | None:
    """`<boot_id>:<start time>`: unique for a process across PID reuse and reboots."""
    st = proc_stat(pid)
    return f"{boot_id()}:{st[2]}" if st else None


def is_alive(pid, ident) -> bool:
    """The process `pid` still is the one recorded as `ident` and has not ended (zombies have ended)."""
    if not pid or not ident:
        return False
    st = proc_stat(pid)
    return bool(st) and st[0] not in ("Z", "X", "x") and f"{boot_id()}:{st[2]}" == ident


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid`."""
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(name)
            if st and st[1] == pgid and st[0] not in ("Z", "X", "x"):
                members.append(int(name))
    return members


def _default_signals() -> None:
    """In a job's process before exec: an ignored signal would stay ignored in the job (SIGHUP is ignored
    by the supervisor), so the job starts with default dispositions."""
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)


def _set_subreaper() -> None:
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):  # not Linux, or no libc: orphans go to init instead
        return


# -- files --------------------------------------------------------------------------------------

def _no_symlink_dir(path: str, *, create: bool, mode: int = 0o700) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            raise Refused("absent", f"{path} does not exist.") from None
        try:
            os.mkdir(path, mode)
        except FileExistsError:  # another job's start made it meanwhile
            pass
        st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise Refused("symlink_refused", f"{path} is a symbolic link; the workspace must be a real directory "
                                         "inside the working directory (remove the link).")
    if not stat.S_ISDIR(st.st_mode):
        raise Refused("bad_job_dir", f"{path} exists and is not a directory: remove it.")


def private_dir(path: str) -> None:
    """Mode 700 on a directory of ours that others could enter or list (one SSH user may serve every
    project of a Public computer: what can be private is). A directory of another user is left alone."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)


def read_only_tree(path: str) -> None:
    """No write bit on anything under `path` (a venv once complete): jobs that share it cannot change it
    by accident. Symbolic links are skipped (chmod would change their target, e.g. the system Python)."""
    for dirpath, dirnames, filenames in os.walk(path, topdown=False):
        for name in filenames + dirnames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o222:
                os.chmod(full, stat.S_IMODE(st.st_mode) & ~0o222)
    st = os.lstat(path)
    os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o222)


def remove_tree(path: str) -> None:
    """shutil.rmtree that also removes read-only trees (read_only_tree): write bits back on the
    directories first, never following links."""
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, 0o700)
        for dirpath, dirnames, _ in os.walk(path):
            for name in dirnames:
                full = os.path.join(dirpath, name)
                if not os.path.islink(full):
                    os.chmod(full, 0o700)
    shutil.rmtree(path)


def checked_dirs(base: str, parts: list[str], *, create: bool) -> str:
    """`base/part1/part2/...`, refusing symbolic links at every step below `base`."""
    path = base
    for part in parts:
        path = os.path.join(path, part)
        _no_symlink_dir(path, create=create)
    return path


def split_job_dir(job_dir: str) -> tuple[str, str]:
    """(working_dir, job id) of `<working_dir>/.mmt/jobs/<jobId>`."""
    norm = os.path.normpath(job_dir)
    if not os.path.isabs(job_dir) or norm != job_dir.rstrip("/"):
        raise Refused("bad_job_dir", f"The job directory must be an absolute, normalised path: {job_dir!r}.")
    jobs, job_id = os.path.split(norm)
    mmt, jobs_name = os.path.split(jobs)
    working_dir, mmt_name = os.path.split(mmt)
    if (mmt_name, jobs_name) != (".mmt", "jobs") or not JOB_ID.match(job_id):
        raise Refused("bad_job_dir", f"{job_dir} is not a job workspace (<working_dir>/.mmt/jobs/<jobId>).")
    return working_dir, job_id


def existing_job_dir(job_dir: str) -> str:
    working_dir, job_id = split_job_dir(job_dir)
    return checked_dirs(working_dir, [".mmt", "jobs", job_id], create=False)


def read_json(path: str):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return json.loads(f.read().decode("utf-8"))


def write_file(path: str, data: bytes, mode: int = 0o600) -> None:
    """Atomically replace `path` (never following a link) with `data`."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_json(path: str, value) -> None:
    write_file(path, (json.dumps(value, indent=1, sort_keys=True) + "\n").encode("utf-8"))


def file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def open_log(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)


# -- the spec -----------------------------------------------------------------------------------

def _redact(value, secrets: list[str]):
    if isinstance(value, str):
        for s in secrets:
            if s:
                value = value.replace(s, "<secret>")
        return value
    if isinstance(value, list):
        return [_redact(v, secrets) for v in value]
    if isinstance(value, dict):
        return {k: _redact(v, secrets) for k, v in value.items()}
    return value


def spec_hash(spec: dict) -> str:
    """sha256 of the canonical spec with secrets blanked out, so a job token handed out again (resume)
    does not make the same job look like another one."""
    body = {k: v for k, v in spec.items() if k not in ("spec_hash", "secrets")}
    canonical = json.dumps(_redact(body, list(spec.get("secrets") or [])), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _str_list(value, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Refused("bad_spec", f"{what} must be a list of strings.")
    return value


def validate_spec(spec) -> dict:
    if not isinstance(spec, dict):
        raise Refused("bad_spec", "The spec must be a JSON object.")
    spec = dict(spec)
    spec["job_id"] = str(spec.get("job_id", ""))
    if not JOB_ID.match(spec["job_id"]):
        raise Refused("bad_spec", "job_id must be 1-64 letters, digits, '-' or '_'.")
    if not isinstance(spec.get("lease_id"), str) or not spec["lease_id"]:
        raise Refused("bad_spec", "lease_id is missing.")
    if not isinstance(spec.get("working_dir"), str) or not os.path.isabs(spec["working_dir"]):
        raise Refused("bad_spec", "working_dir must be an absolute path.")
    if spec.get("runtime") not in RUNTIMES:
        raise Refused("bad_spec", f"runtime must be one of {', '.join(RUNTIMES)}.")
    if not _str_list(spec.get("argv"), "argv"):
        raise Refused("bad_spec", "argv is empty.")
    env = spec.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise Refused("bad_spec", "env must map names to strings.")
    _str_list(spec.get("pass_env") or [], "pass_env")
    _str_list(spec.get("path_prepend") or [], "path_prepend")
    _str_list(spec.get("dirs") or [], "dirs")
    _str_list(spec.get("secrets") or [], "secrets")
    for entry in spec.get("files") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str) or \
                not isinstance(entry.get("content"), str):
            raise Refused("bad_spec", "files must be objects with path and content.")
    for rel in [e["path"] for e in spec.get("files") or []] + list(spec.get("dirs") or []):
        parts = rel.split("/")
        if os.path.isabs(rel) or any(p in ("", ".", "..") for p in parts):
            raise Refused("bad_spec", f"{rel!r} must be a relative path inside the workspace.")
    docker = spec.get("docker")
    if spec["runtime"] == "docker" and (not isinstance(docker, dict) or not isinstance(docker.get("name"), str)
                                        or not _str_list(docker.get("create"), "docker.create")
                                        or not isinstance(docker.get("bin"), str)):
        raise Refused("bad_spec", "A docker job needs docker.bin, docker.name and docker.create.")
    venv = spec.get("venv")
    if venv is not None and not (isinstance(venv, dict) and all(isinstance(venv.get(k), str)
                                                                for k in ("python", "dir", "requirements"))):
        raise Refused("bad_spec", "venv must have python, dir and requirements.")
    if venv is not None:
        cache = os.path.join(spec["working_dir"], ".mmt-cache", "venvs")
        parent, key = os.path.split(os.path.normpath(venv["dir"]))
        if parent != os.path.normpath(cache) or not JOB_ID.match(key):
            raise Refused("bad_spec", f"venv.dir must be a directory in {cache}.")
    if not isinstance(spec.get("hold", False), bool):
        raise Refused("bad_spec", "hold must be true or false.")
    hold_seconds = spec.get("hold_seconds", HOLD_SECONDS)
    if not isinstance(hold_seconds, (int, float)) or isinstance(hold_seconds, bool) or hold_seconds <= 0:
        raise Refused("bad_spec", "hold_seconds must be a positive number.")
    grace = spec.get("grace_seconds", DEFAULT_GRACE)
    walltime = spec.get("walltime_seconds")
    if not isinstance(grace, (int, float)) or grace < 0 or \
            (walltime is not None and (not isinstance(walltime, (int, float)) or walltime <= 0)):
        raise Refused("bad_spec", "grace_seconds and walltime_seconds must be positive numbers.")
    if spec.get("spec_hash") and spec["spec_hash"] != spec_hash(spec):
        raise Refused("bad_spec", "spec_hash does not match the spec: it was changed on the way.")
    return spec


# -- state as callers see it ---------------------------------------------------------------------

def describe(job_dir: str, state: dict | None) -> dict:
    """The state with liveness decided now: the result of poll."""
    if state is None:
        return {"status": "absent", "job_dir": job_dir}
    out = dict(state)
    sup = state.get("supervisor") or {}
    out["supervisor_alive"] = is_alive(sup.get("pid"), sup.get("identity"))
    if state.get("status") not in TERMINAL and not out["supervisor_alive"]:
        # It may just have written its end state and left: read again before calling it unknown.
        again = read_json(os.path.join(job_dir, STATE_FILE)) or state
        if again.get("status") in TERMINAL or again.get("supervisor") != state.get("supervisor"):
            return describe(job_dir, again)
        out["stored_status"] = state.get("status")
        out["status"] = "unknown"
        out["recoverable"] = recoverable(state)
    out["process_alive"] = is_alive(state.get("pid"), state.get("identity"))
    out["stdout_size"] = file_size(os.path.join(job_dir, STDOUT_FILE))
    out["stderr_size"] = file_size(os.path.join(job_dir, STDERR_FILE))
    out["cancel_requested"] = os.path.exists(os.path.join(job_dir, CANCEL_FILE))
    return out


def recoverable(state: dict) -> bool:
    """Can a new supervisor take over without running the job a second time?"""
    if state.get("status") in TERMINAL:
        return False
    return state.get("runtime") == "docker" or not state.get("pid")


def _refuse_mismatch(state: dict, spec: dict, digest: str) -> None:
    for key, want in (("job_id", spec["job_id"]), ("lease_id", spec["lease_id"]), ("spec_hash", digest)):
        if state.get(key) != want:
            raise Refused("state_mismatch",
                          f"This workspace already belongs to another start (its {key} differs): the job is not "
                          "started again. Poll it, or remove the workspace if it is stale.")


# -- start --------------------------------------------------------------------------------------

def spawn_daemon(job_dir: str, *, recover: bool) -> subprocess.Popen:
    log = open_log(os.path.join(job_dir, SUPERVISOR_LOG))
    try:
        argv = [sys.executable or "python3", "-I", os.path.join(job_dir, PROGRAM_FILE), "run", job_dir]
        if recover:
            argv.append("--recover")
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=job_dir,
                                close_fds=True, start_new_session=True)
    finally:
        os.close(log)


def fork_daemon(job_dir: str) -> int:
    """The daemon as a fork of this start command: the program is loaded already, so a job starts without
    a second Python and a second compile. Detached as spawn_daemon's: its own session, stdin /dev/null,
    output into supervisor.log, no other descriptor kept (the start lock, the SSH channel's pipes). Only
    for a single-threaded caller (the `start` command; the site runner spawns instead)."""
    log = open_log(os.path.join(job_dir, SUPERVISOR_LOG))
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        os.close(log)
        return pid
    code = 1
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, max(256, os.sysconf("SC_OPEN_MAX")))  # the start lock above all: kept, it deadlocks run
        os.chdir(job_dir)
        code = cmd_run(job_dir, False)
    except BaseException:  # noqa: BLE001 -- into supervisor.log; poll then finds the supervisor gone
        import traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def cmd_start(job_dir: str, payload: bytes, source: bytes, *, fork: bool = False) -> dict:
    try:
        spec = validate_spec(json.loads(payload.decode("utf-8")))
    except ValueError:
        raise Refused("bad_spec", "The spec on stdin is not JSON.") from None
    digest = spec_hash(spec)
    want = os.path.join(spec["working_dir"], ".mmt", "jobs", spec["job_id"])
    if os.path.normpath(want) != os.path.normpath(job_dir) or not os.path.isabs(job_dir):
        raise Refused("bad_job_dir", f"The workspace of job {spec['job_id']} is {want}, not {job_dir}.")
    job_dir = os.path.normpath(job_dir)
    if not os.path.isdir(spec["working_dir"]):
        raise Refused("working_dir_missing", f"The working directory {spec['working_dir']} does not exist on the "
                                             "target: create it or correct the computer's settings.")
    checked_dirs(spec["working_dir"], [".mmt", "jobs", spec["job_id"]], create=True)
    st = os.lstat(job_dir)
    if st.st_uid != os.getuid():
        raise Refused("bad_job_dir", f"{job_dir} belongs to another user.")
    os.chmod(job_dir, 0o700)
    for parent in (os.path.dirname(job_dir), os.path.dirname(os.path.dirname(job_dir))):  # .mmt/jobs, .mmt
        private_dir(parent)
    lock = os.open(os.path.join(job_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state_path = os.path.join(job_dir, STATE_FILE)
        state = read_json(state_path)
        if state is not None:
            _refuse_mismatch(state, spec, digest)
            return dict(describe(job_dir, _maybe_recover(job_dir, state)), started=False)
        write_file(os.path.join(job_dir, SPEC_FILE), (json.dumps(spec) + "\n").encode("utf-8"))
        write_file(os.path.join(job_dir, PROGRAM_FILE), source, 0o600)
        for rel in spec.get("dirs") or []:
            checked_dirs(job_dir, rel.split("/"), create=True)
        for entry in spec.get("files") or []:
            parts = entry["path"].split("/")
            parent = checked_dirs(job_dir, parts[:-1], create=True)
            write_file(os.path.join(parent, parts[-1]), entry["content"].encode("utf-8"), int(entry.get("mode", 0o600)))
        daemon = fork_daemon(job_dir) if fork else spawn_daemon(job_dir, recover=False).pid
        now = time.time()
        state = {"format": FORMAT, "job_id": spec["job_id"], "lease_id": spec["lease_id"], "spec_hash": digest,
                 "runtime": spec["runtime"], "status": "starting", "pid": None, "pgid": None, "identity": None,
                 "exit_code": None, "signal": None, "error": None, "error_code": None, "created_at": now,
                 "started_at": None, "ended_at": None, "updated_at": now, "boot_id": boot_id(), "recoveries": 0,
                 "supervisor": {"pid": daemon, "identity": identity(daemon)}}
        if spec["runtime"] == "docker":
            state["docker"] = {"name": spec["docker"]["name"], "created": False, "started": False}
        write_json(state_path, state)
        return dict(describe(job_dir, state), started=True)
    finally:
        os.close(lock)


def _maybe_recover(job_dir: str, state: dict) -> dict:
    """Called under the start lock: a new supervisor where the old one is gone and taking over cannot run
    the job twice (see the module's "Recovery")."""
    sup = state.get("supervisor") or {}
    if state.get("status") in TERMINAL or is_alive(sup.get("pid"), sup.get("identity")) or not recoverable(state):
        return state
    daemon = spawn_daemon(job_dir, recover=True)
    state = dict(state, supervisor={"pid": daemon.pid, "identity": identity(daemon.pid)},
                 recoveries=int(state.get("recoveries") or 0) + 1, updated_at=time.time())
    write_json(os.path.join(job_dir, STATE_FILE), state)
    return state


# -- the daemon ---------------------------------------------------------------------------------

class Daemon:
    def __init__(self, job_dir: str, state: dict, spec: dict):
        self.dir = job_dir
        self.state = state
        self.spec = spec
        self.grace = float(spec.get("grace_seconds", DEFAULT_GRACE))
        self.reaped: dict[int, int] = {}
        self.children: list[subprocess.Popen] = []
        self.stop_reason: str | None = None  # canceled | timed_out once a stop has begun
        self.kill_at: float | None = None
        self.killed = False
        self.via_docker = False  # once the job is a container: stop it with docker stop
        self.reattached = 0
        self.out_fd = open_log(self.path(STDOUT_FILE))
        self.err_fd = open_log(self.path(STDERR_FILE))
        # Notes through a descriptor of their own: children share err_fd's file offset, so only this one
        # tells exactly where a note ended.
        self.note_fd = open_log(self.path(STDERR_FILE))
        self.order_fd = open_log(self.path(ORDER_FILE))
        self.out_peek = os.open(self.path(STDOUT_FILE), os.O_RDONLY | os.O_NOFOLLOW)

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def save(self, **changes) -> None:
        self.state.update(changes)
        self.state["updated_at"] = time.time()
        write_json(self.path(STATE_FILE), self.state)

    def note(self, text: str) -> None:
        """A `[mado]` line in stderr.log, its place among the job's output recorded in order.log first."""
        text = _redact(text, list(self.spec.get("secrets") or []))
        try:
            os.write(self.order_fd, f"n {os.fstat(self.note_fd).st_size} {stdout_boundary(self.out_peek)}\n".encode())
            os.write(self.note_fd, f"{NOTE}{text}\n".encode("utf-8", "replace"))
            os.write(self.order_fd, f"d {os.lseek(self.note_fd, 0, os.SEEK_CUR)}\n".encode())
        except OSError:
            pass

    def cancel_requested(self) -> bool:
        return os.path.exists(self.path(CANCEL_FILE))

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.reaped[pid] = status

    def spawn(self, argv: list[str], env: dict, cwd: str | None, stdout_fd: int, stderr_fd: int) -> int:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=stdout_fd,
                                stderr=stderr_fd, close_fds=True, start_new_session=True,
                                preexec_fn=_default_signals)  # noqa: PLW1509 -- the daemon has one thread
        self.children.append(proc)
        return proc.pid

    def job_env(self) -> dict:
        env = {k: os.environ[k] for k in self.spec.get("pass_env") or [] if k in os.environ}
        env.update(self.spec.get("env") or {})
        prepend = list(self.spec.get("path_prepend") or [])
        if prepend:
            env["PATH"] = ":".join(prepend + ([env["PATH"]] if env.get("PATH") else ["/usr/bin:/bin"]))
        return env

    # stopping -------------------------------------------------------------------------------

    def begin_stop(self, reason: str, pgid: int | None) -> None:
        self.stop_reason = reason
        if reason == "canceled":
            self.note("Stop requested: sending SIGTERM" + (" (docker stop)" if self.via_docker else "")
                      + f"; SIGKILL follows after {self.grace:g} s.")
        else:
            self.note(f"Walltime of {self.spec.get('walltime_seconds')} s reached: sending SIGTERM; SIGKILL "
                      f"follows after {self.grace:g} s.")
        if self.via_docker:
            docker = self.spec["docker"]
            self.children.append(subprocess.Popen(
                [docker["bin"], "stop", "-t", str(int(-(-self.grace // 1))), docker["name"]], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=self.err_fd, env=self.job_env(), close_fds=True,
                start_new_session=True))
            self.kill_at = time.monotonic() + self.grace + 30.0  # the attach client ends once the container has
        else:
            self._signal(pgid, signal.SIGTERM)
            self.kill_at = time.monotonic() + self.grace

    def _signal(self, pgid: int | None, sig: int) -> None:
        if pgid:
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass

    def check_stop(self, pgid: int | None, walltime_deadline: float | None) -> None:
        """One step of the stop state machine: begin on a request or the walltime, escalate to SIGKILL."""
        if self.stop_reason is None:
            if self.cancel_requested():
                self.begin_stop("canceled", pgid)
            elif walltime_deadline is not None and time.time() >= walltime_deadline:
                self.begin_stop("timed_out", pgid)
        elif not self.killed and self.kill_at is not None and time.monotonic() >= self.kill_at:
            self.killed = True
            if pgid and group_members(pgid):
                self.note(f"Still running {self.grace:g} s after SIGTERM: sending SIGKILL.")
            self._signal(pgid, signal.SIGKILL)

    def wait_pid(self, pid: int, pgid: int, walltime_deadline: float | None = None) -> int:
        """Wait for our child `pid`, handling stop requests and the walltime meanwhile; its wait status."""
        while True:
            self.reap()
            if pid in self.reaped:
                return self.reaped.pop(pid)
            self.check_stop(pgid, walltime_deadline)
            time.sleep(POLL_INTERVAL)

    def wait_foreign(self, pid: int, ident: str, pgid: int, walltime_deadline: float | None) -> None:
        """Wait for a process that is not our child (left by a previous supervisor)."""
        while is_alive(pid, ident):
            self.reap()
            self.check_stop(pgid, walltime_deadline)
            time.sleep(POLL_INTERVAL)

    def clear_group(self, pgid: int) -> None:
        """After the main process: stop whatever is left of its group, and wait until nothing is."""
        members = group_members(pgid)
        if members and self.stop_reason is None:
            self.note(f"{len(members)} process(es) of the job still running after it ended: sending SIGTERM.")
            self._signal(pgid, signal.SIGTERM)
            self.kill_at = time.monotonic() + self.grace
        give_up = None
        while group_members(pgid):
            self.reap()
            now = time.monotonic()
            if not self.killed and (self.kill_at is None or now >= self.kill_at):
                self.killed = True
                self.note("Processes of the job still running: sending SIGKILL.")
                self._signal(pgid, signal.SIGKILL)
            if self.killed and give_up is None:
                give_up = now + 60.0
            elif give_up is not None and now >= give_up:
                self.note("Processes of the job did not end after SIGKILL (uninterruptible?); giving up waiting.")
                break
            time.sleep(POLL_INTERVAL)
        self.reap()

    # running --------------------------------------------------------------------------------

    @property
    def is_docker(self) -> bool:
        return self.spec["runtime"] == "docker"

    def finish(self, status: str, **fields) -> None:
        self.save(status=status, ended_at=time.time(), **fields)

    def fail_to_start(self, code: str, message: str) -> None:
        self.note(message)
        self.finish("failed_to_start", error=_redact(message, list(self.spec.get("secrets") or [])), error_code=code)

    def run_step(self, argv: list[str], env: dict, *, quiet_stdout: bool = False) -> int | None:
        """A preparation command, its output into stderr.log; None when a stop request ended it."""
        try:
            pid = self.spawn(argv, env, None, subprocess.DEVNULL if quiet_stdout else self.err_fd, self.err_fd)
        except OSError as exc:
            self.note(f"Cannot run {argv[0]}: {exc.strerror or exc}.")
            return 127
        self.save(prepare={"pid": pid, "identity": identity(pid)})
        status = self.wait_pid(pid, pid)
        self.clear_group(pid)
        self.kill_at, self.killed = None, False
        if self.stop_reason:
            return None
        return os.waitstatus_to_exitcode(status)

    def run(self, recover: bool) -> None:
        if recover and self.is_docker:
            self.recover_docker()
            return
        if recover:
            self.note("The previous supervisor ended before the job started; a new one takes over.")
            old = self.state.get("prepare") or {}
            if is_alive(old.get("pid"), old.get("identity")):
                self._signal(old["pid"], signal.SIGKILL)
        if self.cancel_requested():
            self.finish("canceled")
            return
        if self.spec.get("venv") and not self.prepare_venv():
            return
        if self.is_docker:
            self.run_docker()
        else:
            self.run_process()

    def prepare_venv(self) -> bool:
        venv = self.spec["venv"]
        base, key = os.path.split(venv["dir"])
        checked_dirs(self.spec["working_dir"], os.path.relpath(base, self.spec["working_dir"]).split("/"), create=True)
        for directory in (base, os.path.dirname(base)):  # .mmt-cache/venvs, .mmt-cache
            private_dir(directory)
        lock = os.open(venv["dir"] + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            waited = False
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not waited:
                        self.note("Another job is building the same venv: waiting for it.")
                        waited = True
                    if self.cancel_requested():
                        self.finish("canceled")
                        return False
                    time.sleep(0.2)
            ready = os.path.join(venv["dir"], ".mmt-ready")
            if os.path.exists(ready):
                self.note(f"Reusing the venv for these requirements ({key}).")
                os.utime(ready)  # the owner may, on a read-only file too
                if os.lstat(venv["dir"]).st_mode & 0o222:  # made before venvs were read-only, or cut short
                    read_only_tree(venv["dir"])
                return True
            if os.path.lexists(venv["dir"]):
                _no_symlink_dir(venv["dir"], create=False)
                remove_tree(venv["dir"])
            # pip may run build code of sdists: it gets what pip needs from the target, nothing else.
            env = {k: v for k, v in os.environ.items() if k in PREPARE_PASS_ENV or k.startswith("PIP_")}
            env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
            self.note(f"Creating a venv with {venv['python']} ({key}).")
            rc = self.run_step([venv["python"], "-m", "venv", venv["dir"]], env)
            if rc is None:
                self.finish("canceled")
                return False
            if rc != 0:
                self.fail_to_start("venv_failed", f"Creating the venv with {venv['python']} failed (exit code {rc}).")
                return False
            requirements = os.path.join(venv["dir"], "requirements.txt")
            write_file(requirements, venv["requirements"].encode("utf-8"))
            if venv["requirements"].strip():
                self.note("Installing the requirements.")
                rc = self.run_step([os.path.join(venv["dir"], "bin", "python"), "-m", "pip", "install",
                                    "--disable-pip-version-check", "--no-input", "-r", requirements], env)
                if rc is None:
                    self.finish("canceled")
                    return False
                if rc != 0:
                    self.fail_to_start("requirements_failed",
                                       f"Installing the requirements failed (pip exit code {rc}); see the lines above.")
                    return False
            write_file(ready, b"")
            # Shared by every job with these requirements (of any project, where one SSH user serves
            # them all): read-only from now on; a job installs nothing into it.
            read_only_tree(venv["dir"])
            self.note("The venv is ready.")
            return True
        finally:
            os.close(lock)

    def wait_release(self) -> str | None:
        """With `hold` in the spec: everything is prepared; say so (`held`, `prepared_at`) and wait for the
        worker's `release`. None once released (or without `hold`); `canceled` when a stop request came
        first, `hold_expired` after `hold_seconds`. The caller ends the job in those cases."""
        if not self.spec.get("hold"):
            return None
        prepared_at = self.state.get("prepared_at") or time.time()
        if not os.path.exists(self.path(RELEASE_FILE)) and not self.cancel_requested():
            self.save(held=True, prepared_at=prepared_at)
            self.note("Prepared; waiting until every replica of the job is prepared.")
        deadline = time.monotonic() + float(self.spec.get("hold_seconds", HOLD_SECONDS))
        while True:
            if self.cancel_requested():  # checked first: a replica stopped while held never runs
                return "canceled"
            if os.path.exists(self.path(RELEASE_FILE)):
                self.save(held=False, prepared_at=prepared_at)
                return None
            if time.monotonic() >= deadline:
                return "hold_expired"
            time.sleep(POLL_INTERVAL)

    def held_back(self, *, container: bool = False) -> bool:
        """`wait_release`, ending the job when it says so (removing its container first); True then."""
        why = self.wait_release()
        if why is None:
            return False
        if container:
            self.docker_remove()
        if why == "canceled":
            self.finish("canceled")
        else:
            self.fail_to_start("hold_expired", f"The worker did not start this replica within "
                                               f"{float(self.spec.get('hold_seconds', HOLD_SECONDS)):g} s of its "
                                               "preparation; it was not started.")
        return True

    def walltime_deadline(self) -> float | None:
        walltime = self.spec.get("walltime_seconds")
        started = self.state.get("started_at")
        return started + float(walltime) if walltime and started else None

    def run_process(self) -> None:
        spec = self.spec
        if self.held_back():
            return
        try:
            pid = self.spawn(spec["argv"], self.job_env(), spec.get("cwd") or None, self.out_fd, self.err_fd)
        except OSError as exc:
            self.fail_to_start("command_not_runnable",
                               f"Cannot start {spec['argv'][0]}: {exc.strerror or exc}. Check the command.")
            return
        self.save(status="running", pid=pid, pgid=pid, identity=identity(pid), started_at=time.time())
        status = self.wait_pid(pid, pid, self.walltime_deadline())
        self.clear_group(pid)
        self.end_with(os.waitstatus_to_exitcode(status))

    def end_with(self, code: int | None) -> None:
        exit_code, sig = (code, None) if code is None or code >= 0 else (None, -code)
        self.finish(self.stop_reason or "exited", exit_code=exit_code, signal=sig)

    # docker ---------------------------------------------------------------------------------

    def docker_run(self, *args: str) -> subprocess.CompletedProcess:
        docker = self.spec["docker"]
        return subprocess.run([docker["bin"], *args], stdin=subprocess.DEVNULL, capture_output=True,
                              env=self.job_env(), timeout=120, check=False)

    def docker_inspect(self) -> tuple[str, int | None] | None:
        """(status, exit code) of the job's container, or None when there is none."""
        try:
            got = self.docker_run("container", "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}",
                                  self.spec["docker"]["name"])
        except (OSError, subprocess.TimeoutExpired):
            return None
        words = got.stdout.decode("utf-8", "replace").split()
        if got.returncode != 0 or len(words) != 2:
            return None
        return words[0], int(words[1]) if words[1].lstrip("-").isdigit() else None

    def docker_remove(self) -> None:
        try:
            got = self.docker_run("rm", "-v", self.spec["docker"]["name"])
            if got.returncode != 0:
                self.note("docker rm failed: " + got.stderr.decode("utf-8", "replace").strip()[-500:])
        except (OSError, subprocess.TimeoutExpired):
            self.note("docker rm did not finish.")

    def run_docker(self) -> None:
        docker = self.spec["docker"]
        if not self.state["docker"].get("created"):
            rc = self.run_step(docker["create"], self.job_env(), quiet_stdout=True)  # it prints the container id
            if rc is None:
                self.finish("canceled")
                return
            if rc != 0:
                self.fail_to_start("docker_create_failed",
                                   f"docker container create exited with {rc}; see the lines above.")
                return
            self.save(docker=dict(self.state["docker"], created=True))
        if self.held_back(container=True):
            return
        if self.cancel_requested():
            self.docker_remove()
            self.finish("canceled")
            return
        self.start_attached(["start", "-a"])

    def start_attached(self, how: list[str], *, first: bool = True) -> None:
        docker = self.spec["docker"]
        try:
            pid = self.spawn([docker["bin"], *how, docker["name"]], self.job_env(), None, self.out_fd, self.err_fd)
        except OSError as exc:
            self.fail_to_start("command_not_runnable", f"Cannot run {docker['bin']}: {exc.strerror or exc}.")
            return
        self.via_docker = True
        changes = {"status": "running", "pid": pid, "pgid": pid, "identity": identity(pid),
                   "docker": dict(self.state["docker"], started=True)}
        if first or not self.state.get("started_at"):
            changes["started_at"] = time.time()
        self.save(**changes)
        status = self.wait_pid(pid, pid, self.walltime_deadline())
        self.clear_group(pid)
        self.end_docker(os.waitstatus_to_exitcode(status))

    def end_docker(self, client_code: int | None) -> None:
        inspected = self.docker_inspect()
        if inspected and inspected[0] in ("running", "paused", "restarting"):
            if self.stop_reason is None and self.reattached < 10:
                # The attach client ended (killed?) while the container runs on: watch it again.
                self.reattached += 1
                self.note("The docker client ended while the container still runs: re-attaching.")
                time.sleep(min(self.reattached, 5))
                self.start_attached(["attach", "--no-stdin", "--sig-proxy=false"], first=False)
                return
            try:
                self.docker_run("kill", self.spec["docker"]["name"])
            except (OSError, subprocess.TimeoutExpired):
                pass
            inspected = self.docker_inspect()
        code = inspected[1] if inspected and inspected[0] in ("exited", "dead") else client_code
        if inspected is not None:
            self.docker_remove()
        self.end_with(code)

    def recover_docker(self) -> None:
        """Take over a docker job from a supervisor that is gone: never start a container a second time."""
        docker_state = self.state.get("docker") or {}
        inspected = self.docker_inspect()
        if inspected is None:
            if not docker_state.get("created"):
                self.note("The previous supervisor ended before creating the container; a new one takes over.")
                self.run_docker()
            else:
                self.note("The job's container is gone and its exit code with it.")
                self.finish("exited" if not self.cancel_requested() else "canceled", exit_code=None,
                            error="The container was removed while no supervisor watched it; its exit code is "
                                  "unknown.", error_code="container_gone")
            return
        status, _ = inspected
        if status == "created" and not docker_state.get("started"):
            self.note("The previous supervisor ended before starting the container; starting it now.")
            if self.held_back(container=True):
                return
            self.start_attached(["start", "-a"])
            return
        self.note(f"Re-attaching to the job's container ({status}) after the supervisor was restarted.")
        self.via_docker = True
        old_pid, old_ident = self.state.get("pid"), self.state.get("identity")
        if status in ("running", "paused", "restarting"):
            if is_alive(old_pid, old_ident):
                # The old `docker start -a` still writes the logs: wait for it to end.
                self.wait_foreign(old_pid, old_ident, self.state.get("pgid") or old_pid, self.walltime_deadline())
                self.clear_group(self.state.get("pgid") or old_pid)
                self.end_docker(None)
            else:
                self.start_attached(["attach", "--no-stdin", "--sig-proxy=false"], first=False)
            return
        self.end_docker(None)


def cmd_run(job_dir: str, recover: bool) -> int:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)

    def on_term(signum, frame):
        try:
            write_json(os.path.join(job_dir, CANCEL_FILE), {"requested_at": time.time(),
                                                            "by": f"signal {signum} to the supervisor"})
        except OSError:
            pass

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    _set_subreaper()
    lock = os.open(os.path.join(job_dir, LOCK_FILE), os.O_RDWR | os.O_NOFOLLOW)
    fcntl.flock(lock, fcntl.LOCK_EX)  # start holds it until it has written our pid into state.json
    try:
        state = read_json(os.path.join(job_dir, STATE_FILE))
        spec = read_json(os.path.join(job_dir, SPEC_FILE))
    finally:
        os.close(lock)
    if not state or not spec or (state.get("supervisor") or {}).get("pid") != os.getpid():
        return 0  # the start that spawned us did not finish: nothing to do
    daemon = Daemon(job_dir, state, spec)
    try:
        daemon.run(recover)
    except Exception as exc:  # noqa: BLE001 -- written down so poll tells the worker, never a silent hang
        import traceback
        traceback.print_exc()
        daemon.note(f"The supervisor failed: {type(exc).__name__}: {exc}")
        if daemon.state.get("status") not in TERMINAL:
            if daemon.state.get("pid"):
                daemon.save(error=f"supervisor failed: {type(exc).__name__}")  # poll will say unknown
            else:
                daemon.finish("failed_to_start", error=f"The supervisor failed: {type(exc).__name__}: {exc}",
                              error_code="supervisor_failed")
        return 1
    return 0


# -- poll, cancel -------------------------------------------------------------------------------

def cmd_poll(job_dir: str, facts_binary: str | None = None) -> dict:
    try:
        job_dir = existing_job_dir(job_dir)
        state = describe(job_dir, read_json(os.path.join(job_dir, STATE_FILE)))
    except Refused as exc:
        if exc.code != "absent":
            raise
        state = {"status": "absent", "job_dir": job_dir}
    if facts_binary is not None and (state["status"] == "absent" or state.get("recoverable")):
        state["facts"] = target_facts(facts_binary)
    return state


def target_facts(binary: str) -> dict:
    """The target user's uid/gid (docker's --user) and `<binary> exec --help` (a container runtime's
    flags; None when it is missing or no binary was named)."""
    help_text = None
    if binary:
        try:
            ran = subprocess.run([binary, "exec", "--help"], capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
            help_text = (ran.stdout + ran.stderr).decode("utf-8", "replace")
        except (OSError, subprocess.TimeoutExpired):
            help_text = None
    return {"uid": os.getuid(), "gid": os.getgid(), "help": help_text}


def cmd_release(job_dir: str) -> dict:
    """Let a held supervisor start the job's process (idempotent; see `release` above)."""
    try:
        job_dir = existing_job_dir(job_dir)
    except Refused as exc:
        if exc.code == "absent":
            return {"status": "absent", "job_dir": job_dir}
        raise
    state = read_json(os.path.join(job_dir, STATE_FILE))
    if state is None:
        return {"status": "absent", "job_dir": job_dir}
    if not os.path.exists(os.path.join(job_dir, RELEASE_FILE)):
        write_json(os.path.join(job_dir, RELEASE_FILE), {"released_at": time.time()})
    return describe(job_dir, state)


def stop_group_foreign(pgid: int, grace: float) -> None:
    """SIGTERM, SIGKILL after `grace`, wait until the group is empty (processes that are not our children)."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL)
    if group_members(pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 60.0
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL)


def cmd_cancel(job_dir: str, wait: float | None) -> dict:
    job_dir = existing_job_dir(job_dir)
    state_path = os.path.join(job_dir, STATE_FILE)
    state = read_json(state_path)
    if state is None:
        return {"status": "absent", "job_dir": job_dir}
    if state.get("status") in TERMINAL:
        return describe(job_dir, state)
    if not os.path.exists(os.path.join(job_dir, CANCEL_FILE)):
        write_json(os.path.join(job_dir, CANCEL_FILE), {"requested_at": time.time(), "by": "cancel"})
    spec = read_json(os.path.join(job_dir, SPEC_FILE)) or {}
    grace = float(spec.get("grace_seconds", DEFAULT_GRACE))
    deadline = time.monotonic() + (wait if wait is not None else grace + 90.0)
    while time.monotonic() < deadline:
        now = describe(job_dir, read_json(state_path))
        if now["status"] in TERMINAL:
            return now
        if now["status"] == "unknown":
            break
        time.sleep(POLL_INTERVAL * 2)
    else:
        return describe(job_dir, read_json(state_path))
    # No supervisor: stop what it left behind ourselves, under the start lock so no recovery races us.
    lock = os.open(os.path.join(job_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = read_json(state_path)
        current = describe(job_dir, state)
        if current["status"] != "unknown":
            return current
        docker = spec.get("docker") if state.get("runtime") == "docker" else None
        if docker:
            env = {k: os.environ[k] for k in spec.get("pass_env") or [] if k in os.environ}
            for args in (["stop", "-t", str(int(-(-grace // 1))), docker["name"]], ["rm", "-v", docker["name"]]):
                try:
                    subprocess.run([docker["bin"], *args], stdin=subprocess.DEVNULL, capture_output=True, env=env,
                                   timeout=grace + 60, check=False)
                except (OSError, subprocess.TimeoutExpired):
                    pass
        if is_alive(state.get("pid"), state.get("identity")):
            stop_group_foreign(int(state.get("pgid") or state["pid"]), grace)
        prepare = state.get("prepare") or {}
        if is_alive(prepare.get("pid"), prepare.get("identity")):
            stop_group_foreign(int(prepare["pid"]), grace)
        state = dict(state, status="canceled", ended_at=time.time(), updated_at=time.time(), exit_code=None,
                     error="Stopped without its supervisor (it had ended); the exit code is unknown.",
                     error_code="supervisor_gone")
        write_json(state_path, state)
        return describe(job_dir, state)
    finally:
        os.close(lock)


# -- follow -------------------------------------------------------------------------------------

def utf8_cut(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a UTF-8 character."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        byte = data[n - back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for its lead byte
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return n - back if need > back else n
    return n


def stdout_boundary(fd: int) -> int:
    """The size of the file open as `fd` (readable), less a UTF-8 character still being written at its end."""
    size = os.fstat(fd).st_size
    start = max(0, size - 4)
    tail = os.pread(fd, size - start, start)
    return start + utf8_cut(tail)


class LogOrder:
    """Where the supervisor's notes fall among the job's own output, read from order.log: a note begun when
    stderr.log had `e` bytes and stdout.log `o` (`n e o`) that ended at `end` in stderr.log (`d end`). A
    reader sends stderr from `e` on only once stdout up to `o` is sent, and stdout from `o` on only once
    the note is sent, and stderr stops at the note's end so stdout's waiting lines go next: every note then
    comes where it happened among the job's lines (the job's own stdout and stderr keep the order in which
    they are read, stdout first, as two files cannot say more). Read the log files' sizes
    before `refresh`: a note within those bytes has its mark written already. Without order.log (a
    workspace of an older supervisor) nothing is held back."""

    def __init__(self, job_dir: str):
        self.path = os.path.join(job_dir, ORDER_FILE)
        self.fd: int | None = None
        self.read_to = 0
        self.partial = b""
        self.marks: list[list] = []  # [e, o, end or None, first seen (monotonic)]

    def refresh(self) -> None:
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                return
        while True:
            data = os.pread(self.fd, 1 << 16, self.read_to)
            if not data:
                break
            self.read_to += len(data)
            self.partial += data
        *lines, self.partial = self.partial.split(b"\n")
        now = time.monotonic()
        for line in lines:
            words = line.split()
            try:
                if len(words) == 3 and words[0] == b"n":
                    self.marks.append([int(words[1]), int(words[2]), None, now])
                elif len(words) == 2 and words[0] == b"d" and self.marks and self.marks[-1][2] is None:
                    self.marks[-1][2] = int(words[1])
            except ValueError:
                continue

    def limits(self, stdout_sent: int, stderr_sent: int, final: bool = False) -> tuple[int | None, int | None]:
        """How far stdout and stderr may be sent now, given what was sent (None: to their end)."""
        now = time.monotonic()
        out_limit = err_limit = None
        for e, o, end, seen in self.marks:  # a job has a few notes; those already sent limit nothing
            if end is None and (final or now - seen >= UNFINISHED_NOTE_SECONDS):
                end = e  # its supervisor ended between the two writes: hold nothing back for it
            if e >= stderr_sent and o > stdout_sent:
                err_limit = e if err_limit is None else min(err_limit, e)
            if o >= stdout_sent and (end is None or end > stderr_sent):
                out_limit = o if out_limit is None else min(out_limit, o)
                if end is not None:  # the note, not what follows it: stdout written meanwhile goes first
                    err_limit = end if err_limit is None else min(err_limit, end)
        return out_limit, err_limit


class Follower:
    def __init__(self, job_dir: str, offsets: dict[bytes, int], out):
        self.dir = job_dir
        self.offsets = offsets
        self.out = out
        self.fds: dict[bytes, int] = {}
        self.order = LogOrder(job_dir)

    def frame(self, kind: bytes, offset: int, data: bytes) -> None:
        self.out.write(HEADER.pack(kind, offset, len(data)))
        self.out.write(data)
        self.out.flush()

    def state_frame(self, state: dict, final: bool = False) -> None:
        self.frame(b"s", 0, json.dumps(dict(state, final=final), sort_keys=True).encode("utf-8"))

    def size(self, kind: bytes) -> int:
        fd = self.fds.get(kind)
        if fd is None:
            try:
                fd = os.open(os.path.join(self.dir, STDOUT_FILE if kind == b"o" else STDERR_FILE),
                             os.O_RDONLY | os.O_NOFOLLOW)
            except FileNotFoundError:
                return 0
            self.fds[kind] = fd
        return os.fstat(fd).st_size

    def read_more(self, kind: bytes, final: bool, size: int, limit: int | None = None) -> bool:
        """One frame of `kind` from its offset, up to `size` (read before) or `limit` (LogOrder)."""
        offset = self.offsets[kind]
        end = size if limit is None else min(size, limit)
        if end <= offset:
            return False
        data = os.pread(self.fds[kind], min(CHUNK, end - offset), offset)
        if not final or offset + len(data) < size:
            cut = data[:utf8_cut(data)]
            # Held at a limit inside a character (bytes that are no UTF-8): send them rather than stall.
            data = cut if cut or limit is None or offset + len(data) < end or end >= size else data
        if not data:
            return False
        self.frame(kind, offset, data)
        self.offsets[kind] = offset + len(data)
        return True

    def read_both(self, final: bool) -> bool:
        sizes = {kind: self.size(kind) for kind in (b"o", b"e")}  # before the order: see LogOrder
        self.order.refresh()
        out_limit, err_limit = self.order.limits(self.offsets[b"o"], self.offsets[b"e"], final)
        progressed = self.read_more(b"o", final, sizes[b"o"], out_limit)
        progressed |= self.read_more(b"e", final, sizes[b"e"], err_limit)
        if final and not progressed:  # never end with bytes unsent, whatever order.log says
            progressed = self.read_more(b"o", final, sizes[b"o"]) | self.read_more(b"e", final, sizes[b"e"])
        return progressed

    def run(self) -> None:
        self.out.write(MAGIC)
        self.out.flush()
        last_sent = None
        draining = False  # set once an end state was seen: what is in the files now is all there will be
        last_write = last_check = time.monotonic()
        state = None
        while True:
            progressed = self.read_both(draining)
            now = time.monotonic()
            if progressed:
                last_write = now
                if now - last_check < 1.0:
                    continue
            if draining and not progressed:
                self.state_frame(state, final=True)
                return
            last_check = now
            state = cmd_poll(self.dir)
            summary = (state.get("status"), state.get("pid"), state.get("process_alive"))
            if summary != last_sent:
                self.state_frame(state)
                last_sent = summary
                last_write = now
            if state["status"] in TERMINAL or state["status"] == "absent" or \
                    (state["status"] == "unknown" and not state.get("process_alive")):
                draining = True
                continue
            if not progressed:
                if now - last_write >= KEEPALIVE_SECONDS:
                    self.frame(b"k", 0, b"")
                    last_write = now
                time.sleep(POLL_INTERVAL)


def cmd_follow(job_dir: str, stdout_offset: int, stderr_offset: int) -> int:
    out = sys.stdout.buffer
    try:
        follower = Follower(existing_job_dir(job_dir), {b"o": stdout_offset, b"e": stderr_offset}, out)
    except Refused as exc:
        out.write(MAGIC)
        follower = Follower(job_dir, {}, out)
        follower.state_frame({"status": "absent" if exc.code == "absent" else "refused", "error": exc.message,
                              "code": exc.code, "job_dir": job_dir}, final=True)
        return 0
    try:
        follower.run()
    except BrokenPipeError:  # the worker went away; it resumes from its offsets
        os._exit(0)  # without flushing stdout again (that would raise once more)
    return 0


# -- entry point --------------------------------------------------------------------------------

def main(args: list[str]) -> int:
    if len(args) < 2:
        print("usage: supervisor.py start|poll|release|cancel|follow|run <job_dir> [...] | facts <binary>",
              file=sys.stderr)
        return 2
    command, job_dir = args[0], args[1]
    try:
        if command == "run":
            return cmd_run(job_dir, "--recover" in args[2:])
        if command == "follow":
            return cmd_follow(job_dir, int(args[2]) if len(args) > 2 else 0, int(args[3]) if len(args) > 3 else 0)
        if command == "start":
            result = cmd_start(job_dir, sys.stdin.buffer.read(), program_source(), fork=True)
        elif command == "poll":
            facts = [a.removeprefix("--facts=") for a in args[2:] if a.startswith("--facts=")]
            result = cmd_poll(job_dir, facts[0] if facts else None)
        elif command == "facts":
            result = target_facts(args[1])
        elif command == "cancel":
            result = cmd_cancel(job_dir, float(args[2]) if len(args) > 2 else None)
        elif command == "release":
            result = cmd_release(job_dir)
        else:
            print(f"unknown command {command}", file=sys.stderr)
            return 2
    except Refused as exc:
        print(json.dumps({"error": exc.message, "code": exc.code}))
        return 3
    print(json.dumps(result, sort_keys=True))
    return 0


# ================================================================================================
# The worker's side: how to run the commands above over a connection (worker_agent.ssh.Connection
# or LocalConnection, duck-typed: `run(argv, stdin=, timeout=)` returning exit_code/stdout/stderr, and
# `stream(argv, stdin=, timeout=)` for follow).
# ================================================================================================

_source: bytes | None = None
_program = None


def program_source() -> bytes:
    global _source
    if _source is None:
        with open(os.path.abspath(__file__), "rb") as f:
            _source = f.read()
    return _source


def program():
    """This file as a worker_agent.core.ship.Program: what each command runs by its hash."""
    global _program
    if _program is None:
        from worker_agent.core import ship  # here, not at the top: on a target this file runs alone
        _program = ship.Program(program_source(), PROGRAM_FILE)
    return _program


def workspace(working_dir: str, job_id) -> str:
    return f"{working_dir.rstrip('/')}/.mmt/jobs/{job_id}"


class SupervisorError(Exception):
    """The supervisor refused (`code` from it) or could not be run (`supervisor_failed`)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class StreamBroken(ConnectionError):
    """The follow stream ended before the final state: reconnect and follow again from the offsets."""


class LogChunk:
    __slots__ = ("data", "offset", "stream")

    def __init__(self, stream: str, offset: int, data: bytes):
        self.stream, self.offset, self.data = stream, offset, data

    @property
    def end(self) -> int:
        return self.offset + len(self.data)

    def text(self) -> str:
        return self.data.decode("utf-8", "replace")

    def as_api_chunk(self) -> dict:
        return {"stream": self.stream, "offset": self.offset, "data": self.text()}

    def __repr__(self) -> str:
        return f"LogChunk({self.stream}, {self.offset}, {len(self.data)} bytes)"


class StateFrame:
    __slots__ = ("state",)

    def __init__(self, state: dict):
        self.state = state

    @property
    def final(self) -> bool:
        return bool(self.state.get("final"))


class FrameReader:
    """Parses the follow stream from `read(n)` (bytes; b"" at the end)."""

    def __init__(self, read, *, max_garbage: int = 65536):
        self._read = read
        self._buf = bytearray()
        self._max_garbage = max_garbage

    def _fill(self, need: int) -> bool:
        while len(self._buf) < need:
            chunk = self._read(1 << 20)
            if not chunk:
                return False
            self._buf += chunk
        return True

    def __iter__(self):
        # Skip anything a login shell printed before the program started.
        while True:
            at = self._buf.find(MAGIC)
            if at >= 0:
                del self._buf[:at + len(MAGIC)]
                break
            if len(self._buf) > self._max_garbage or not self._fill(len(self._buf) + 1):
                raise StreamBroken("The follow stream did not start.")
        while True:
            if not self._fill(HEADER.size):
                raise StreamBroken("The follow stream ended before the job's end state.")
            kind, offset, length = HEADER.unpack_from(self._buf)
            if not self._fill(HEADER.size + length):
                raise StreamBroken("The follow stream ended inside a frame.")
            data = bytes(self._buf[HEADER.size:HEADER.size + length])
            del self._buf[:HEADER.size + length]
            if kind == b"o":
                yield LogChunk("stdout", offset, data)
            elif kind == b"e":
                yield LogChunk("stderr", offset, data)
            elif kind == b"s":
                frame = StateFrame(json.loads(data.decode("utf-8")))
                yield frame
                if frame.final:
                    return


class Follow:
    """Iterate for LogChunk and StateFrame items; ends after the final state frame. `close()` any time."""

    def __init__(self, stream):
        self.stream = stream
        self._frames = iter(FrameReader(stream.read))

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._frames)

    def close(self) -> None:
        self.stream.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Remote:
    """The supervisor of one job on one target, seen from the worker."""

    def __init__(self, connection, *, working_dir: str, job_id, python: str = "python3", timeout: float = 60.0):
        self.connection = connection
        self.python = python or "python3"
        self.job_dir = workspace(working_dir, job_id)
        self.timeout = timeout

    def _call(self, command: str, *args, payload: bytes = b"", timeout: float | None = None) -> dict:
        from worker_agent.core import ship  # see program()

        ran = ship.run(self.connection, self.python, program(), [command, self.job_dir, *args], stdin=payload,
                       timeout=timeout or self.timeout)
        try:
            answer = json.loads(ran.stdout.decode("utf-8").strip().splitlines()[-1])
        except (ValueError, IndexError):
            answer = None
        if ran.exit_code == 3 and isinstance(answer, dict) and "code" in answer:
            raise SupervisorError(str(answer["code"]), str(answer.get("error") or ""))
        if ran.exit_code != 0 or not isinstance(answer, dict):
            tail = ran.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
            raise SupervisorError("supervisor_failed", f"The supervisor's {command} exited with {ran.exit_code}"
                                  + (": " + " | ".join(tail) if tail else "."))
        return answer

    def start(self, spec: dict) -> dict:
        """Start the job, or return the state of the same start done before (`started` tells which)."""
        return self._call("start", payload=json.dumps(spec).encode("utf-8"))

    def poll(self, *, facts: str | None = None) -> dict:
        """The job's state; with `facts` (a container binary, or "" for none) a job still to start also
        brings the target's facts (`target_facts`), saving a run of its own."""
        return self._call("poll", *([] if facts is None else [f"--facts={facts}"]))

    def release(self) -> dict:
        """Let a supervisor started with `hold` start the job's process (idempotent)."""
        return self._call("release")

    def cancel(self, wait: float | None = None, *, grace: float = DEFAULT_GRACE) -> dict:
        """Stop the job and wait until it has ended (SIGTERM, SIGKILL after the grace)."""
        budget = wait if wait is not None else grace + 90.0
        args = [] if wait is None else [wait]
        return self._call("cancel", *args, timeout=budget + 30.0)

    def follow(self, stdout_offset: int = 0, stderr_offset: int = 0, *, timeout: float = 3 * KEEPALIVE_SECONDS) -> Follow:
        """Both logs from the given byte offsets until the job has ended; resume with the offsets of the
        last chunk received (`chunk.end`) after StreamBroken or a reconnect."""
        from worker_agent.core import ship  # see program()

        args = ["follow", self.job_dir, int(stdout_offset), int(stderr_offset)]
        return Follow(ship.stream(self.connection, self.python, program(), args, timeout=timeout))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
