"""`mado-tracking-worker`: run, install, upgrade, status, doctor.

Every option can also come from an `MMT_…` environment variable. The token is never an argument:
it comes from MMT_API_TOKEN / MMT_API_TOKEN_FILE (run) or --token-file, a hidden prompt or standard
input (install). Every error says what to do next and exits non-zero."""
from __future__ import annotations

import getpass
import json
import logging
import os
import re
import sys
from pathlib import Path

import click
import requests

from worker_agent import __version__
from worker_agent import install as inst
from worker_agent.api import ApiClient, ApiError, FatalApiError
from worker_agent.config import (
    ConfigError,
    WorkerConfig,
    parse_target_ids,
    read_token_file,
    validate_api_url,
    validate_token,
    validate_worker_id,
)
from worker_agent.doctor import run_doctor
from worker_agent.journal import StateDir, StateDirError, is_locked, lock_holder
from worker_agent.text import mask_tokens

EXIT_STOPPED = 3


class Fail(click.ClickException):
    exit_code = 1


def _runner(ctx: click.Context):
    obj = ctx.obj if isinstance(ctx.obj, dict) else {}
    return obj.get("runner") or inst.Runner()


def setup_logging(level: str) -> None:
    """Agent logs on stderr; paramiko's and urllib3's chatter only from warnings up."""
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("paramiko").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.WARNING)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="mado-tracking-worker")
def main() -> None:
    """Run Mado Compute jobs, connection checks and directory reads on SSH and Local computers."""


# -- run -------------------------------------------------------------------------------------------

@main.command()
@click.option("--once", is_flag=True, envvar="MMT_WORKER_ONCE",
              help="Announce the worker, handle the check and the read waiting now, and exit.")
@click.option("--api-url", envvar="MMT_API_URL", help="Address of the Mado server. [MMT_API_URL]")
@click.option("--worker-id", envvar="MMT_WORKER_ID", help="This worker's name. [MMT_WORKER_ID]")
@click.option("--target-ids", envvar="MMT_WORKER_TARGET_IDS",
              help="Computer ids this worker serves, comma-separated. [MMT_WORKER_TARGET_IDS]")
@click.option("--state-dir", envvar="MMT_WORKER_STATE_DIR", help="Records of running jobs. [MMT_WORKER_STATE_DIR]")
@click.option("--token-file", envvar="MMT_API_TOKEN_FILE",
              help="File holding the worker token (or set MMT_API_TOKEN). [MMT_API_TOKEN_FILE]")
@click.option("--log-level", envvar="MMT_LOG_LEVEL", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]), help="[MMT_LOG_LEVEL]")
def run(once, api_url, worker_id, target_ids, state_dir, token_file, log_level):
    """Run the worker in the foreground (systemd starts this)."""
    from worker_agent.loop import Worker

    env = dict(os.environ)
    for name, value in (("MMT_API_URL", api_url), ("MMT_WORKER_ID", worker_id), ("MMT_WORKER_TARGET_IDS", target_ids),
                        ("MMT_WORKER_STATE_DIR", state_dir), ("MMT_API_TOKEN_FILE", token_file)):
        if value is not None:
            env[name] = value
    if token_file:
        env.pop("MMT_API_TOKEN", None)
    try:
        config = WorkerConfig.from_env(env)
    except ConfigError as exc:
        raise Fail(str(exc)) from None
    state = StateDir(config.state_dir)
    try:
        state.ensure()
        state.lock()
    except StateDirError as exc:
        raise Fail(str(exc)) from None
    setup_logging(log_level)
    worker = Worker(config)
    try:
        code = worker.run_once() if once else worker.run_forever()
    except ApiError as exc:
        raise Fail(f"{exc} The worker stopped; check that the server runs and start it again.") from None
    finally:
        state.unlock()
    if worker.fatal is not None:
        raise Fail(str(worker.fatal))
    sys.exit(code)


# -- install ---------------------------------------------------------------------------------------

def _read_token(token_file: str | None) -> str:
    if token_file:
        return read_token_file(token_file)
    stdin = sys.stdin
    if stdin.isatty():
        return getpass.getpass("Worker API token (not shown): ")
    return stdin.readline().strip()


def _verify_token(api_url: str, token: str) -> str | None:
    """None when the server accepts the token for a worker; a warning when it cannot be asked now.
    Raises ConfigError when the server says the token cannot work."""
    try:
        with ApiClient(api_url, token, attempts=1) as client:
            info = client.token_info()
    except FatalApiError:
        raise ConfigError("The API server rejects this token (401): it is unknown, expired or revoked, or its service "
                          "account is disabled. Issue a new worker token and run install again.") from None
    except ApiError as exc:
        return (f"The token could not be verified now ({exc}). The worker will keep trying; run "
                "`mado-tracking-worker doctor` once the server is reachable.")
    if info.get("kind") == "job":
        raise ConfigError("This is a job token: issue a worker token for a service account instead.")
    missing = [s for s in ("read", "worker:execute") if s not in (info.get("scopes") or [])]
    if missing:
        raise ConfigError(f"This token lacks the scope(s) {', '.join(missing)}. Issue a token for an admin-role "
                          "service account with read, worker:execute and artifacts:write.")
    return None


@main.command()
@click.option("--api-url", envvar="MMT_API_URL", help="Address of the Mado server. [MMT_API_URL]")
@click.option("--worker-id", envvar="MMT_WORKER_ID",
              help="This worker's name: letters, digits, '.', '_', '-', up to 64. [MMT_WORKER_ID]")
@click.option("--target-ids", envvar="MMT_WORKER_TARGET_IDS", default="",
              help="Computer ids this worker serves, comma-separated. [MMT_WORKER_TARGET_IDS]")
@click.option("--state-dir", envvar="MMT_WORKER_STATE_DIR", help="Records of running jobs. [MMT_WORKER_STATE_DIR]")
@click.option("--token-file", envvar="MMT_API_TOKEN_FILE",
              help="Read the token from this file instead of a prompt or standard input. [MMT_API_TOKEN_FILE]")
@click.option("--systemd-system", is_flag=True, envvar="MMT_SYSTEMD_SYSTEM",
              help="Install a system unit (run as root) instead of a user unit. [MMT_SYSTEMD_SYSTEM]")
@click.option("--service-user", envvar="MMT_SERVICE_USER",
              help="User the system unit runs as (with --systemd-system). [MMT_SERVICE_USER]")
@click.pass_context
def install(ctx, api_url, worker_id, target_ids, state_dir, token_file, systemd_system, service_user):
    """Write the env file and the systemd unit, then enable and start the worker."""
    runner = _runner(ctx)
    try:
        if not api_url:
            raise ConfigError("Give --api-url, the address of the Mado server (for example "
                              "https://tracking.example.internal).")
        if not worker_id:
            raise ConfigError("Give --worker-id, a name for this worker (for example the host name, gpu-host-1).")
        api_url = validate_api_url(api_url)
        worker_id = validate_worker_id(worker_id)
        ids = parse_target_ids(target_ids)
        layout = inst.layout_for(systemd_system)
        if systemd_system:
            if not service_user:
                raise ConfigError("--systemd-system needs --service-user: the user the worker runs as (its ~/.ssh "
                                  "holds the keys).")
            if os.geteuid() != 0:
                raise ConfigError("A system unit is installed as root: run this again with sudo.")
            inst.service_account_ids(service_user)
        elif service_user:
            raise ConfigError("--service-user goes with --systemd-system; a user unit runs as you.")
        state = Path(state_dir) if state_dir else layout.state_dir(worker_id)
        if systemd_system and not state_dir:
            state = Path("/var/lib/mado-tracking-worker") / worker_id
        if not state.is_absolute():
            raise ConfigError(f"--state-dir must be an absolute path (got {state_dir!r}).")
        inst.check_env_value("MMT_WORKER_STATE_DIR", str(state))
        token = validate_token(_read_token(token_file))
        warning = _verify_token(api_url, token)
    except (ConfigError, inst.InstallError) as exc:
        raise Fail(mask_tokens(str(exc)) + " Nothing was written.") from None

    plan = inst.InstallPlan(layout=layout, api_url=api_url, worker_id=worker_id,
                            target_ids=",".join(str(i) for i in ids or []), state_dir=state, token=token,
                            python=sys.executable, service_user=service_user)
    try:
        inst.write_install(plan)
    except (OSError, inst.InstallError) as exc:
        raise Fail(f"Could not write the worker's files: {exc}. Fix the permissions and run install again.") from None
    if warning:
        click.echo(f"Warning: {warning}", err=True)
    click.echo(f"Wrote {plan.env_file} (mode 600) and {layout.unit_file}.")
    click.echo(f"State directory: {state}")
    problems = inst.start_unit(layout, worker_id, runner)
    if problems:
        raise Fail(" ".join(problems))
    unit = inst.unit_instance(worker_id)
    scope = "" if systemd_system else "--user "
    click.echo(f"Started {unit}. Follow it with: journalctl {scope}-u {unit} -f")
    if not systemd_system:
        hint = inst.linger_hint(runner, getpass.getuser())
        if hint:
            click.echo(hint)


# -- upgrade ---------------------------------------------------------------------------------------

@main.command()
@click.option("--worker-id", envvar="MMT_WORKER_ID", help="The installed worker. [MMT_WORKER_ID]")
@click.option("--version", "version", envvar="MMT_UPGRADE_VERSION",
              help="Install this version of mado-tracking from the package index. [MMT_UPGRADE_VERSION]")
@click.option("--package-spec", envvar="MMT_UPGRADE_PACKAGE_SPEC",
              help="Install this pip argument instead (a checkout path with [telemetry], a wheel). "
                   "[MMT_UPGRADE_PACKAGE_SPEC]")
@click.option("--from-server", is_flag=True, envvar="MMT_UPGRADE_FROM_SERVER",
              help="Install the version the worker's server offers at <API URL>/downloads/ (the API URL the "
                   "worker was installed with), checking its sha256. [MMT_UPGRADE_FROM_SERVER]")
@click.option("--systemd-system", is_flag=True, envvar="MMT_SYSTEMD_SYSTEM", help="The worker is a system unit.")
@click.pass_context
def upgrade(ctx, worker_id, version, package_spec, from_server, systemd_system):
    """Install a new agent into the unit's venv, then restart the unit (running jobs keep running)."""
    runner = _runner(ctx)
    try:
        if not worker_id:
            raise ConfigError("Give --worker-id, the id the worker was installed with.")
        worker_id = validate_worker_id(worker_id)
        if from_server and (version or package_spec):
            raise ConfigError("Give --from-server alone, or one of --version and --package-spec: not both.")
        if not from_server:
            spec = inst.package_spec(version, package_spec)
        layout = inst.layout_for(systemd_system)
        python = inst.read_unit_python(layout.unit_file)
        if from_server:
            spec = _server_package_spec(layout.env_file(worker_id))
    except (ConfigError, inst.InstallError) as exc:
        raise Fail(str(exc)) from None
    unit = inst.unit_instance(worker_id)
    state = inst.unit_state(layout, worker_id, runner)
    state_dir = inst.state_dir_of(layout, worker_id)
    if state.get("ActiveState") != "active" and is_locked(state_dir):
        pid = lock_holder(state_dir)
        raise Fail(f"{unit} is not running, but a worker started by hand{f' (pid {pid})' if pid else ''} is using "
                   f"{state_dir}. Stop that worker first, then run upgrade again. Nothing was changed.")
    click.echo(f"Installing {spec} into the unit's Python {python} …")
    pip = runner.run([python, "-m", "pip", "install", "--upgrade", "--disable-pip-version-check", spec])
    if pip.returncode != 0:
        tail = "\n".join((pip.stderr or pip.stdout or "").strip().splitlines()[-5:])
        raise Fail(f"pip failed, so {unit} was not restarted (the running worker is untouched):\n{tail}\n"
                   "Fix the package source and run upgrade again.")
    restart = runner.run(layout.systemctl("restart", unit))
    if restart.returncode != 0:
        raise Fail(f"The new version is installed but `{' '.join(layout.systemctl('restart', unit))}` failed: "
                   f"{(restart.stderr or '').strip()[:200]}. Start it by hand, then check `mado-tracking-worker "
                   f"status --worker-id {worker_id}`.")
    click.echo(f"Upgraded and restarted {unit}. Running jobs were not stopped.")


WHEEL_NAME = re.compile(r"mado_tracking-[A-Za-z0-9_.!+]+-py3-none-any\.whl")


def _server_package_spec(env_file: Path) -> str:
    """`mado-tracking[telemetry] @ <API URL>/downloads/<wheel>#sha256=<hex>` from the server's
    /downloads/latest.json, at the API URL the worker was installed with. pip checks the downloaded wheel
    against the sha256 in the fragment, so a file that changed on the way is refused."""
    try:
        api_url = validate_api_url(inst.parse_env_file(env_file.read_text(encoding="utf-8")).get("MMT_API_URL", ""))
    except OSError as exc:
        raise inst.InstallError(f"Cannot read {env_file} ({exc.strerror}), which holds the worker's API URL: run "
                                "`mado-tracking-worker install` again, or give --package-spec.") from None
    except ConfigError as exc:
        raise inst.InstallError(f"{env_file}: {exc} Run `mado-tracking-worker install` again.") from None
    url = f"{api_url}/downloads/latest.json"
    try:
        response = requests.get(url, timeout=(10, 60), headers={
            "Accept": "application/json", "User-Agent": f"mado-tracking-worker/{__version__}"})
    except requests.RequestException as exc:
        raise inst.InstallError(f"Cannot reach {url} ({type(exc).__name__}). Check that the server is running and "
                                f"MMT_API_URL in {env_file}; nothing was changed.") from None
    try:
        answer = response.json()
    except ValueError:
        answer = {}
    if response.status_code != 200:
        reason = answer.get("error") if isinstance(answer, dict) else None
        raise inst.InstallError(f"{url} answered {response.status_code}"
                                f"{': ' + str(reason).rstrip('.') if reason else ''}. Nothing was changed.")
    wheel = answer.get("wheel") if isinstance(answer, dict) else None
    if not (isinstance(wheel, dict) and WHEEL_NAME.fullmatch(str(wheel.get("filename", "")))
            and re.fullmatch(r"[0-9a-f]{64}", str(wheel.get("sha256", "")))):
        raise inst.InstallError(f"{url} does not describe a mado-tracking wheel (is {api_url} a Mado Compute "
                                "server?). Nothing was changed.")
    click.echo(f"The server offers mado-tracking {answer.get('version', '?')} ({wheel['filename']}).")
    return f"mado-tracking[telemetry] @ {api_url}/downloads/{wheel['filename']}#sha256={wheel['sha256']}"


# -- status ----------------------------------------------------------------------------------------

@main.command()
@click.option("--worker-id", envvar="MMT_WORKER_ID", help="The worker. [MMT_WORKER_ID]")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--systemd-system", is_flag=True, envvar="MMT_SYSTEMD_SYSTEM", help="The worker is a system unit.")
@click.option("--state-dir", envvar="MMT_WORKER_STATE_DIR", help="State directory, if not the installed one.")
@click.pass_context
def status(ctx, worker_id, as_json, systemd_system, state_dir):
    """The unit's state, the worker's lock and the jobs it holds. Exit 0 when running, 3 when stopped."""
    runner = _runner(ctx)
    if not worker_id:
        raise Fail("Give --worker-id, the id the worker was installed with.")
    try:
        worker_id = validate_worker_id(worker_id)
    except ConfigError as exc:
        raise Fail(str(exc)) from None
    layout = inst.layout_for(systemd_system)
    unit = inst.unit_instance(worker_id)
    state = inst.unit_state(layout, worker_id, runner)
    path = Path(state_dir) if state_dir else inst.state_dir_of(layout, worker_id)
    locked = is_locked(path)
    jobs = StateDir(path).job_records()
    running = state.get("ActiveState") == "active" or locked
    if as_json:
        click.echo(json.dumps({
            "worker_id": worker_id, "unit": unit, "active_state": state.get("ActiveState"),
            "sub_state": state.get("SubState"), "main_pid": state.get("MainPID"), "state_dir": str(path),
            "lock_held": locked, "lock_pid": lock_holder(path) if locked else None, "jobs": jobs, "running": running,
        }))
    else:
        active = state.get("ActiveState", "unknown")
        detail = f" ({state['SubState']})" if state.get("SubState") else ""
        reason = f" — {state['reason']}" if state.get("reason") else ""
        click.echo(f"unit:       {unit}: {active}{detail}{reason}")
        if locked:
            pid = lock_holder(path)
            click.echo(f"lock:       held{f' by pid {pid}' if pid else ''} ({path})")
        else:
            click.echo(f"lock:       free ({path})")
        click.echo(f"jobs:       {len(jobs)} retained")
        if not running:
            scope = "" if systemd_system else "--user "
            click.echo(f"The worker is stopped. Start it with: systemctl {scope}start {unit}")
    sys.exit(0 if running else EXIT_STOPPED)


# -- doctor ----------------------------------------------------------------------------------------

@main.command()
@click.option("--worker-id", envvar="MMT_WORKER_ID", help="Check the env file install wrote for this id.")
@click.option("--systemd-system", is_flag=True, envvar="MMT_SYSTEMD_SYSTEM", help="The worker is a system unit.")
@click.option("--state-dir", envvar="MMT_WORKER_STATE_DIR", help="State directory, if not the installed one.")
@click.option("--ssh-key", "ssh_keys", multiple=True, envvar="MMT_DOCTOR_SSH_KEYS",
              help="A private key a computer uses (repeatable).")
@click.option("--known-hosts", "known_hosts", multiple=True, envvar="MMT_DOCTOR_KNOWN_HOSTS",
              help="A known_hosts file a computer uses (repeatable).")
def doctor(worker_id, systemd_system, state_dir, ssh_keys, known_hosts):
    """Check the env file, state directory, API, token scopes and SSH files. Exit 1 on any error."""
    if worker_id:
        try:
            worker_id = validate_worker_id(worker_id)
        except ConfigError as exc:
            raise Fail(str(exc)) from None
    report = run_doctor(layout=inst.layout_for(systemd_system), worker_id=worker_id, env=dict(os.environ),
                        state_dir=state_dir, keys=list(ssh_keys), known_hosts=list(known_hosts))
    click.echo(mask_tokens(report.render()))
    if report.errors:
        click.echo(f"{report.errors} problem(s) found: fix the lines marked error and run doctor again.", err=True)
        sys.exit(1)
    click.echo("No problems found.")
