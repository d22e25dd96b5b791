"""Fixtures of the job supervisor and runtime tests. They need no database: the supervisor runs as
`python3 supervisor.py …` in a temporary working directory (and over a real sshd in one module).

Stand-ins: no Docker daemon, Apptainer or Singularity exists on these machines, so `fake_docker` is a
small script with the docker CLI's subcommands the supervisor uses (its "containers" are local
processes in their own session, the way a container is not in the client's process group), and
`fake_container_bin` prints an `exec --help` with or without the flags Mado needs."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.peers.sshd import Sshd, sshd, start_sshd  # noqa: F401  (sshd: the shared fixture)
from tests.support import wait_for  # noqa: F401  (re-exported to the tests here)
from worker_agent import supervisor

SUPERVISOR = Path(supervisor.__file__)
PYTHON = "/usr/bin/python3"




class Local:
    """Runs `python3 supervisor.py <cmd> <job_dir> …` on this machine, as the worker would on a target."""

    def __init__(self, working_dir: Path, env: dict | None = None):
        self.working_dir = working_dir
        self.env = env

    def job_dir(self, job_id) -> str:
        return supervisor.workspace(str(self.working_dir), job_id)

    def call(self, command: str, job_id, *args, stdin: bytes = b"", check: bool = True) -> dict:
        ran = subprocess.run([PYTHON, str(SUPERVISOR), command, self.job_dir(job_id), *map(str, args)],
                             input=stdin, capture_output=True, timeout=120, env=self.env, check=False)
        answer = json.loads(ran.stdout.decode().strip().splitlines()[-1]) if ran.stdout.strip() else None
        if check:
            assert ran.returncode == 0, (ran.returncode, ran.stdout, ran.stderr)
        return {"rc": ran.returncode, **(answer or {})}

    def start(self, spec: dict, **kw) -> dict:
        return self.call("start", spec["job_id"], stdin=json.dumps(spec).encode(), **kw)

    def poll(self, job_id) -> dict:
        return self.call("poll", job_id)

    def cancel(self, job_id, *args) -> dict:
        return self.call("cancel", job_id, *args)

    def wait_status(self, job_id, *statuses, timeout: float = 20.0) -> dict:
        got = {}

        def done():
            got.update(self.poll(job_id))
            return got["status"] in statuses

        wait_for(done, timeout, what=f"status {statuses} (last: {got.get('status')})")
        return got

    def read(self, job_id, name: str) -> str:
        try:
            return Path(self.job_dir(job_id), name).read_text()
        except FileNotFoundError:
            return ""


def stop_everything_under(working_dir: Path) -> None:
    """Kill the supervisors and job process groups a test left behind (a failed assertion before its
    cancel), by the pids and identities in their state files."""
    for state_file in working_dir.glob(".mmt/jobs/*/state.json"):
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            continue
        sup = state.get("supervisor") or {}
        for pid, ident, group in ((sup.get("pid"), sup.get("identity"), False),
                                  (state.get("pid"), state.get("identity"), True),
                                  ((state.get("prepare") or {}).get("pid"), (state.get("prepare") or {}).get("identity"),
                                   True)):
            if pid in (os.getpid(), os.getppid()):  # a test that recorded itself as a stand-in supervisor
                continue
            if supervisor.is_alive(pid, ident):
                try:
                    os.killpg(pid, signal.SIGKILL) if group else os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture
def working_dir(tmp_path) -> Path:
    path = tmp_path / "work dir"  # a space on purpose: paths are never split by a shell
    path.mkdir()
    yield path
    stop_everything_under(path)


@pytest.fixture
def local(working_dir) -> Local:
    return Local(working_dir)


def process_spec(working_dir: Path, job_id="7", script: str = "print('hello')", **overrides) -> dict:
    """A spec of the bare `process` runtime: python3 -c <script> on the host."""
    spec = {
        "format": 1, "job_id": str(job_id), "lease_id": "lease-" + str(job_id), "working_dir": str(working_dir),
        "runtime": "process", "argv": [PYTHON, "-c", script], "env": {"MMT_JOB_ID": str(job_id)},
        "pass_env": ["PATH", "HOME", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "TMPDIR"],
        "cwd": str(working_dir), "dirs": ["outputs"], "files": [], "secrets": [], "grace_seconds": 10,
        "walltime_seconds": None,
    }
    spec.update(overrides)
    return spec


def live_processes_with(needle: bytes) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if needle in f.read():
                        st = supervisor.proc_stat(name)
                        if st and st[0] != "Z":
                            found.append(int(name))
            except OSError:
                continue
    return found


def kill_quietly(pid: int, sig=signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


FAKE_DOCKER = r'''#!/usr/bin/python3
"""Stand-in for the docker CLI: no Docker daemon runs on these machines. Containers are local
processes in their own session; their state lives next to this script. Every call is recorded in
calls.jsonl. Only what the supervisor uses: container create, start -a, attach, container inspect,
stop -t, kill, rm -v."""
import json, os, signal, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
STATE = os.path.join(HERE, "containers")
os.makedirs(STATE, exist_ok=True)


def path(name):
    return os.path.join(STATE, name + ".json")


def load(name):
    try:
        with open(path(name)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def save(name, data):
    tmp = path(name) + ".tmp%d" % os.getpid()
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path(name))


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_exit(name):
    while True:
        c = load(name)
        if c is None or c["status"] != "running":
            return c
        if not alive(c["pid"]):
            c["status"], c["exit_code"] = "exited", c.get("exit_code") if c.get("exit_code") is not None else 137
            save(name, c)
            return c
        time.sleep(0.05)


args = sys.argv[1:]
if args[0] != "_container":  # the stand-in's own "container process" is not a CLI call
    with open(os.path.join(HERE, "calls.jsonl"), "a") as f:
        f.write(json.dumps(args) + "\n")
if args[:2] == ["container", "create"]:
    opts, i, flags = {}, 2, ("--init",)
    while args[i].startswith("--"):
        if args[i] in flags:
            i += 1
            continue
        opts.setdefault(args[i], []).append(args[i + 1])
        i += 2
    name = opts["--name"][0]
    if load(name) is not None:
        sys.exit("Error response from daemon: Conflict. The container name is already in use")
    if args[i] == "missing:image":
        sys.exit("Error response from daemon: No such image: missing:image")
    save(name, {"status": "created", "options": opts, "image": args[i], "cmd": args[i + 1:], "starts": 0})
    print("0123456789ab")
elif args[0] == "start" and args[1] == "-a":
    name = args[2]
    c = load(name)
    c["starts"] += 1
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "_container", name], start_new_session=True)
    c.update(status="running", pid=proc.pid)
    save(name, c)
    proc.wait()
    sys.exit(wait_exit(name)["exit_code"])
elif args[0] == "_container":
    name = args[1]
    c = load(name)
    env = {"PATH": "/usr/bin:/bin"}
    with open(c["options"]["--env-file"][0]) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("=")
            env[k] = v
    child = subprocess.Popen(c["cmd"], env=env)
    signal.signal(signal.SIGTERM, lambda s, f: child.send_signal(signal.SIGTERM))
    rc = child.wait()
    c = load(name)
    c.update(status="exited", exit_code=rc if rc >= 0 else 128 - rc)
    save(name, c)
elif args[0] == "attach":
    c = wait_exit(args[-1])
    sys.exit(c["exit_code"] if c else 1)
elif args[:2] == ["container", "inspect"]:
    c = load(args[-1])
    if c is None:
        sys.exit("Error: No such container: " + args[-1])
    if c["status"] == "running" and not alive(c["pid"]):
        c = wait_exit(args[-1])
    print(c["status"], c.get("exit_code") or 0)
elif args[0] in ("stop", "kill"):
    name = args[-1]
    c = load(name)
    if c is None:
        sys.exit("Error: No such container: " + name)
    if c["status"] == "running":
        grace = float(args[2]) if args[0] == "stop" else 0
        if grace:
            os.kill(c["pid"], signal.SIGTERM)
            deadline = time.time() + grace
            while alive(c["pid"]) and time.time() < deadline:
                time.sleep(0.05)
        if alive(c["pid"]):
            os.killpg(c["pid"], signal.SIGKILL)
            c = load(name)
            c.update(status="exited", exit_code=137)
            save(name, c)
        wait_exit(name)
    print(name)
elif args[0] == "rm":
    c = load(args[-1])
    if c is None:
        sys.exit("Error: No such container: " + args[-1])
    if c["status"] == "running":
        sys.exit("Error: cannot remove a running container")
    os.remove(path(args[-1]))
    print(args[-1])
else:
    sys.exit("fake docker: unsupported " + " ".join(args))
'''


class FakeDocker:
    def __init__(self, bindir: Path):
        self.bindir = bindir
        self.path = bindir / "docker"
        self.path.write_text(FAKE_DOCKER)
        self.path.chmod(0o755)

    def calls(self) -> list[list[str]]:
        try:
            return [json.loads(line) for line in (self.bindir / "calls.jsonl").read_text().splitlines()]
        except FileNotFoundError:
            return []

    def verbs(self) -> list[str]:
        return [" ".join(c[:2]) if c[0] == "container" else c[0] for c in self.calls()]

    def container(self, name: str) -> dict | None:
        try:
            return json.loads((self.bindir / "containers" / f"{name}.json").read_text())
        except FileNotFoundError:
            return None


@pytest.fixture
def fake_docker(tmp_path) -> FakeDocker:
    bindir = tmp_path / "fake-docker"
    bindir.mkdir()
    docker = FakeDocker(bindir)
    yield docker
    for path in (bindir / "containers").glob("*.json") if (bindir / "containers").exists() else []:
        data = json.loads(path.read_text())
        if data.get("status") == "running":
            try:
                os.killpg(data["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


APPTAINER_HELP = """Run a command within a container

Usage:
  {bin} exec [exec options...] <container> <command>

Options:
  -B, --bind strings       a user-bind path specification
      --cleanenv           clean environment before running container
  -c, --contain            use minimal /dev and empty other directories
  -C, --containall         contain not only file systems, but also PID, IPC, and environment
  -e, --env stringToString pass environment variable to contained process
      --no-eval            do not shell evaluate env vars or OCI container CMD/ENTRYPOINT/ARGS
      --no-home            do NOT mount users home directory if /home is not the current working directory
      --no-mount strings   disable one or more 'mount xxx' options set in {bin}.conf
      --nv                 enable Nvidia support
      --nvccli             use nvidia-container-cli for GPU setup (experimental)
      --pwd string         initial working directory for payload process inside the container
"""


def fake_container_bin(bindir: Path, name: str, *, drop: tuple[str, ...] = ()) -> Path:
    """A stand-in `apptainer`/`singularity` whose `exec --help` prints the real tool's option list,
    less the lines of the flags in `drop` (an old version). No real Apptainer runs here."""
    text = APPTAINER_HELP.format(bin=name)
    lines = [line for line in text.splitlines() if not any(_names_flag(line, flag) for flag in drop)]
    bindir.mkdir(exist_ok=True)
    script = bindir / name
    script.write_text("#!/bin/sh\nif [ \"$1 $2\" = \"exec --help\" ]; then\ncat <<'EOF'\n" + "\n".join(lines)
                      + "\nEOF\nexit 0\nfi\necho \"stand-in: $*\" >&2\nexit 1\n")
    script.chmod(0o755)
    return script


def _names_flag(line: str, flag: str) -> bool:
    words = line.replace(",", " ").split()
    return flag in words




@pytest.fixture
def ssh_working_dir(sshd):
    """A working directory in the login user's home, owned by that user, removed afterwards."""
    import shutil
    path = sshd.home / f"mmt-wd-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    st = sshd.home.stat()
    os.chown(path, st.st_uid, st.st_gid)
    yield path
    stop_everything_under(path)
    shutil.rmtree(path, ignore_errors=True)
