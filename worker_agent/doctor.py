"""`doctor`: what would stop this worker, found before a job fails. Each finding is ok, warning or
error; any error makes the exit status 1."""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from worker_agent.api import ApiClient, ApiError, FatalApiError
from worker_agent.candidates import scan
from worker_agent.config import ConfigError, default_state_dir, home, read_token_file, validate_api_url, validate_token
from worker_agent.install import Layout, parse_env_file, state_dir_of
from worker_agent.journal import check_state_dir

REQUIRED_SCOPES = ("read", "worker:execute", "artifacts:write")


@dataclass
class Report:
    lines: list[tuple[str, str]] = field(default_factory=list)

    def ok(self, text: str) -> None:
        self.lines.append(("ok", text))

    def warn(self, text: str) -> None:
        self.lines.append(("warning", text))

    def error(self, text: str) -> None:
        self.lines.append(("error", text))

    @property
    def errors(self) -> int:
        return sum(1 for level, _ in self.lines if level == "error")

    def render(self) -> str:
        return "\n".join(f"{level:<8}{text}" for level, text in self.lines)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def check_env_file(report: Report, env_file: Path) -> dict[str, str]:
    try:
        st = os.lstat(env_file)
    except FileNotFoundError:
        report.error(f"No env file at {env_file}: run `mado-tracking-worker install` for this worker id.")
        return {}
    if not stat.S_ISREG(st.st_mode):
        report.error(f"{env_file} is not a regular file: run install again to rewrite it.")
        return {}
    if stat.S_IMODE(st.st_mode) & 0o077:
        report.error(f"{env_file} has mode {stat.S_IMODE(st.st_mode):o} but holds the token: run chmod 600 {env_file}.")
    else:
        report.ok(f"env file {env_file} (mode {stat.S_IMODE(st.st_mode):o})")
    try:
        return parse_env_file(env_file.read_text(encoding="utf-8"))
    except OSError as exc:
        report.error(f"{env_file} cannot be read ({exc.strerror}): run doctor as the worker's user.")
        return {}


def check_api(report: Report, api_url: str, token: str) -> None:
    with ApiClient(api_url, token, attempts=1) as client:
        _check_api(report, client, api_url, token)


def _check_api(report: Report, client: ApiClient, api_url: str, token: str) -> None:
    try:
        health = client.health()
        report.ok(f"API {api_url} answers (version {health.get('version', '?')})")
    except ApiError as exc:
        report.error(f"The API at {api_url} does not answer /api/health: {exc}")
        return
    if not token:
        return
    try:
        info = client.token_info()
    except FatalApiError:
        report.error("The API server rejects the worker token (401): it is unknown, expired or revoked, or its service "
                     "account is disabled. Issue a new one and run install again.")
        return
    except ApiError as exc:
        report.error(f"The token could not be checked: {exc}")
        return
    if info.get("kind") == "job":
        report.error("The configured token is a job token, which works only for one running job. Issue a worker token "
                     "for a service account (scopes read, worker:execute, artifacts:write) and run install again.")
        return
    scopes = set(info.get("scopes") or [])
    missing = [s for s in REQUIRED_SCOPES if s not in scopes]
    if missing:
        report.error(f"The token lacks the scope(s) {', '.join(missing)}. Issue a token for an admin-role service "
                     "account with read, worker:execute and artifacts:write, then run install again.")
    else:
        report.ok(f"token of project {info.get('project')} ({info.get('kind')}) has {', '.join(REQUIRED_SCOPES)}")
    if "registry:write" not in scopes:
        report.warn("The token has no registry:write scope: jobs that declare models or datasets in result.json "
                    "cannot register them.")
    expires = info.get("expires_at")
    if expires:
        try:
            when = datetime.fromisoformat(str(expires).replace("Z", "+00:00"))
            if when - datetime.now(UTC) < timedelta(days=14):
                report.warn(f"The token expires at {expires}: issue a new one and run install again before then.")
        except ValueError:
            pass


def check_ssh(report: Report, ssh_dirs: list[Path], keys: list[str], known_hosts: list[str]) -> None:
    ssh_dir = home() / ".ssh"
    if ssh_dir.is_dir():
        mode = _mode(ssh_dir)
        if mode & 0o022:
            report.error(f"{ssh_dir} has mode {mode:o}, so others can change its files: run chmod 700 {ssh_dir}.")
        else:
            report.ok(f"{ssh_dir} (mode {mode:o})")
    found = scan(ssh_dirs)
    for key in keys:
        if key not in found.ssh_keys:
            found.ssh_keys.append(key)
    for key in found.ssh_keys:
        path = Path(key)
        if not path.exists():
            report.error(f"The SSH key {key} does not exist: check the path, or create it with ssh-keygen -t ed25519.")
            continue
        mode = _mode(path)
        if mode & 0o077:
            report.error(f"The SSH key {key} has mode {mode:o}: run chmod 600 {key} (the worker refuses keys others "
                         "can read).")
        elif not os.access(path, os.R_OK):
            report.error(f"The SSH key {key} cannot be read by this user: make the worker's user its owner.")
        else:
            report.ok(f"SSH key {key} (mode {mode:o})")
    for path in known_hosts:
        if Path(path).is_file():
            report.ok(f"known_hosts {path}")
        else:
            report.error(f"The known_hosts file {path} does not exist: create it with ssh-keyscan -p PORT HOST > "
                         f"{path} and compare the fingerprint with the target's.")
    if not known_hosts:
        if found.known_hosts:
            report.ok(f"known_hosts found: {', '.join(found.known_hosts[:5])}")
        elif found.ssh_keys:
            report.error("No known_hosts file was found: the worker accepts only known host keys. Create one with "
                         "ssh-keyscan -p PORT HOST > ~/.ssh/known_hosts and compare the fingerprint.")
        else:
            report.warn("No SSH keys and no known_hosts were found: SSH computers need both (see Allow SSH from the "
                        "worker in the documentation).")


def run_doctor(*, layout: Layout, worker_id: str | None, env: dict[str, str], state_dir: str | None,
               keys: list[str], known_hosts: list[str]) -> Report:
    report = Report()
    values = dict(env)
    if worker_id:
        values.update(check_env_file(report, layout.env_file(worker_id)))
    elif not env.get("MMT_API_URL"):
        report.error("Nothing to check: give --worker-id (reads the env file install wrote) or set MMT_API_URL and "
                     "MMT_API_TOKEN as for a worker started by hand.")
        return report
    worker_id = worker_id or values.get("MMT_WORKER_ID") or ""

    api_url = ""
    try:
        api_url = validate_api_url(values.get("MMT_API_URL", ""))
    except ConfigError as exc:
        report.error(str(exc))
    token = ""
    try:
        raw = values.get("MMT_API_TOKEN") or (read_token_file(values["MMT_API_TOKEN_FILE"])
                                              if values.get("MMT_API_TOKEN_FILE") else "")
        token = validate_token(raw)
    except ConfigError as exc:
        report.error(str(exc))

    if state_dir:
        path = Path(state_dir)
    elif worker_id and layout.env_file(worker_id).exists():
        path = state_dir_of(layout, worker_id)
    elif values.get("MMT_WORKER_STATE_DIR"):
        path = Path(values["MMT_WORKER_STATE_DIR"])
    elif worker_id:
        path = default_state_dir(worker_id)
    else:
        path = None
    if path is not None:
        if not os.path.lexists(path):
            report.warn(f"The state directory {path} does not exist yet; the worker creates it (mode 700) at start.")
        else:
            problems = check_state_dir(path)
            for problem in problems:
                report.error(problem)
            if not problems:
                report.ok(f"state directory {path} (mode 700)")

    if api_url:
        check_api(report, api_url, token)

    ssh_dirs = [home() / ".ssh"]
    if values.get("MMT_WORKER_SSH_DIR"):
        ssh_dirs.append(Path(values["MMT_WORKER_SSH_DIR"]))
    check_ssh(report, ssh_dirs, keys, known_hosts)
    return report
