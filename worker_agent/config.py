"""The worker's configuration, read from `MMT_…` environment variables (the env file `install` writes
holds the same names). Every problem is reported as one sentence saying what to change."""
from __future__ import annotations

import os
import re
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from worker_agent import telemetry
from worker_agent.text import API_TOKEN_RE, JOB_TOKEN_PREFIXES, job_token_prefix

WORKER_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
DEFAULT_PARALLEL_JOBS = 2
DEFAULT_CLAIM_WAIT = 20
DEFAULT_CANCEL_GRACE = 10
DEFAULT_MAX_OUTPUT_FILES = 10_000
DEFAULT_GPU_WATCH_SECONDS = 30
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class ConfigError(Exception):
    """A configuration value is wrong; the message says which and what to do."""


def validate_worker_id(value: str) -> str:
    value = (value or "").strip()
    if not WORKER_ID_RE.fullmatch(value):
        raise ConfigError(
            f"The worker id {value!r} is not valid: use 1 to 64 letters, digits, '.', '_' or '-', starting "
            "with a letter or digit (for example the host name, gpu-host-1)."
        )
    return value


def validate_api_url(value: str) -> str:
    value = (value or "").strip().rstrip("/")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"The API URL {value!r} is not valid: give the server's address with http:// or https://, "
            "for example https://tracking.example.internal."
        )
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ConfigError("The API URL must not contain a query, a fragment or credentials: give only the address.")
    return value


def parse_target_ids(value: str | None) -> list[int] | None:
    """`"3, 5"` → `[3, 5]`; empty → None (the worker then serves checks that name it, and all
    computers its token allows for jobs)."""
    if value is None or not value.strip():
        return None
    ids: list[int] = []
    for part in value.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise ConfigError(
                f"The target ids {value!r} are not valid: give computer ids separated by commas, for example 3,5. "
                "Each id is shown under Computer ID in the computer's details."
            )
        if int(part) not in ids:
            ids.append(int(part))
    return ids


def validate_token(value: str) -> str:
    """A worker token as the server issues it. A job token (`mado_mtj_…`, formerly `mmtj_…`) is refused: it
    belongs to one running job, not to a worker."""
    value = (value or "").strip()
    if not value:
        raise ConfigError("No worker token was given. Issue one for a service account (scopes read, worker:execute, "
                          "artifacts:write) and pass it with --token-file, the prompt or standard input.")
    if value.startswith(JOB_TOKEN_PREFIXES):
        raise ConfigError(f"This is a job token ({job_token_prefix(value)}…), which works only for one running job. "
                          "Issue a worker token "
                          "for a service account in Project settings → Service Accounts.")
    if not API_TOKEN_RE.fullmatch(value):
        raise ConfigError("The worker token is not valid: it starts with mmt_ followed by letters, digits, '-' and "
                          "'_'. Copy it again from the page that showed it once, or issue a new one.")
    return value


def parse_bool(name: str, raw: str | None, default: bool = False) -> bool:
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name} must be true or false (got {raw!r}).")


def home() -> Path:
    return Path(os.path.expanduser("~"))


def default_state_dir(worker_id: str) -> Path:
    """Where a worker keeps its records. `install` and a worker started by hand use the same place,
    so a worker moved under systemd carries its running jobs over."""
    base = os.environ.get("XDG_STATE_HOME") or str(home() / ".local" / "state")
    return Path(base) / "mado-tracking-worker" / worker_id


def read_token_file(path: str) -> str:
    p = Path(path)
    try:
        mode = p.stat().st_mode
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"The token file {path} does not exist. Check MMT_API_TOKEN_FILE / --token-file.") from None
    except PermissionError:
        raise ConfigError(f"The token file {path} cannot be read by this user. Fix its owner or mode (600).") from None
    except OSError as exc:
        raise ConfigError(f"The token file {path} cannot be read ({exc.strerror}).") from None
    if not stat.S_ISREG(mode):
        raise ConfigError(f"The token file {path} is not a regular file.")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) != 1:
        raise ConfigError(f"The token file {path} must hold exactly one line: the token.")
    return lines[0]


@dataclass
class WorkerConfig:
    api_url: str
    token: str
    worker_id: str
    state_dir: Path
    target_ids: list[int] | None = None
    parallel_jobs: int = DEFAULT_PARALLEL_JOBS
    ssh_dirs: list[Path] = field(default_factory=list)
    hostname: str = field(default_factory=socket.gethostname)
    allow_local: bool = False
    claim_wait: int = DEFAULT_CLAIM_WAIT
    # Seconds from SIGTERM to SIGKILL when a job is stopped. 10 s is the product's promise (seed 001);
    # MMT_WORKER_CANCEL_GRACE exists so tests need not wait that long.
    cancel_grace: float = DEFAULT_CANCEL_GRACE
    # The most files a job's outputs directory may hold (seed 001): the setting a user changes; the server
    # accepts what it allows up to its own maximum, MADO_MAX_OUTPUT_FILES (100 000 by default).
    max_output_files: int = DEFAULT_MAX_OUTPUT_FILES
    # Seconds between two readings of the GPUs of each computer it serves (worker_agent.gpu_watch, for the
    # GPU board); 0 turns the watch off.
    gpu_watch_seconds: int = DEFAULT_GPU_WATCH_SECONDS

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> WorkerConfig:
        env = dict(os.environ if env is None else env)
        missing = [name for name in ("MMT_API_URL", "MMT_WORKER_ID") if not env.get(name, "").strip()]
        if not env.get("MMT_API_TOKEN", "").strip() and not env.get("MMT_API_TOKEN_FILE", "").strip():
            missing.append("MMT_API_TOKEN (or MMT_API_TOKEN_FILE)")
        if missing:
            raise ConfigError(
                "Set " + ", ".join(missing) + " before starting the worker (or run `mado-tracking-worker install`, "
                "which writes them to an env file for systemd)."
            )
        api_url = validate_api_url(env["MMT_API_URL"])
        worker_id = validate_worker_id(env["MMT_WORKER_ID"])
        if env.get("MMT_API_TOKEN", "").strip():
            token = env["MMT_API_TOKEN"].strip()
        else:
            token = read_token_file(env["MMT_API_TOKEN_FILE"].strip())
        token = validate_token(token)
        target_ids = parse_target_ids(env.get("MMT_WORKER_TARGET_IDS"))
        state_dir = Path(env["MMT_WORKER_STATE_DIR"]) if env.get("MMT_WORKER_STATE_DIR", "").strip() \
            else default_state_dir(worker_id)
        if not state_dir.is_absolute():
            raise ConfigError(f"MMT_WORKER_STATE_DIR must be an absolute path (got {str(state_dir)!r}).")
        raw_parallel = env.get("MMT_WORKER_PARALLEL_JOBS", "").strip()
        try:
            parallel = int(raw_parallel) if raw_parallel else DEFAULT_PARALLEL_JOBS
        except ValueError:
            parallel = 0
        if not 1 <= parallel <= 128:
            raise ConfigError(f"MMT_WORKER_PARALLEL_JOBS must be a whole number from 1 to 128 (got {raw_parallel!r}).")
        raw_wait = env.get("MMT_WORKER_CLAIM_WAIT", "").strip()
        try:
            claim_wait = int(raw_wait) if raw_wait else DEFAULT_CLAIM_WAIT
        except ValueError:
            claim_wait = -1
        if not 1 <= claim_wait <= 30:
            raise ConfigError("MMT_WORKER_CLAIM_WAIT is the long-poll length in seconds, from 1 to 30 "
                              f"(got {raw_wait!r}).")
        cancel_grace = _int_setting(env, "MMT_WORKER_CANCEL_GRACE", DEFAULT_CANCEL_GRACE, 1, 600,
                                    "the seconds from SIGTERM to SIGKILL when a job is stopped")
        max_output_files = _int_setting(env, "MMT_WORKER_MAX_OUTPUT_FILES", DEFAULT_MAX_OUTPUT_FILES, 1, 10_000_000,
                                        "the most files a job's outputs directory may hold")
        gpu_watch_seconds = _int_setting(env, "MMT_WORKER_GPU_WATCH_SECONDS", DEFAULT_GPU_WATCH_SECONDS, 0, 3600,
                                         "the seconds between two readings of a computer's GPUs (0 turns it off)")
        try:
            telemetry.interval_seconds(env)
        except ValueError as error:
            raise ConfigError(str(error)) from None
        ssh_dirs = [home() / ".ssh"]
        extra = env.get("MMT_WORKER_SSH_DIR", "").strip()
        if extra:
            if not os.path.isabs(extra):
                raise ConfigError(f"MMT_WORKER_SSH_DIR must be an absolute path (got {extra!r}).")
            if Path(extra) not in ssh_dirs:
                ssh_dirs.append(Path(extra))
        # A Local computer runs commands as the worker's own user on the worker's machine: allowed only
        # when the operator says this is a development setup, twice over.
        allow_local = parse_bool("MADO_DEV_MODE", env.get("MADO_DEV_MODE")) and \
            parse_bool("MMT_ALLOW_LOCAL_EXECUTOR", env.get("MMT_ALLOW_LOCAL_EXECUTOR"))
        return cls(api_url=api_url, token=token, worker_id=worker_id, state_dir=state_dir, target_ids=target_ids,
                   parallel_jobs=parallel, ssh_dirs=ssh_dirs, allow_local=allow_local, claim_wait=claim_wait,
                   cancel_grace=cancel_grace, max_output_files=max_output_files, gpu_watch_seconds=gpu_watch_seconds)


def _int_setting(env: dict, name: str, default: int, low: int, high: int, meaning: str) -> int:
    raw = env.get(name, "").strip()
    try:
        value = int(raw) if raw else default
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise ConfigError(f"{name} is {meaning}, a whole number from {low} to {high} (got {raw!r}).")
    return value
