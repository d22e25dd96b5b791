"""Command lines of the sites agent.

- `mado-tracking-launcher run [--once]`: the launcher (worker_agent.site.launcher). Every option can
  come from an `MMT_…` variable; the token only from MMT_API_TOKEN or a file (MMT_API_TOKEN_FILE),
  never an argument. Its state directory (700) holds the keys (600) and the reports not yet delivered.
- `mado-tracking submit` and `mado-tracking runner`, which worker_agent.researcher registers.

Errors say what to do next and exit non-zero. Heavy imports (paramiko) wait until a command runs, so
`mado-tracking --help` stays fast."""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import signal
import sys
from pathlib import Path

import click

from worker_agent import __version__
from worker_agent.cli import setup_logging
from worker_agent.text import API_TOKEN_RE, JOB_TOKEN_PREFIXES, job_token_prefix, mask_tokens

EXIT_CONFIG = 2


class Fail(click.ClickException):
    exit_code = 1


class ConfigFail(click.ClickException):
    exit_code = EXIT_CONFIG


def _token(token_file: str | None, *, who: str) -> str:
    from worker_agent.config import ConfigError, read_token_file

    if token_file:
        token = read_token_file(token_file)
    else:
        token = os.environ.get("MMT_API_TOKEN", "").strip()
    if not token:
        raise ConfigError(f"Set MMT_API_TOKEN, or MMT_API_TOKEN_FILE to a file holding {who}.")
    if token.startswith(JOB_TOKEN_PREFIXES):
        raise ConfigError(f"This is a job token ({job_token_prefix(token)}…), which belongs to one running Job: "
                          f"use {who}.")
    if not API_TOKEN_RE.fullmatch(token):
        raise ConfigError("The token is not valid: it starts with mmt_ followed by letters, digits, '-' and '_'. "
                          "Copy it again from the page that showed it once, or issue a new one.")
    return token


def _api_url(value: str | None) -> str:
    from worker_agent.config import ConfigError, validate_api_url

    if not value:
        raise ConfigError("Set MMT_API_URL (or --api-url) to the address of the Mado server, for example "
                          "https://tracking.example.org.")
    return validate_api_url(value)


# -- mado-tracking-launcher ------------------------------------------------------------------------

@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="mado-tracking-launcher")
def main() -> None:
    """Log in to automatic sites over SSH and submit their Jobs to the site's scheduler."""


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "mado-tracking-launcher"


def _lock(state_dir: Path) -> int:
    fd = os.open(state_dir / "launcher.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise Fail(f"Another launcher already uses the state directory {state_dir}. Stop it first, or give this "
                       "one its own MMT_LAUNCHER_STATE_DIR.") from None
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


@main.command()
@click.option("--once", is_flag=True, envvar="MMT_LAUNCHER_ONCE",
              help="Do one round (reports, keys, checks, cancellations, submissions) and exit. [MMT_LAUNCHER_ONCE]")
@click.option("--api-url", envvar="MMT_API_URL", help="Address of the Mado server. [MMT_API_URL]")
@click.option("--token-file", envvar="MMT_API_TOKEN_FILE",
              help="File holding the launcher token (or set MMT_API_TOKEN). [MMT_API_TOKEN_FILE]")
@click.option("--state-dir", envvar="MMT_LAUNCHER_STATE_DIR",
              help="Keys and undelivered reports (mode 700). Default: $XDG_STATE_HOME/mado-tracking-launcher. "
                   "[MMT_LAUNCHER_STATE_DIR]")
@click.option("--long-poll", envvar="MMT_LAUNCHER_LONG_POLL", default=20, show_default=True,
              type=click.IntRange(0, 30), help="Seconds the server may hold an idle config poll. "
                                               "[MMT_LAUNCHER_LONG_POLL]")
@click.option("--log-level", envvar="MMT_LOG_LEVEL", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]), help="[MMT_LOG_LEVEL]")
def run(once, api_url, token_file, state_dir, long_poll, log_level):
    """Run the launcher in the foreground (SIGTERM stops it after the current step)."""
    from worker_agent.api import ApiError, FatalApiError
    from worker_agent.config import ConfigError
    from worker_agent.site.launcher import Launcher, SiteApi, Stopped, ensure_private_dir

    try:
        url = _api_url(api_url)
        token = _token(token_file, who="the launcher token (Global administration → Launchers)")
        path = Path(state_dir) if state_dir else default_state_dir()
        if not path.is_absolute():
            raise ConfigError(f"MMT_LAUNCHER_STATE_DIR must be an absolute path (got {str(path)!r}).")
        ensure_private_dir(path)
    except ConfigError as exc:
        raise Fail(mask_tokens(str(exc))) from None
    except OSError as exc:
        raise Fail(f"The state directory cannot be used: {exc.strerror or exc}.") from None
    lock = _lock(path)
    setup_logging(log_level)
    launcher = Launcher(SiteApi(url, token), path, long_poll=long_poll)

    def on_signal(signum, frame):
        logging.getLogger("mado.launcher").info("%s: stopping after the current step",
                                                signal.Signals(signum).name)
        launcher.stop.set()
        if launcher.waiting:
            raise Stopped()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        launcher.run_once() if once else launcher.run_forever()
    except Stopped:
        pass
    except FatalApiError as exc:
        raise Fail(f"{exc} The launcher stopped.") from None
    except ApiError as exc:
        raise Fail(f"{exc} Check that the server runs, then start the launcher again.") from None
    finally:
        launcher.close()
        os.close(lock)


# -- mado-tracking submit / runner (registered by worker_agent.researcher) --------------------------

@click.command("submit")
@click.option("--site", "site", required=True, type=click.IntRange(1, None),
              help="The computer's ID (shown in its details).")
@click.option("--dry-run", is_flag=True, help="Show how many Jobs wait and the settings; submit nothing.")
@click.option("--watch", is_flag=True, help="Repeat every --interval seconds until Ctrl-C.")
@click.option("--all", "everyone", is_flag=True,
              help="Also submit other people's Jobs in the token's project (the computer's owner only).")
@click.option("--interval", default=10.0, show_default=True, type=click.FloatRange(1, 3600),
              help="Seconds between rounds with --watch.")
@click.option("--limit", type=click.IntRange(1, 50), help="At most this many Jobs per round (1–50).")
@click.option("--work-dir", type=click.Path(file_okay=False),
              help="Write the spec directories under this directory instead of the computer's working directory.")
@click.option("--var", "variables", multiple=True, metavar="NAME=VALUE",
              help="A variable for the job shell (MMT_VAR_NAME); repeat for more.")
@click.pass_context
def submit_command(ctx, site, dry_run, watch, everyone, interval, limit, work_dir, variables):
    """Submit your Jobs waiting on a manual site: run this on that computer (exit 0 ok, 1 a submission
    failed, 2 a configuration or API error, 130 interrupted)."""
    from worker_agent.config import ConfigError
    from worker_agent.site.launcher import SiteApi
    from worker_agent.site.submit import Interrupts, Settings, SubmitError, Submitter, parse_vars

    if dry_run and watch:
        raise ConfigFail("Choose --dry-run or --watch, not both.")
    root = ctx.find_root().obj if isinstance(ctx.find_root().obj, dict) else {}
    try:
        url = _api_url(root.get("api_url") or os.environ.get("MMT_API_URL"))
        token = _token(root.get("token_file") or os.environ.get("MMT_API_TOKEN_FILE"),
                       who="your own API token with jobs:write (Project settings → Project tokens)")
        settings = Settings(site=site, everyone=everyone, watch=watch, dry_run=dry_run, interval=interval,
                            limit=limit, variables=parse_vars(variables),
                            work_dir=os.path.abspath(os.path.expanduser(work_dir)) if work_dir else None)
    except (ConfigError, SubmitError) as exc:
        raise ConfigFail(mask_tokens(str(exc))) from None

    def say(text):
        click.echo(mask_tokens(text, token))

    def warn(text):
        click.echo(mask_tokens(text, token), err=True)

    interrupts = Interrupts(warn)
    previous = interrupts.install()
    api = SiteApi(url, token, agent="submit", attempts=3)
    try:
        code = Submitter(api, settings, say=say, warn=warn, interrupts=interrupts).run()
    finally:
        signal.signal(signal.SIGINT, previous)
        api.close()
    ctx.exit(code)


@click.command("runner")
@click.argument("spec_dir", type=click.Path(file_okay=False))
def runner_command(spec_dir):
    """Run one Job from its spec directory on a compute node (the job shell starts this)."""
    from worker_agent.site.runner import main as runner_main

    sys.exit(runner_main([spec_dir]))
