"""`install`, `upgrade` and `status`: the env file, the systemd template unit and the calls to
`systemctl`/`loginctl`/`pip`, which all go through one `Runner` so they can be observed (and so a
machine without systemd gets a clear sentence instead of a traceback)."""
from __future__ import annotations

import os
import pwd
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from worker_agent.config import ConfigError, default_state_dir, home

UNIT_NAME = "mado-tracking-worker@.service"
AGENT_MODULE = "worker_agent"
SYSTEM_ROOT = Path("/")
FORBIDDEN_IN_VALUES = ("'", '"', "\\", "$", "`", "\n", "\r")
ENV_KEYS = ("MMT_API_URL", "MMT_WORKER_ID", "MMT_WORKER_TARGET_IDS", "MMT_WORKER_STATE_DIR", "MMT_API_TOKEN")

# The values the shipped examples in deploy/worker/ are rendered with (a test keeps them equal).
EXAMPLE = {
    "python": "/opt/mado-tracking-worker/venv/bin/python",
    "service_user": "mmt-worker",
    "api_url": "https://tracking.example.internal",
    "worker_id": "gpu-host-1",
    "target_ids": "3",
    "state_dir": "/var/lib/mado-tracking-worker/gpu-host-1",
    "token": "mmt_replace_with_the_worker_token",
}


class InstallError(Exception):
    """Something stops install/upgrade/status; the message says what to do next."""


def unit_instance(worker_id: str) -> str:
    return f"mado-tracking-worker@{worker_id}.service"


# -- the runner ------------------------------------------------------------------------------------

class Runner:
    """Runs systemctl, loginctl and pip. Tests pass their own object with the same `run`."""

    def run(self, argv: list[str], *, timeout: float = 600) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except FileNotFoundError:
            return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: command not found")
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "", f"{argv[0]} did not finish within {timeout:.0f} s")


# -- where things go -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    system: bool
    env_dir: Path
    unit_dir: Path
    state_base: Path

    def env_file(self, worker_id: str) -> Path:
        return self.env_dir / f"{worker_id}.env"

    @property
    def unit_file(self) -> Path:
        return self.unit_dir / UNIT_NAME

    def state_dir(self, worker_id: str) -> Path:
        return self.state_base / worker_id

    def systemctl(self, *args: str) -> list[str]:
        return ["systemctl", *([] if self.system else ["--user"]), *args]


def user_layout() -> Layout:
    h = home()
    return Layout(system=False, env_dir=h / ".config" / "mado-tracking-worker",
                  unit_dir=h / ".config" / "systemd" / "user",
                  state_base=default_state_dir("x").parent)


def system_layout() -> Layout:
    root = Path(SYSTEM_ROOT)
    return Layout(system=True, env_dir=root / "etc" / "mado-tracking-worker",
                  unit_dir=root / "etc" / "systemd" / "system",
                  state_base=root / "var" / "lib" / "mado-tracking-worker")


def layout_for(system: bool) -> Layout:
    return system_layout() if system else user_layout()


# -- rendering -------------------------------------------------------------------------------------

def render_unit(*, system: bool, python: str, env_dir: Path, service_user: str | None = None) -> str:
    """The template unit. KillMode=process: restarting or upgrading the worker never kills the jobs
    it started (they are re-attached from the state directory)."""
    lines = ["[Unit]", "Description=Mado Compute worker %i"]
    if system:
        lines += ["After=network-online.target", "Wants=network-online.target"]
    lines += ["", "[Service]", "Type=simple"]
    if system:
        lines.append(f"User={service_user}")
    lines += [
        f"EnvironmentFile={env_dir}/%i.env",
        f"ExecStart={python} -m {AGENT_MODULE} run",
        "Restart=on-failure",
        "RestartSec=10",
        "KillMode=process",
        "UMask=0077",
        "NoNewPrivileges=yes",
        "",
        "[Install]",
        f"WantedBy={'multi-user.target' if system else 'default.target'}",
    ]
    return "\n".join(lines) + "\n"


def check_env_value(name: str, value: str) -> str:
    if any(ch in value for ch in FORBIDDEN_IN_VALUES):
        raise ConfigError(f"{name} must not contain quotes, '\\', '$', backticks or line breaks: systemd would read "
                          "it differently from the worker. Use a value without them.")
    return value


def render_env(*, api_url: str, worker_id: str, target_ids: str, state_dir: str, token: str) -> str:
    values = dict(zip(ENV_KEYS, (api_url, worker_id, target_ids, state_dir, token), strict=True))
    for name, value in values.items():
        check_env_value(name, value)
    lines = [
        f"# Settings of the Mado Compute worker {worker_id}, written by `mado-tracking-worker install`.",
        "# Mode 600: it holds the worker's API token. Running install again rewrites this file.",
    ]
    lines += [f"{name}={value}" for name, value in values.items()]
    return "\n".join(lines) + "\n"


def parse_env_file(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        values[name.strip()] = value.strip()
    return values


def write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """Write `text` to `path` atomically, with `mode` from the first byte (never briefly readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # the umask may have removed bits we want (0644 units)
        os.replace(tmp, path)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise


def read_unit_python(unit_file: Path) -> str:
    try:
        text = unit_file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InstallError(f"No worker unit is installed at {unit_file}: run `mado-tracking-worker install` "
                           "first.") from None
    for line in text.splitlines():
        if line.startswith("ExecStart="):
            return line[len("ExecStart="):].split()[0]
    raise InstallError(f"{unit_file} has no ExecStart line: run `mado-tracking-worker install` again to rewrite it.")


# -- install ---------------------------------------------------------------------------------------

@dataclass
class InstallPlan:
    layout: Layout
    api_url: str
    worker_id: str
    target_ids: str
    state_dir: Path
    token: str
    python: str
    service_user: str | None = None

    @property
    def env_file(self) -> Path:
        return self.layout.env_file(self.worker_id)

    def env_text(self) -> str:
        return render_env(api_url=self.api_url, worker_id=self.worker_id, target_ids=self.target_ids,
                          state_dir=str(self.state_dir), token=self.token)

    def unit_text(self) -> str:
        env_dir = self.layout.env_dir
        if self.layout.system:
            env_dir = Path("/") / env_dir.relative_to(SYSTEM_ROOT)
        return render_unit(system=self.layout.system, python=self.python, env_dir=env_dir,
                           service_user=self.service_user)


def service_account_ids(user: str) -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise InstallError(f"The service user {user!r} does not exist: create it first (for example "
                           f"useradd --system --create-home {user}), then run install again.") from None
    return entry.pw_uid, entry.pw_gid


def write_install(plan: InstallPlan) -> None:
    """Everything install writes, in an order where a failure leaves no token behind a broken unit."""
    state_dir = plan.state_dir
    if plan.layout.system:
        state_dir = Path(SYSTEM_ROOT) / state_dir.relative_to("/")
    old = os.umask(0o077)
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    finally:
        os.umask(old)
    os.chmod(state_dir, 0o700)
    if plan.layout.system and plan.service_user:
        uid, gid = service_account_ids(plan.service_user)
        os.chown(state_dir, uid, gid)
    write_private(plan.env_file, plan.env_text(), 0o600)
    write_private(plan.layout.unit_file, plan.unit_text(), 0o644)


def start_unit(layout: Layout, worker_id: str, runner) -> list[str]:
    """daemon-reload, enable --now (restart when it was running: it must read the new env file).
    Returns problems as sentences (empty when it started)."""
    unit = unit_instance(worker_id)
    reload_ = runner.run(layout.systemctl("daemon-reload"))
    if reload_.returncode == 127:
        return [f"systemctl is not available on this machine (no systemd), so the worker was not started. Start it "
                f"by hand: set -a; . {layout.env_file(worker_id)}; set +a; {sys.executable} -m {AGENT_MODULE} run"]
    if reload_.returncode != 0:
        return [f"`{' '.join(layout.systemctl('daemon-reload'))}` failed: {reload_.stderr.strip()[:200]}. "
                + ("" if layout.system else "Is a user systemd running (loginctl enable-linger, then log in again)?")]
    was_active = runner.run(layout.systemctl("is-active", unit)).stdout.strip() == "active"
    enable = runner.run(layout.systemctl("enable", "--now", unit))
    if enable.returncode != 0:
        return [f"`{' '.join(layout.systemctl('enable', '--now', unit))}` failed: {enable.stderr.strip()[:200]}. "
                f"See journalctl {'' if layout.system else '--user '}-u {unit}."]
    if was_active:
        restart = runner.run(layout.systemctl("restart", unit))
        if restart.returncode != 0:
            return [f"The worker did not restart with the new settings: {restart.stderr.strip()[:200]}"]
    return []


def linger_hint(runner, user: str) -> str | None:
    answer = runner.run(["loginctl", "show-user", user, "--property=Linger", "--value"])
    if answer.returncode == 0 and answer.stdout.strip() == "yes":
        return None
    return (f"To keep the worker running after you log out and across reboots, run: loginctl enable-linger {user}")


# -- upgrade ---------------------------------------------------------------------------------------

def unit_state(layout: Layout, worker_id: str, runner) -> dict[str, str]:
    answer = runner.run(layout.systemctl("show", unit_instance(worker_id),
                                         "--property=LoadState,ActiveState,SubState,MainPID"))
    if answer.returncode == 127:
        return {"ActiveState": "unknown", "reason": "systemctl is not available on this machine"}
    state = parse_env_file(answer.stdout)
    state.setdefault("ActiveState", "unknown")
    return state


def state_dir_of(layout: Layout, worker_id: str) -> Path:
    env_file = layout.env_file(worker_id)
    try:
        values = parse_env_file(env_file.read_text(encoding="utf-8"))
    except OSError:
        values = {}
    if values.get("MMT_WORKER_STATE_DIR"):
        path = Path(values["MMT_WORKER_STATE_DIR"])
        return Path(SYSTEM_ROOT) / path.relative_to("/") if layout.system and path.is_absolute() else path
    return layout.state_dir(worker_id)


def package_spec(version: str | None, spec: str | None) -> str:
    if bool(version) == bool(spec):
        raise InstallError("Give exactly one of --version (for example 0.2.0), --package-spec (a path, wheel or "
                           "requirement such as \"$HOME/mado-ml-tracking[telemetry]\") or --from-server (the "
                           "version the worker's server offers).")
    if version:
        return f"mado-tracking[telemetry]=={version}"
    return spec
