"""The runner: what a site's job shell starts on the compute node for one Job (docs/sites-protocol.md,
"Runner endpoints"; REFERENCE §5).

    mado-tracking runner SPEC_DIR
    python SPEC_DIR/lib/worker_agent/site/runner.py SPEC_DIR      (what SPEC_DIR/mmt-runner execs)

It reads `SPEC_DIR/job.json` (`{format: 1, api_url, token, job}`, written by the launcher or by
`mado-tracking submit`) and talks to the server with the Job's job token only. Standard library only,
plus the modules the launcher bundles into `SPEC_DIR/lib/` (supervisor, runtimes, jobenv, results and
worker_agent.core: worker_agent.site.spec.BUNDLE), so a compute node needs nothing but a Python >= 3.11:
the Job runs with the same supervisor, runtimes, environment and job-end logic as on a worker.

1. `start` with a fresh runner id (the Job becomes `waiting_resources`); a second runner of the same Job
   is refused (409 `runner_conflict`, exit 3).
2. The workspace `<working_dir>/.mmt/jobs/<jobId>/` as on a worker: the source (an uploaded archive is
   downloaded with the job token; a git source is cloned here), `runtimes.build_spec`, then the
   supervisor started here (`supervisor.cmd_start`; it runs the Job in its own session and outlives
   nothing the scheduler does not kill).
3. One loop: new bytes of stdout.log/stderr.log every `log_interval_seconds` (1 s; chunks of at most
   1 MiB cut at UTF-8 character boundaries, sent in order and resent from the same offsets after a
   failure), a heartbeat every `heartbeat_seconds` (5 s), and one with `status: running` the moment the
   supervisor runs the code (the Job becomes `running`). `cancel_requested` in a heartbeat's answer stops the code
   (SIGTERM, SIGKILL after the grace) and the Job ends `canceled`. SIGTERM or SIGINT to the runner is
   the scheduler's warning before the time limit (Slurm `--signal=B:TERM@120`, the Grid Engine timer,
   `timeout` on Docker hosts): the code is stopped the same way and the Job ends failed `timed_out`.
4. The end as on a worker: exit code 0 → result.json validated here with `worker_agent.results`, the
   outputs declared, the artifacts the answer asks for uploaded (parts of 32 MiB with Content-Range
   from 64 MiB on) → `finished`; otherwise `failed` with the end reason, or `canceled`; then `finish`.

Network errors, timeouts, 429 and 5xx are retried with backoff (the Job keeps running meanwhile).
401/403, 404 and 409 `runner_conflict`/`job_ended` mean the server no longer lets this runner report the
Job: the code is stopped and the runner exits 3. The token is never printed: every text that leaves
the runner has it masked.

Cluster jobs (docs/cluster-jobs.md, "Sites"): the job shell starts one runner per node (the Slurm
template's `srun --ntasks-per-node=1`), all with the same spec directory. Each runner is one replica:
its index comes from `MMT_REPLICA_INDEX` (an owner's job shell may set it), else `SLURM_PROCID`, else
`SLURM_NODEID`; index 0 is main1, index i is sub<i>. The nodes come from `MMT_CLUSTER_NODES`
(comma-separated) or `SLURM_JOB_NODELIST` (`scontrol show hostnames`), replica i on node i; every
replica gets the cluster variables of `jobenv.cluster_environment` with `MASTER_ADDR` the first node's
address (its NodeAddr, resolved) and `MASTER_PORT` the batch script's `MMT_MASTER_PORT` (picked free
on the first node with `runner.py --free-port`), else 40000 + the job id mod 20000. Each replica has
its own workspace `<working_dir>/.mmt/jobs/<jobId>-<replica>/`, starts with `replica` and sends its
own logs; only main1 sends outputs. The server ends the Job when main1 ends or a sub fails; the other
runners then meet 401 and stop their code. A sub that is stopped that way exits 0. A sub ships all its
logs before its own `finish`; main1, once its code ended and its logs and outputs are sent, heartbeats
every second until the answer's `replicas_running` is empty or the start answer's
`replica_wait_seconds` (10 s) pass, and only then finishes the Job, so the subs' last lines arrive
before its finish revokes the token.

Every replica's `inputs/` has the launchers' hostfiles (`MMT_CLUSTER_HOSTFILE`, `MMT_CLUSTER_NODEFILE`,
jobenv.hostfile_text and nodefile_text). Nodes come from PBS's PBS_NODEFILE or Grid Engine's
PE_HOSTFILE too, for an owner's job shell that sets MMT_REPLICA_INDEX. SSH between the replicas
(docs/cluster-jobs.md, "SSH between replicas", "On sites"), python runtime, where the nodes allow it:
the first runner makes the Job's Ed25519 key (worker_agent/replica_ssh.py; `ssh-keygen` where the
Python has no `cryptography`) and links it into the spec directory, which every runner shares; each
runner authorizes it in the account's ~/.ssh/authorized_keys (worker_agent/authorized_keys.py, its own
line `mado-job-<id>@<replica>.<scheduler job id>` with expiry-time; expired lines of ours go at the
same time) and writes its `ssh/` (config with `Host main1 sub1 …` on the nodes' addresses, the nodes'
host keys found in ~/.ssh/known_hosts or /etc/ssh/ssh_known_hosts, the key, the `ssh` wrapper first
on PATH). A node whose host key is not known there, or that has no sshd answering (port 22, or the
site variable NODE_SSH_PORT), turns it off for this replica: the scheduler's log says why and the Job
runs on. The runner removes its line when the code has ended, whatever the end.

Exit codes: 0 finished, 1 failed/canceled/timed out, 2 configuration error (bad spec directory,
unreachable API), 3 the API refused the runner."""
from __future__ import annotations

import http.client
import json
import math
import os
import pwd
import re
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
import uuid

if __package__ in (None, ""):  # run as a file: python SPEC_DIR/lib/worker_agent/site/runner.py SPEC_DIR
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from worker_agent import __version__, authorized_keys, jobenv, replica_ssh, results, runtimes, supervisor
from worker_agent.core import lifecycle
from worker_agent.core import outputs as core_outputs
from worker_agent.core import source as core_source
from worker_agent.core.api import ApiError, Backoff, Unavailable, error_details, retryable
from worker_agent.core.tokens import mask_tokens

SPEC_FORMAT = 1
SPEC_ROOT = ".mmt-submissions"
STREAMS = ("stdout", "stderr")
LOG_CHUNK = 1 << 20  # the server takes chunks of at most 1 MiB
LOG_BATCH = 4 << 20  # per POST
LOG_TICK_BUDGET = 2.0  # seconds of log sending per loop turn before heartbeats get a turn
POLL_SECONDS = 0.2
CONNECT_TIMEOUT = 30.0
START_PATIENCE = 600.0  # seconds of an unreachable API before the runner gives up starting
RETRY_CAP = 30.0
FINISH_ROUNDS = 3  # outputs sent again when the server still misses artifacts at finish
SCHEDULER_ID_VARIABLES = ("SLURM_JOB_ID", "PBS_JOBID", "JOB_ID", "PJM_JOBID")
# Job ends that are final for the loop: the supervisor has stopped writing the logs.
ENDED = supervisor.TERMINAL + ("absent", "refused")

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_REFUSED = 0, 1, 2, 3
REPLICA_INDEX_VARIABLES = ("MMT_REPLICA_INDEX", "SLURM_PROCID", "SLURM_NODEID")
MASTER_PORT_BASE, MASTER_PORT_SPAN = 40000, 20000
_label = ""  # the replica a cluster job's runner reports, in every note


# -- errors ---------------------------------------------------------------------------------------

class ConfigError(Exception):
    """The spec directory (or the site's settings it carries) cannot work: exit 2."""


class Refused(ApiError):
    """The server no longer lets this runner report the Job (401, 403, 404, 409 runner_conflict/job_ended)."""


class StartFailed(Exception):
    """The Job cannot start here; the message says what to fix and becomes the Job's error."""


def mask(text: str, token: str = "") -> str:
    return mask_tokens(text, token)


REFUSING_409 = ("runner_conflict", "job_ended", "runner_not_started", "not_a_site_job")


def is_refusal(status: int | None, code: str | None) -> bool:
    return status in (401, 403, 404) or (status == 409 and code in REFUSING_409)


# -- the spec directory -------------------------------------------------------------------------

class Spec:
    """`SPEC_DIR/job.json`, checked."""

    def __init__(self, spec_dir: str, api_url: str, token: str, job: dict):
        self.dir = spec_dir
        self.api_url = api_url
        self.token = token
        self.job = job
        self.job_id = int(job["id"])


def load_spec(spec_dir: str) -> Spec:
    if not spec_dir:
        raise ConfigError("Give the spec directory: mado-tracking runner SPEC_DIR.")
    spec_dir = os.path.abspath(spec_dir)
    try:
        st = os.lstat(spec_dir)
    except OSError as exc:
        raise ConfigError(f"The spec directory {spec_dir} cannot be read ({exc.strerror}): the job shell must pass "
                          "the directory the launcher or `mado-tracking submit` wrote (MMT_SPEC_DIR).") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{spec_dir} is not a directory (or is a symbolic link): pass the spec directory itself.")
    path = os.path.join(spec_dir, "job.json")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            if os.fstat(f.fileno()).st_mode & 0o077:
                note(f"{path} is readable by others; it holds the Job's token and should be mode 600.")
            raw = f.read(64 << 20)
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read ({exc.strerror}): the spec directory is incomplete; submit the "
                          "Job again.") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ConfigError(f"{path} is not valid JSON: the spec directory is damaged; submit the Job again.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold one JSON object {{format, api_url, token, job}}.")
    if data.get("format") != SPEC_FORMAT:
        raise ConfigError(f"{path} has format {data.get('format')!r}; this runner reads format {SPEC_FORMAT}. Use "
                          "the runner bundled in the same spec directory (SPEC_DIR/mmt-runner).")
    api_url = data.get("api_url")
    if not isinstance(api_url, str) or not re.match(r"^https?://[^/\s]+", api_url):
        raise ConfigError(f"api_url in {path} must be the server's http(s) URL as compute nodes reach it (the "
                          "site's runner API URL).")
    token = data.get("token")
    if not isinstance(token, str) or not token.strip() or any(c.isspace() for c in token):
        raise ConfigError(f"token in {path} is missing or malformed: submit the Job again.")
    job = data.get("job")
    if not isinstance(job, dict) or isinstance(job.get("id"), bool) or not str(job.get("id", "")).isdigit():
        raise ConfigError(f"job in {path} must be the Job object with its numeric id: submit the Job again.")
    return Spec(spec_dir, api_url.rstrip("/"), token, job)


# -- output of the runner itself -----------------------------------------------------------------

def note(text: str, _level: int = 0) -> None:
    """One line on stderr (the scheduler's log of the batch job); `_level` is core.lifecycle's."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    try:
        print(f"[mado-runner {stamp}{_label}] {mask(text)}", file=sys.stderr, flush=True)
    except (OSError, ValueError, RuntimeError):  # RuntimeError: a signal's note while a note was written
        pass


# -- HTTP ---------------------------------------------------------------------------------------

class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise ApiError(f"The server redirected {req.full_url.split('?')[0]} to {newurl.split('?')[0]}: set the "
                       "site's runner API URL to the final address (https:// rather than http://, say).",
                       status=code, code="redirect")


class _Body:
    """`length` bytes of an open file from `offset`, read as urllib sends it (so a large artifact is
    never held in memory)."""

    def __init__(self, path: str, offset: int, length: int):
        self._f = open(path, "rb")  # noqa: SIM115 -- closed by close()
        self._f.seek(offset)
        self._left = length

    def read(self, n: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        n = self._left if n is None or n < 0 else min(n, self._left)
        data = self._f.read(n)
        if not data:
            raise OSError("The file became shorter while it was uploaded.")
        self._left -= len(data)
        return data

    def close(self) -> None:
        self._f.close()


class Api:
    """The runner endpoints of one Job, with the job token and this runner's id."""

    def __init__(self, api_url: str, token: str, job_id: int, runner_id: str):
        self.base = f"{api_url}/api/runner/jobs/{int(job_id)}"
        self.api_url = api_url
        self._token = token
        self.runner_id = runner_id
        self._opener = urllib.request.build_opener(_NoRedirect())

    def mask(self, text: str) -> str:
        return mask(text, self._token)

    def once(self, method: str, path: str, *, body: dict | None = None, data=None, headers: dict | None = None,
             out=None, timeout: float = CONNECT_TIMEOUT) -> dict:
        """One attempt. JSON `body` (runner_id added) or raw `data`; `out`: a binary file for the answer."""
        url = f"{self.base}/{path}"
        all_headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json",
                       "User-Agent": f"mado-tracking-runner/{__version__}"}
        if body is not None:
            data = json.dumps({"runner_id": self.runner_id, **body}).encode("utf-8")
            all_headers["Content-Type"] = "application/json"
        else:
            url += ("&" if "?" in url else "?") + urllib.parse.urlencode({"runner_id": self.runner_id})
        all_headers.update(headers or {})
        request = urllib.request.Request(url, data=data, headers=all_headers, method=method)
        where = f"{method} {self.base.split('/api/', 1)[-1]}/{path.split('?')[0]}"
        try:
            with self._opener.open(request, timeout=timeout) as response:
                if out is not None:
                    size = 0
                    for block in iter(lambda: response.read(1 << 20), b""):
                        out.write(block)
                        size += len(block)
                    return {"size": size}
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read() if exc.fp is not None else b""
            exc.close()
            raise self._error(exc.code, raw, where) from None
        except (OSError, EOFError, ValueError, http.client.HTTPException) as exc:  # URLError, timeouts, resets
            reason = getattr(exc, "reason", None) or exc
            raise Unavailable(self.mask(f"Cannot reach the server at {self.api_url} ({where}: {reason}).")) from None
        try:
            answer = json.loads(raw.decode("utf-8")) if raw else {}
        except (UnicodeDecodeError, ValueError):
            raise ApiError(f"The server answered {where} with something other than JSON: check that the site's "
                           f"runner API URL ({self.api_url}) points at the Mado server.") from None
        return answer if isinstance(answer, dict) else {}

    def _error(self, status: int, raw: bytes, where: str) -> ApiError:
        try:
            body = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            body = None
        body, code, text = error_details(body, self.mask)
        text = text or f"The server answered {status} to {where}."
        if retryable(status):
            return Unavailable(f"The server answered {status} to {where}.", status=status, code=code, body=body)
        kind = Refused if is_refusal(status, code) else ApiError
        return kind(text, status=status, code=code, body=body)

    def call(self, method: str, path: str, *, body: dict | None = None, patience: float | None = None,
             what: str = "", give_up=None, **kwargs) -> dict:
        """`once` until the server answers: network trouble, 429 and 5xx are retried with backoff, for
        at most `patience` seconds (None: as long as it takes, as the Job's end must be reported) or
        until `give_up()` says so."""
        started = time.monotonic()
        failures = 0
        while True:
            try:
                return self.once(method, path, body=body, **kwargs)
            except Unavailable as exc:
                failures += 1
                if (patience is not None and time.monotonic() - started >= patience) or (give_up and give_up()):
                    raise
                delay = Backoff(cap=RETRY_CAP).delay(failures)
                if failures == 1 or failures % 10 == 0:
                    note(f"{what or path} not delivered yet ({exc}); trying again in {delay:.0f} s.")
                time.sleep(delay)


# -- facts, source, outputs (standard library, here on the compute node) -------------------------

def local_facts(runtime: str) -> runtimes.TargetFacts:
    """What runtimes.build_spec needs to know about this machine."""
    help_text = None
    if runtime in runtimes.CONTAINER_RUNTIMES:
        try:
            ran = subprocess.run([runtime, "exec", "--help"], capture_output=True, timeout=60,
                                 stdin=subprocess.DEVNULL, check=False)
            help_text = (ran.stdout + ran.stderr).decode("utf-8", "replace")
        except (OSError, subprocess.TimeoutExpired):
            help_text = None
    return runtimes.TargetFacts(uid=os.getuid(), gid=os.getgid(), container_help=help_text)


def ensure_workspace(working_dir: str, job_id: int) -> str:
    if not os.path.isdir(working_dir):
        raise StartFailed(f"The working directory {working_dir} does not exist on this compute node: create it, or "
                          "correct the site's working directory.")
    try:
        job_dir = supervisor.checked_dirs(working_dir, [".mmt", "jobs", str(job_id)], create=True)
        os.chmod(job_dir, 0o700)
    except supervisor.Refused as exc:
        raise StartFailed(exc.message) from None
    return job_dir


def unpack_archive(archive_path: str, job_dir: str) -> int:
    """Regular files and directories of a .tar.gz into `<job_dir>/source` (it appears only when complete)."""
    try:
        with open(archive_path, "rb") as f:
            return core_source.unpack_source(f, job_dir)
    except core_source.SourceError as exc:
        raise StartFailed(str(exc)) from None
    except (OSError, tarfile.TarError, EOFError) as exc:
        raise StartFailed(f"The source archive could not be unpacked here: {exc}.") from None


def clone_source(source: dict, job_dir: str) -> None:
    try:
        core_source.clone_source(str(source.get("url") or ""), str(source.get("ref") or "HEAD"), job_dir,
                                 "on this compute node", 3600)
    except core_source.SourceError as exc:
        raise StartFailed(mask(str(exc))) from None


def list_outputs(outputs_dir: str, max_files: int) -> dict:
    """The outputs directory as the worker reports it (core.outputs.read_outputs)."""
    try:
        listing = core_outputs.read_outputs(outputs_dir, max_files)
    except ValueError as exc:
        raise StartFailed(str(exc)) from None
    if listing["too_many"]:
        raise StartFailed(f"The outputs directory holds more than {max_files} files; keep fewer (pack them "
                          "into an archive).")
    return listing


# -- cluster jobs: which replica this runner is, and where the others run -----------------------

class Replica:
    """One replica of a cluster job as this runner sees it: its index and name, every node's address
    (replica i on node i), and the cluster variables for its code."""

    def __init__(self, index: int, size: int, mode: str, addresses: list[str], master_port: int):
        self.index, self.size = index, size
        self.name = replica_name(index)
        self.replicas = [{"index": i, "name": replica_name(i), "role": "main" if i == 0 else "sub"}
                         for i in range(size)]
        self.hosts = {replica_name(i): addresses[i] for i in range(size)}
        self.env = jobenv.cluster_environment(replica=self.replicas[index], replicas=self.replicas, mode=mode,
                                              main_addr=addresses[0], master_port=master_port)

def replica_name(index: int) -> str:
    return "main1" if index == 0 else f"sub{index}"


def replica_index(size: int) -> int:
    """This runner's replica, from the first of REPLICA_INDEX_VARIABLES that is set."""
    for variable in REPLICA_INDEX_VARIABLES:
        raw = os.environ.get(variable, "").strip()
        if raw:
            if not raw.isdigit() or int(raw) >= size:
                raise ConfigError(f"{variable}={raw} is not a replica of this {size}-replica cluster job (0 … "
                                  f"{size - 1}): the job shell must start one runner per replica.")
            return int(raw)
    raise ConfigError("This is a cluster job, but nothing says which replica this runner is: start it with srun "
                      "(SLURM_PROCID), or set MMT_REPLICA_INDEX to 0 … N-1 for each runner.")


def cluster_nodes() -> list[str]:
    """The nodes of the allocation in order: MMT_CLUSTER_NODES, else Slurm's SLURM_JOB_NODELIST, else
    the first column of PBS's PBS_NODEFILE or Grid Engine's PE_HOSTFILE (each node once, first seen first)."""
    given = os.environ.get("MMT_CLUSTER_NODES", "").strip()
    if given:
        return [n.strip() for n in given.split(",") if n.strip()]
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST") or ""
    if not nodelist:
        for variable in ("PBS_NODEFILE", "PE_HOSTFILE"):
            if os.environ.get(variable):
                return node_file(variable, os.environ[variable])
        raise StartFailed("The nodes of this cluster job are unknown: no SLURM_JOB_NODELIST, PBS_NODEFILE or "
                          "PE_HOSTFILE (or MMT_CLUSTER_NODES) in the runner's environment.")
    out = _scontrol("show", "hostnames", nodelist)
    nodes = [line.strip() for line in (out or "").splitlines() if line.strip()]
    if not nodes:
        raise StartFailed(f"scontrol show hostnames {nodelist} named no node; is scontrol on this node's PATH?")
    return nodes


def node_file(variable: str, path: str) -> list[str]:
    """The nodes a scheduler's node file names (one a line, or `host slots queue …`), each once."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            words = [line.split()[0] for line in f if line.strip()]
    except OSError as exc:
        raise StartFailed(f"{variable}={path} cannot be read ({exc.strerror}): the nodes of this cluster job are "
                          "unknown.") from None
    nodes = list(dict.fromkeys(words))
    if not nodes:
        raise StartFailed(f"{variable}={path} names no node.")
    return nodes


def _scontrol(*argv: str) -> str | None:
    try:
        ran = subprocess.run(["scontrol", *argv], capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return ran.stdout if ran.returncode == 0 else None


def node_addr(node: str) -> str:
    """Slurm's NodeAddr of `node` (the node name unless the site set one, or outside Slurm)."""
    shown = _scontrol("show", "node", "--oneliner", node) if "SLURM_JOB_ID" in os.environ else None
    match = re.search(r"\bNodeAddr=(\S+)", shown or "")
    return match.group(1) if match and match.group(1) not in ("(null)", "") else node


def node_address(node: str, address: str | None = None) -> str:
    """How other nodes reach `node`: its NodeAddr (`node_addr`, or `address` when already known),
    resolved to an IPv4 address; the name itself when it does not resolve here."""
    address = address or node_addr(node)
    try:
        return socket.gethostbyname(address)
    except (OSError, UnicodeError):
        return address


def master_port(job_id: int) -> int:
    """MASTER_PORT: the batch script's pick (MMT_MASTER_PORT), else one derived from the scheduler's
    job id (the Job's id without one), so every replica derives the same."""
    raw = os.environ.get("MMT_MASTER_PORT", "").strip()
    if raw.isdigit() and 1024 <= int(raw) <= 65535:
        return int(raw)
    scheduler_id = os.environ.get("SLURM_JOB_ID", "").strip()
    seed = int(scheduler_id) if scheduler_id.isdigit() else job_id
    return MASTER_PORT_BASE + seed % MASTER_PORT_SPAN


def free_port() -> int:
    """A TCP port free on this node now (the batch script passes it to every replica as MMT_MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def cluster_size_of(job: dict) -> int:
    try:
        size = int(job.get("cluster_size") or 1)
    except (TypeError, ValueError):
        raise ConfigError("cluster_size in job.json is not a number: submit the Job again.") from None
    if not 1 <= size <= 64:
        raise ConfigError(f"cluster_size {size} in job.json is out of range (1 … 64): submit the Job again.")
    return size


# -- cluster jobs: ssh between the replicas (docs/cluster-jobs.md, "SSH between replicas", "On sites") --

SSH_KEY_FILE = "replica-ssh.json"  # in the spec directory, which every runner of the Job reads
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
SSHD_PROBE_SECONDS = 5.0
OFF_VALUES = ("0", "no", "off", "false")


class NoReplicaSsh(replica_ssh.ReplicaSshError):
    """Why this replica gets no ssh to the others; the Job runs on without it."""


def site_setting(name: str) -> str:
    """A setting of the runner: MMT_<NAME> in its environment, else the site variable NAME (MMT_VAR_<NAME>,
    which the job shell exports to the batch job)."""
    return (os.environ.get(f"MMT_{name}") or os.environ.get(f"MMT_VAR_{name}") or "").strip()


def node_ssh_port() -> int:
    """The port of the nodes' sshd: the site variable NODE_SSH_PORT, else 22."""
    raw = site_setting("NODE_SSH_PORT")
    if not raw:
        return 22
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise NoReplicaSsh(f"NODE_SSH_PORT={raw} is not a TCP port; set the site variable to the nodes' sshd port")
    return int(raw)


def ssh_tag(job_id: int, replica: str, scheduler_id: str | None) -> str:
    """This runner's authorized_keys tag, `mado-job-<id>@<replica>.<scheduler job id>`: one line per
    replica, so a replica that ends removes only its own (a shared home keeps the others' lines), and
    two servers' Jobs of the same id under one account never touch each other's."""
    who = re.sub(r"[^A-Za-z0-9._-]", "-", f"{replica}.{scheduler_id or 'site'}")[:64]
    return authorized_keys.job_tag(job_id, who)


def known_host_keys(labels: list[str]) -> list[tuple[str, str]]:
    """(type, base64) of the host keys the account already trusts for any of `labels` (`host` or
    `[host]:port`): its ~/.ssh/known_hosts and the system's /etc/ssh/ssh_known_hosts, looked up with
    `ssh-keygen -F` (hashed names and patterns as ssh reads them). Nothing is ever learned on first use."""
    found: list[tuple[str, str]] = []
    revoked: set[tuple[str, str]] = set()
    for path in (os.path.expanduser("~/.ssh/known_hosts"), SYSTEM_KNOWN_HOSTS):
        if not os.path.isfile(path):
            continue
        for label in labels:
            try:
                ran = subprocess.run(["ssh-keygen", "-F", label, "-f", path], capture_output=True, text=True,
                                     timeout=30, stdin=subprocess.DEVNULL, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise NoReplicaSsh(f"the nodes' host keys cannot be looked up: ssh-keygen is not usable on this "
                                   f"node ({exc})") from None
            for line in ran.stdout.splitlines():
                words = line.split()
                if len(words) < 3 or words[0].startswith("#"):
                    continue
                if words[0] == "@revoked" and len(words) >= 4:
                    revoked.add((words[2], words[3]))
                elif not words[0].startswith("@") and (words[1], words[2]) not in found:
                    found.append((words[1], words[2]))  # @cert-authority: host certificates are not used here
    return [key for key in found if key not in revoked]


def sshd_answers(address: str, port: int) -> bool:
    """An SSH server greets on address:port within SSHD_PROBE_SECONDS."""
    try:
        with socket.create_connection((address, port), timeout=SSHD_PROBE_SECONDS) as sock:
            sock.settimeout(SSHD_PROBE_SECONDS)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def shared_key_pair(spec_dir: str, tag: str) -> dict:
    """The Job's key pair, the same for every runner: the first runner makes it and links it into the
    spec directory (600; a link never replaces, so a second runner's pair loses and it reads the first)."""
    path = os.path.join(spec_dir, SSH_KEY_FILE)
    for _attempt in range(3):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            pair = replica_ssh.new_key_pair(tag)
            fd, tmp = tempfile.mkstemp(prefix=".replica-ssh-", dir=spec_dir)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    json.dump(pair, out)
                    out.flush()
                    os.fsync(out.fileno())
                os.link(tmp, path)
            except FileExistsError:
                pass
            except OSError as exc:
                raise NoReplicaSsh(f"the Job's key cannot be written to {path} ({exc.strerror})") from None
            finally:
                os.unlink(tmp)
            continue
        except OSError as exc:
            raise NoReplicaSsh(f"the Job's key in {path} cannot be read ({exc.strerror})") from None
        with os.fdopen(fd, encoding="utf-8") as f:
            try:
                data = json.load(f)
                return {"private": str(data["private"]), "public": str(data["public"])}
            except (ValueError, KeyError, TypeError):
                raise NoReplicaSsh(f"{path} is damaged; submit the Job again") from None
    raise NoReplicaSsh(f"the Job's key in {path} kept disappearing")


# -- the runner ---------------------------------------------------------------------------------

class Runner:
    def __init__(self, spec: Spec):
        self.spec = spec
        self.id = spec.job_id
        self.runner_id = str(uuid.uuid4())
        self.api = Api(spec.api_url, spec.token, spec.job_id, self.runner_id)
        self.job: dict = dict(spec.job)
        self.job_dir = ""
        self.heartbeat_seconds = 5.0
        self.log_interval = 1.0
        self.offsets = {s: 0 for s in STREAMS}
        self._fds: dict[str, int] = {}
        self._order: supervisor.LogOrder | None = None
        self.running_reported = False
        self.stop_reason: str | None = None  # "canceled" (stop request) or "timed_out" (SIGTERM to the runner)
        self.stop_written = False
        self.refused: Refused | None = None
        self._cancel_thread: threading.Thread | None = None
        self.beat_failures = 0
        # main1 of a cluster job: how long it waits for the subs' ends, and which subs the last heartbeat
        # answer said had not ended (None: not known).
        self.replica_wait = 0.0
        self.replicas_running: list | None = None
        # A cluster job's replica (None for every other Job); which one is known before start.
        self.size = cluster_size_of(spec.job)
        self.replica_index = replica_index(self.size) if self.size > 1 else None
        self.replica: Replica | None = None
        self.nodes: list[str] = []
        self.ssh_tag: str | None = None  # this replica's authorized_keys line, until it is removed

    @property
    def replica_name(self) -> str | None:
        return None if self.replica_index is None else replica_name(self.replica_index)

    @property
    def is_sub(self) -> bool:
        return bool(self.replica_index)

    # -- signals ---------------------------------------------------------------------------------

    def install_signals(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        if self.stop_reason is None:
            self.stop_reason = "timed_out"
            note(f"{lifecycle.signal_name(signum)} received (the scheduler's time limit is near): stopping the Job's "
                 "code.")
        self.request_stop()

    def request_stop(self) -> None:
        """Ask the supervisor to stop the code (SIGTERM, SIGKILL after the grace); once is enough."""
        if self.stop_written or not self.job_dir or \
                not os.path.exists(os.path.join(self.job_dir, supervisor.STATE_FILE)):
            return
        try:
            supervisor.write_json(os.path.join(self.job_dir, supervisor.CANCEL_FILE),
                                  {"requested_at": time.time(), "by": f"runner ({self.stop_reason or 'refused'})"})
            self.stop_written = True
        except OSError as exc:
            note(f"Could not ask the supervisor to stop the Job: {exc}.")

    def stop_orphan(self, state: dict) -> None:
        """The supervisor is gone while the code may still run: stop its process group ourselves."""
        if self._cancel_thread is not None:
            return

        def cancel() -> None:
            try:
                supervisor.cmd_cancel(self.job_dir, None)
            except Exception as exc:  # noqa: BLE001 -- reported; the loop goes on watching
                note(f"Stopping the Job's code failed: {exc}.")

        self._cancel_thread = threading.Thread(target=cancel, name="cancel", daemon=True)
        self._cancel_thread.start()

    # -- the whole run ----------------------------------------------------------------------------

    def run(self) -> int:
        self.install_signals()
        try:
            answer = self.start()
        except Refused as exc:
            return self.refused_exit(exc)
        except Unavailable as exc:
            if self.stop_reason:
                note(f"{exc} Stopped by a signal before the server answered; nothing ran.")
                return EXIT_FAILED
            note(f"{exc} The runner gave up after {START_PATIENCE:.0f} s: check the site's runner API URL and that "
                 "compute nodes can reach the server.")
            return EXIT_CONFIG
        except ApiError as exc:
            note(f"The server refused to start Job {self.id}: {exc}")
            return EXIT_CONFIG if exc.code == "redirect" else EXIT_REFUSED
        try:
            return self.supervise(answer)
        except Refused as exc:
            self.stop_code()
            return self.refused_exit(exc)
        except Exception as exc:  # noqa: BLE001 -- a bug must still end the Job, not leave it waiting
            note("The runner failed unexpectedly:\n" + mask("".join(traceback.format_exc()), self.spec.token))
            self.stop_code()
            return self.finish({"status": "failed", "end_reason": "worker_lost",
                                "error": f"The runner on the compute node failed: {type(exc).__name__}: {exc}"[:900]})
        finally:
            self.revoke_replica_ssh()  # the code has ended or never ran: the Job's key is of no more use

    def start(self) -> dict:
        body: dict = {"hostname": socket.gethostname()}
        scheduler_id = next((os.environ[v] for v in SCHEDULER_ID_VARIABLES if os.environ.get(v)), None)
        if scheduler_id:
            body["scheduler_job_id"] = scheduler_id[:200]
        index = os.environ.get("MMT_ARRAY_INDEX", "").strip()
        if index.isdigit():
            body["array_index"] = int(index)
        if self.replica_name:
            body["replica"] = self.replica_name
        note(f"Job {self.id}: runner {self.runner_id} starting on {body['hostname']}"
             + (f" (scheduler job {scheduler_id})" if scheduler_id else "") + ".")
        try:
            answer = self._start_call(body)
        except Refused as exc:
            if exc.status != 401 or not self.adopt_new_token():
                raise
            # An adopted submission was given new job tokens after this batch job read job.json.
            note(f"Job {self.id}: job.json has a newer job token (the submission was adopted); starting with it.")
            answer = self._start_call(body)
        self.heartbeat_seconds = _bounded(answer.get("heartbeat_seconds"), 5.0, 1.0, 60.0)
        self.log_interval = _bounded(answer.get("log_interval_seconds"), 1.0, 0.2, 30.0)
        # A server that does not say waits for nothing: main1 finishes at once, as before.
        self.replica_wait = _bounded(answer.get("replica_wait_seconds"), 0.0, 0.0, 120.0)
        return answer

    def _start_call(self, body: dict) -> dict:
        return self.api.call("POST", "start", body=body, patience=START_PATIENCE, what="start",
                             give_up=lambda: self.stop_reason is not None)

    def adopt_new_token(self) -> bool:
        """Re-read job.json once: True when it now holds a different token, which replaces ours."""
        try:
            fresh = load_spec(self.spec.dir)
        except ConfigError:
            return False
        if fresh.token == self.spec.token or fresh.job_id != self.id:
            return False
        self.spec = fresh
        self.api = Api(fresh.api_url, fresh.token, fresh.job_id, self.runner_id)
        return True

    def refused_exit(self, exc: Refused) -> int:
        if self.is_sub and (exc.status == 401 or exc.code == "job_ended"):
            # main1 ended, or another replica failed or was stopped: this replica's part is over.
            note(f"Job {self.id} has ended on the server (main1 ended, or another replica failed or was stopped): "
                 f"{self.replica_name} is stopped and exits 0.")
            return EXIT_OK
        what = {"runner_conflict": "another runner already reports this Job (a second copy of the batch job?)",
                "job_ended": "the Job has already ended"}.get(exc.code or "")
        if what is None:
            what = ("the job token is no longer valid (the Job was stopped or ended, or its submission expired)"
                    if exc.status == 401 else f"it answered {exc.status} {exc.code or ''}".strip())
        note(f"The server refused this runner of Job {self.id}: {what}. {exc} Nothing more is reported; "
             "this runner exits 3.")
        return EXIT_REFUSED

    def supervise(self, answer: dict) -> int:
        self.job = self.job_object(answer.get("job"))
        if self.stop_reason == "timed_out":
            return self.finish({"status": "failed", "end_reason": "timed_out",
                                "error": "The scheduler stopped the batch job before its code started."})
        if self.job.get("cancel_requested"):
            note("A stop was requested before the Job's code started: not starting it.")
            return self.finish({"status": "canceled", "end_reason": "canceled"})
        try:
            self.prepare()
        except StartFailed as exc:
            note(f"The Job could not start: {exc}")
            reason = "timed_out" if self.stop_reason == "timed_out" else "start_failed"
            return self.finish({"status": "failed", "end_reason": reason, "error": str(exc)[:1000]})
        final = self.follow()
        if self.refused is not None:
            raise self.refused
        if final.get("started_at") and not self.running_reported:
            self.heartbeat(final)  # the code ran (however briefly): the Job was running before it ended
            if self.refused is not None:
                raise self.refused
        completion = self.conclude(final)
        # Every line before the finish: a sub's finish is its last call, and main1's ends the Job.
        self.ship_logs(final=True)
        if not self.wait_for_subs():
            note(f"Job {self.id} ended on the server while main1 waited for the subs (a sub failed or the Job was "
                 "stopped): main1's end is not sent.")
            return EXIT_OK if completion["status"] == "finished" else EXIT_FAILED
        return self.finish(completion)

    def wait_for_subs(self) -> bool:
        """main1 of a cluster job whose code ended on its own: heartbeat until every sub has reported its
        end, or replica_wait_seconds pass (the subs left are stopped once main1's finish ends the Job).
        False when the Job ended meanwhile."""
        if self.replica_index != 0 or self.replica_wait <= 0 or self.stop_reason:
            return True
        deadline = time.monotonic() + self.replica_wait
        first = True
        while True:
            self.replicas_running = None
            self.heartbeat({})
            if self.refused is not None:
                return False
            if self.replicas_running == [] or self.stop_reason:
                return True
            if first and self.replicas_running:
                note(f"main1's code ended; waiting up to {self.replica_wait:g} s for "
                     f"{', '.join(map(str, self.replicas_running))} to finish.")
            first = False
            if time.monotonic() >= deadline:
                waiting = ", ".join(map(str, self.replicas_running or [])) or "the subs"
                note(f"{waiting} did not finish within {self.replica_wait:g} s of main1's end: main1 ends the Job "
                     "now and they are stopped.")
                return True
            time.sleep(min(1.0, self.log_interval))

    def job_object(self, fresh) -> dict:
        """The claim object (the start answer's, else job.json's) as build_spec and jobenv read it."""
        job = dict(fresh) if isinstance(fresh, dict) and fresh.get("id") is not None else dict(self.spec.job)
        job["id"] = self.id
        job["job_token"] = self.spec.token
        # The job's code reaches the server at the address this compute node uses (the site's runner API URL).
        job["api_url"] = self.spec.api_url
        if not job.get("lease_id") or job.get("lease_id") == "None":
            job["lease_id"] = self.runner_id
        computer = dict(job.get("computer") or {})
        parent = os.path.dirname(self.spec.dir)
        if os.path.basename(parent) == SPEC_ROOT:
            # The spec directory is <working dir>/.mmt-submissions/<jobId>: the working dir of this
            # submission (a personal account's own, or `submit --work-dir`) wins over the site's default.
            computer["working_dir"] = os.path.dirname(parent)
        if not computer.get("python_path"):
            computer["python_path"] = sys.executable or "python3"
        job["computer"] = computer
        allocated = [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
                     if g.strip() and g.strip() != "NoDevFiles"]
        if not job.get("gpu_ids") and allocated:
            # The scheduler chose the GPUs of this allocation; keep them visible to the code.
            job["gpu_ids"] = allocated
        return job

    # -- preparing --------------------------------------------------------------------------------

    def prepare(self) -> None:
        working_dir = str(self.job["computer"].get("working_dir") or "").rstrip("/")
        if not working_dir.startswith("/"):
            raise StartFailed("The site has no working directory (an absolute path on the compute nodes): set one "
                              "in its settings.")
        runtime = str(self.job.get("runtime") or "python")
        cluster = self.cluster_spec() if self.replica_index is not None else None
        files, prepend = self.launcher_files(cluster, working_dir, runtime) if cluster else ([], [])
        try:
            spec = runtimes.build_spec(self.job, local_facts(runtime), **({"cluster": cluster} if cluster else {}))
        except runtimes.RuntimeRefused as exc:
            raise StartFailed(exc.message) from None
        if cluster:
            spec["files"] = [*spec["files"], *files]
            if prepend:
                spec["path_prepend"] = [*prepend, *(spec.get("path_prepend") or [])]
            spec["spec_hash"] = supervisor.spec_hash(spec)
        # A replica's workspace is <jobId>-<replica> (replicas may share a node and a working directory).
        job_dir = ensure_workspace(working_dir, spec["job_id"])
        if supervisor.cmd_poll(job_dir).get("status") == "absent":
            if self.job.get("source") and not os.path.lexists(os.path.join(job_dir, "source")):
                self.fetch_source(job_dir)
            if self.stop_reason:
                raise StartFailed("The scheduler stopped the batch job before its code started.")
        try:
            state = supervisor.cmd_start(job_dir, json.dumps(spec).encode("utf-8"), supervisor.program_source())
        except supervisor.Refused as exc:
            raise StartFailed(f"The supervisor refused to start the Job ({exc.code}): {exc.message}") from None
        self.job_dir = job_dir
        note(f"Job {self.id} {'started' if state.get('started') else 're-attached'} in {job_dir} ({runtime} runtime, "
             f"supervisor pid {(state.get('supervisor') or {}).get('pid')}).")
        if self.stop_reason:
            self.request_stop()

    def cluster_spec(self) -> dict:
        """build_spec's `cluster`: this replica's name, its cluster variables and every replica's address."""
        nodes = cluster_nodes()
        if len(nodes) == 1:
            nodes = nodes * self.size  # an owner's job shell that put every replica on one node
        if len(nodes) != self.size:
            raise StartFailed(f"This {self.size}-replica cluster job got {len(nodes)} nodes ({', '.join(nodes[:8])}); "
                              "the job shell must ask for one node per replica (MMT_NODES).")
        self.nodes = nodes
        addresses = [node_address(node) for node in nodes]
        self.replica = Replica(self.replica_index, self.size, str(self.job.get("cluster_mode") or "single-node"),
                               addresses, master_port(self.id))
        note(f"{self.replica.name} of {self.size} on {nodes[self.replica_index]}; main1 at "
             f"{addresses[0]}:{self.replica.env['MASTER_PORT']}.")
        return {"name": self.replica.name, "env": self.replica.env, "hosts": self.replica.hosts}

    def launcher_files(self, cluster: dict, working_dir: str, runtime: str) -> tuple[list[dict], list[str]]:
        """The hostfiles of every replica and, where this replica gets ssh to the others, its `ssh/`
        (worker_agent/replica_ssh.py) with `ssh/bin` first on PATH: the spec's extra files and PATH
        entries. The variables naming them join `cluster["env"]`."""
        job_dir = supervisor.workspace(working_dir, f"{self.id}-{self.replica.name}")
        container = runtime in ("docker", *runtimes.CONTAINER_RUNTIMES)
        inputs = jobenv.container_locations().inputs_dir if container else jobenv.host_locations(job_dir).inputs_dir
        cluster["env"].update(jobenv.cluster_file_variables(inputs))
        # Every node of the allocation has as many GPUs as this one (the job shell asks per node).
        gpus = list(self.job.get("gpu_ids") or [])
        replicas = [dict(r, gpu_ids=gpus) for r in self.replica.replicas]
        files = [{"path": f"inputs/{jobenv.CLUSTER_HOSTFILE}", "content": jobenv.hostfile_text(replicas),
                  "mode": 0o644},
                 {"path": f"inputs/{jobenv.CLUSTER_NODEFILE}", "content": jobenv.nodefile_text(replicas),
                  "mode": 0o644}]
        try:
            ssh_files = self.replica_ssh_files(job_dir, runtime)
        except replica_ssh.ReplicaSshError as exc:
            note(f"SSH between the replicas is off for {self.replica.name} of Job {self.id}: {exc.message}. The Job "
                 "runs without it; MASTER_ADDR/MASTER_PORT and the hostfiles work as before.")
            return files, []
        cluster["env"]["MMT_CLUSTER_SSH_CONFIG"] = f"{job_dir}/{replica_ssh.CONFIG_PATH}"
        return files + ssh_files, [f"{job_dir}/{replica_ssh.BIN_DIR}"]

    def replica_ssh_files(self, job_dir: str, runtime: str) -> list[dict]:
        """This replica's `ssh/` files once the Job's key is authorized in the account's
        ~/.ssh/authorized_keys on this node (a shared home: on every node). NoReplicaSsh says why not."""
        if runtime != "python":
            raise NoReplicaSsh(f"it is for the python runtime; the {runtime} runtime's containers have no ssh setup")
        if site_setting("REPLICA_SSH").lower() in OFF_VALUES:
            raise NoReplicaSsh("the site turns it off (REPLICA_SSH)")
        port = node_ssh_port()
        user = pwd.getpwuid(os.getuid()).pw_name
        replicas, known_hosts = [], []
        for index, node in enumerate(self.nodes):
            address = self.replica.hosts[replica_name(index)]
            labels = list(dict.fromkeys(replica_ssh.host_label({"host": h, "port": port})
                                        for h in (node, node_addr(node), address)))
            keys = known_host_keys(labels)
            if not keys:
                raise NoReplicaSsh(f"the host key of node {node} ({', '.join(labels)}) is in neither ~/.ssh/known_hosts "
                                   f"nor {SYSTEM_KNOWN_HOSTS}; Mado never accepts an unknown one: add it there")
            if not sshd_answers(address, port):
                raise NoReplicaSsh(f"no sshd answers on node {node} ({address} port {port})")
            name = replica_name(index)
            known_hosts += [f"{name} {kind} {blob}" for kind, blob in keys]
            replicas.append({"index": index, "name": name,
                             "computer": {"kind": "ssh", "host": address, "port": port, "ssh_user": user}})
        peers = replica_ssh.peers(replicas)
        known = "\n".join(known_hosts) + "\n"
        replica_ssh.replica_files(job_dir=job_dir, peers=peers, known_hosts=known, private_key="")  # fits a config
        scheduler_id = next((os.environ[v] for v in SCHEDULER_ID_VARIABLES if os.environ.get(v)), None)
        tag = ssh_tag(self.id, self.replica.name, scheduler_id)
        pair = shared_key_pair(self.spec.dir, tag)
        try:
            answer = authorized_keys.apply({"add": pair["public"], "tag": tag, "expired": True,
                                            "seconds": replica_ssh.key_lifetime(self.job.get("walltime_seconds"))})
        except (OSError, ValueError) as exc:
            raise NoReplicaSsh(f"~/.ssh/authorized_keys cannot be changed ({exc})") from None
        self.ssh_tag = tag
        note(f"SSH between the replicas: the Job's key is authorized in {answer['path']} as {tag}"
             + (f" until {answer['expiry']}" if answer.get("expiry") else " (no expiry-time: OpenSSH older than 8.2)")
             + "; `ssh main1`, `ssh sub1`, … work from the code.")
        return replica_ssh.replica_files(job_dir=job_dir, peers=peers, known_hosts=known, private_key=pair["private"])

    def revoke_replica_ssh(self) -> None:
        """This replica's authorized_keys line goes; one left behind (a killed runner) expires on its own
        and goes at the next authorization under this account."""
        if not self.ssh_tag:
            return
        try:
            answer = authorized_keys.apply({"add": None, "remove": [self.ssh_tag]})
        except OSError as exc:
            note(f"The Job's SSH key could not be removed from ~/.ssh/authorized_keys ({exc}); it expires on its own.")
            return
        note(f"The Job's SSH key is removed from {answer['path'] or '~/.ssh/authorized_keys'} "
             f"({answer['removed']} line{'' if answer['removed'] == 1 else 's'}).")
        self.ssh_tag = None

    def fetch_source(self, job_dir: str) -> None:
        source = self.job["source"]
        if source.get("kind") == "git":
            note(f"Cloning {source.get('url')} ({source.get('ref') or 'HEAD'}).")
            clone_source(source, job_dir)
            return
        if source.get("kind") != "archive":
            raise StartFailed(f"This runner does not know the source kind {source.get('kind')!r}.")
        fd, path = tempfile.mkstemp(prefix=".source-download-", dir=job_dir)
        try:
            with os.fdopen(fd, "wb") as out:
                for attempt in range(1, 100):
                    out.seek(0)
                    out.truncate()
                    try:
                        size = self.api.once("GET", "source", out=out, timeout=120)["size"]
                        break
                    except Unavailable as exc:
                        note(f"Source download failed ({exc}); trying again.")
                        time.sleep(min(RETRY_CAP, 2.0 ** attempt))
                    except Refused:
                        raise
                    except ApiError as exc:
                        raise StartFailed(f"The source could not be downloaded: {exc}") from None
                else:
                    raise StartFailed("The source could not be downloaded: the server kept failing.")
            if source.get("sha256") and core_outputs.file_sha256(path) != str(source["sha256"]).lower():
                raise StartFailed("The downloaded source archive does not match its sha256; upload it again.")
            count = unpack_archive(path, job_dir)
            note(f"Source archive downloaded ({size} bytes) and unpacked ({count} files).")
        finally:
            os.unlink(path)

    # -- following the code -----------------------------------------------------------------------

    def poll(self) -> dict:
        try:
            return supervisor.cmd_poll(self.job_dir)
        except supervisor.Refused as exc:
            return {"status": "refused", "error": exc.message}

    @staticmethod
    def ended(state: dict) -> bool:
        return state.get("status") in ENDED or (state.get("status") == "unknown" and not state.get("process_alive"))

    def follow(self) -> dict:
        """Logs and heartbeats until the supervisor's end state (returned)."""
        next_logs = next_beat = 0.0
        running_tried = False
        while True:
            if (self.stop_reason or self.refused) and not self.stop_written:
                self.request_stop()
            state = self.poll()
            if state.get("status") == "unknown" and state.get("process_alive") and (self.stop_reason or self.refused):
                self.stop_orphan(state)
            ended = self.ended(state)
            now = time.monotonic()
            if ended or now >= next_logs:
                caught_up = self.ship_logs(final=ended)
                next_logs = now + self.log_interval if caught_up else now
            if ended:
                return state
            # The moment the code runs, say so (once; a failed try waits for the regular beat).
            just_running = bool(state.get("started_at")) and not self.running_reported and not running_tried
            if self.refused is None and (time.monotonic() >= next_beat or just_running):
                running_tried = running_tried or just_running
                self.heartbeat(state)
                next_beat = time.monotonic() + self.heartbeat_seconds
            time.sleep(POLL_SECONDS)

    def heartbeat(self, state: dict) -> None:
        running = bool(state.get("started_at")) and not self.running_reported
        body = {"status": "running"} if running else {}
        try:
            answer = self.api.once("POST", "heartbeat", body=body)
        except Refused as exc:
            self.refused = exc
            note(f"The server refused the heartbeat ({exc.status} {exc.code}): stopping the Job's code.")
            self.request_stop()
            return
        except ApiError as exc:
            self.beat_failures += 1
            if self.beat_failures == 1 or self.beat_failures % 12 == 0:
                note(f"Heartbeat not delivered ({exc}); the Job runs on and the runner keeps trying.")
            return
        self.beat_failures = 0
        if isinstance(answer.get("replicas_running"), list):
            self.replicas_running = answer["replicas_running"]
        if running:
            self.running_reported = True
            note("The Job's code runs (reported running).")
        if answer.get("cancel_requested") and self.stop_reason is None:
            self.stop_reason = "canceled"
            note("A stop was requested: stopping the Job's code (SIGTERM, SIGKILL after the grace).")
            self.request_stop()

    def _log_fd(self, stream: str) -> int | None:
        fd = self._fds.get(stream)
        if fd is None:
            try:
                fd = os.open(os.path.join(self.job_dir, f"{stream}.log"), os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                return None
            self._fds[stream] = fd
        return fd

    def collect(self, final: bool) -> tuple[list[dict], dict]:
        """New log bytes from the offsets: chunks of at most LOG_CHUNK, LOG_BATCH in all. Each ends at a
        UTF-8 character boundary, except the very last bytes of a stream that has ended. The supervisor's
        `[mado]` notes come where they happened among the code's lines (supervisor.LogOrder)."""
        chunks, total, pos = [], 0, dict(self.offsets)
        fds = {stream: self._log_fd(stream) for stream in STREAMS}
        sizes = {stream: os.fstat(fd).st_size if fd is not None else 0 for stream, fd in fds.items()}
        if self._order is None and self.job_dir:
            self._order = supervisor.LogOrder(self.job_dir)
        if self._order is not None:
            self._order.refresh()  # after the sizes: a note within them has its place recorded already

        def read(stream: str, limit: int | None) -> bool:
            nonlocal total
            size, moved = sizes[stream], False
            end = size if limit is None else min(size, limit)
            while total < LOG_BATCH and pos[stream] < end:
                data = os.pread(fds[stream], min(LOG_CHUNK, end - pos[stream], LOG_BATCH - total), pos[stream])
                if not data:
                    break
                if not (final and pos[stream] + len(data) >= size):
                    cut = data[:supervisor.utf8_cut(data)]
                    # Held at a limit inside a character (bytes that are no UTF-8): send them rather than stall.
                    data = cut if cut or limit is None or pos[stream] + len(data) < end or end >= size else data
                if not data:
                    break
                chunks.append({"stream": stream, "offset": pos[stream], "data": data.decode("utf-8", "replace")})
                pos[stream] += len(data)
                total += len(data)
                moved = True
            return moved

        while total < LOG_BATCH:
            limits = self._order.limits(pos["stdout"], pos["stderr"], final) if self._order else (None, None)
            moved = read("stdout", limits[0])
            moved |= read("stderr", limits[1])
            if not moved:
                if final:  # never end with bytes unsent, whatever order.log says
                    for stream in STREAMS:
                        read(stream, None)
                break
        return chunks, pos

    def ship_logs(self, final: bool) -> bool:
        """Send what is new; True when caught up (False: more is waiting, come back soon)."""
        deadline = time.monotonic() + LOG_TICK_BUDGET
        while True:
            chunks, pos = self.collect(final)
            if not chunks:
                return True
            try:
                self.api.call("POST", "logs", body={"chunks": chunks}, what="logs")
            except Refused:
                if final:
                    return True
                raise
            except ApiError as exc:  # 422: these chunks cannot get better by sending them again
                note(f"The server refused {len(chunks)} log chunk(s): {exc}")
            self.offsets = pos
            if not final and time.monotonic() >= deadline:
                return False

    # -- the end ----------------------------------------------------------------------------------

    def conclude(self, final: dict) -> dict:
        status, code = final.get("status"), final.get("exit_code")
        if self.stop_reason == "timed_out" and status in ("exited", "canceled", "timed_out"):
            if code == 0 and not self.is_sub:
                self.send_outputs(best_effort=True)  # a checkpoint written on SIGTERM is kept
            return {"status": "failed", "end_reason": "timed_out", **({"exit_code": code} if code is not None else {}),
                    "error": "The scheduler's time limit was reached: the batch job got SIGTERM and the code was "
                             "stopped."}
        # Only main1's outputs are collected; a sub that is done simply says so.
        return lifecycle.conclude(
            final, (lambda: dict(lifecycle.FINISHED)) if self.is_sub else self.send_outputs,
            walltime=self.job.get("walltime_seconds"), subject="The code",
            lost=lambda f: f.get("error") or f"The Job's supervisor on the compute node ended unexpectedly "
                                              f"({f.get('status')}); the exit code is unknown.")

    def send_outputs(self, *, best_effort: bool = False) -> dict:
        """result.json checked here, declared, and the artifacts the server asks for uploaded."""
        max_files = results.DEFAULT_MAX_OUTPUT_FILES
        try:
            listing = list_outputs(os.path.join(self.job_dir, "outputs"), max_files)
        except (StartFailed, OSError) as exc:
            return lifecycle.invalid_result(str(exc))

        def declare(result: str, files: list, manifest: str | None) -> dict | None:
            try:
                return self.api.call("POST", "outputs", what="outputs",
                                     body={"result": result, "files": files, "manifest": manifest})
            except Refused:
                if best_effort:
                    return None
                raise

        # A site has no worker whose setting could raise the limit: the messages say what the code can do.
        return lifecycle.send_outputs(listing, max_files=max_files, limit_setting=None, declare=declare,
                                      upload=lambda path, size, _number, _count: self.upload(path, size), note=note,
                                      upload_batch=self.upload_batch, gone=lambda exc: isinstance(exc, Refused),
                                      pause=time.sleep, cap=RETRY_CAP)

    def upload_batch(self, files: list[dict]) -> dict:
        """Many small outputs in one request (the worker's format: core_outputs frames, read here)."""
        root = os.path.join(self.job_dir, "outputs")
        body = core_outputs.FramedBody(files, core_outputs.iter_frames(root, files))
        # urllib would send a body without a length chunked, which Django does not read.
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(len(body))}
        with body:
            return self.api.once("PUT", "artifacts-batch", data=body, headers=headers, timeout=CONNECT_TIMEOUT * 4)

    def upload(self, path: str, size: int) -> None:
        full = os.path.join(self.job_dir, "outputs", *path.split("/"))
        url_path = "artifacts/" + urllib.parse.quote(path, safe="/")

        def put(offset: int, length: int, content_range: str | None) -> dict:
            headers = {"Content-Type": "application/octet-stream", "Content-Length": str(length)}
            if content_range:
                headers["Content-Range"] = content_range
            try:
                body = _Body(full, offset, length)
            except OSError as exc:
                raise lifecycle.UploadFailed(f"The output {path} cannot be read: {exc.strerror or exc}.") from None
            try:
                return self.api.once("PUT", url_path, data=body, headers=headers, timeout=CONNECT_TIMEOUT * 4)
            finally:
                body.close()

        lifecycle.upload(path, size, put, gone=lambda exc: isinstance(exc, Refused), note=note, pause=time.sleep,
                         cap=RETRY_CAP)

    def finish(self, completion: dict) -> int:
        for _round in range(FINISH_ROUNDS + 1):
            body = {k: v for k, v in completion.items() if v is not None}
            try:
                self.api.call("POST", "finish", body=body, what="finish")
            except Refused as exc:
                if exc.status != 401:
                    return self.refused_exit(exc)
                # Finishing revokes the job token: a finish resent after a lost answer meets 401, and
                # the Job has ended on the server either way.
                note(f"Job {self.id}: the server already has this Job's end (its token is revoked).")
            except ApiError as exc:
                if exc.code == "artifacts_incomplete" and _round < FINISH_ROUNDS:
                    note(f"{exc} Sending the outputs again.")
                    completion = self.send_outputs()
                    continue
                note(f"The server refused the Job's end {body}: {exc}")
                return EXIT_FAILED
            break
        detail = (f" (exit code {completion['exit_code']})" if completion.get("exit_code") is not None else "") + \
            (f", {completion['end_reason']}" if completion.get("end_reason") else "") + \
            (f": {completion['error'].rstrip('.')}" if completion.get("error") else "")
        who = f"{self.replica_name} of Job {self.id}" if self.replica_name else f"Job {self.id}"
        note(f"{who} ended {completion['status']}{detail}.")
        return EXIT_OK if completion["status"] == "finished" else EXIT_FAILED

    def stop_code(self) -> None:
        """Stop the code and wait for its end (the runner is about to leave)."""
        if not self.job_dir:
            return
        self.request_stop()
        deadline = time.monotonic() + supervisor.DEFAULT_GRACE + 30.0
        while time.monotonic() < deadline:
            state = self.poll()
            if self.ended(state):
                return
            if state.get("status") == "unknown":
                supervisor.cmd_cancel(self.job_dir, None)
                return
            time.sleep(POLL_SECONDS)


def _bounded(value, default: float, low: float, high: float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(number) else min(high, max(low, number))


def main(argv: list[str] | None = None) -> int:
    """`mado-tracking runner SPEC_DIR` and `runner.py SPEC_DIR`: the exit code (see the module's docstring)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--free-port"]:
        print(free_port())  # the batch script of a cluster job: MASTER_PORT on main1's node
        return EXIT_OK
    if args and args[0] in ("-h", "--help"):
        print("usage: mado-tracking runner SPEC_DIR\n\nRuns one Job of a site on this compute node and reports it to "
              "the Mado server with the Job's token from SPEC_DIR/job.json.\nExit codes: 0 finished, 1 failed/"
              "canceled/timed out, 2 configuration error, 3 the server refused the runner.")
        return EXIT_OK
    if sys.version_info < (3, 11):  # noqa: UP036 -- the site's runner Python is not the package's
        note(f"The runner needs Python 3.11 or later; {sys.executable} is {sys.version.split()[0]}. Set the site's "
             "runner Python to a newer interpreter.")
        return EXIT_CONFIG
    if len(args) != 1:
        note("usage: mado-tracking runner SPEC_DIR (the spec directory the job shell passes as MMT_SPEC_DIR).")
        return EXIT_CONFIG
    try:
        spec = load_spec(args[0])
        runner = Runner(spec)
    except ConfigError as exc:
        note(f"Configuration error: {exc}")
        return EXIT_CONFIG
    if runner.replica_name:
        global _label
        _label = f" {runner.replica_name}"
    return runner.run()


if __name__ == "__main__":
    sys.exit(main())
