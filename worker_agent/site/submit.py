"""`mado-tracking submit`: submit your Jobs that wait on a manual site, from that site's login node or
your own PC (docs/sites-protocol.md, "Manual submission"; seed 003).

Each round claims the waiting Jobs (your own; `--all`: everyone's in the token's project, the
computer's owner only), writes their spec directories here, runs each submission's `script` with bash
(the rendered job shell; the last stdout line is the scheduler id) and reports how it went. A report
is written to `~/.local/state/mado-tracking/submit/<siteId>/pending/` before it is sent and removed
once the server has it, so one that cannot be delivered is sent first on the next run.

Exit status: 0 every submission went through; 1 a submission failed; 2 a configuration or API error
(also a report kept for later); 130 interrupted. The first Ctrl-C lets the round finish (the Jobs
already claimed are submitted and reported) and ends there; a second one stops at once."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from worker_agent.api import ApiError, ApiUnavailable, FatalApiError
from worker_agent.site.launcher import Outcome, PendingReports, SiteApi, outcome_of
from worker_agent.site.spec import SpecError, write_local
from worker_agent.ssh import RunResult

EXIT_OK, EXIT_FAILED, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130
SCRIPT_SECONDS = 300.0
VARIABLE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")


class SubmitError(Exception):
    """A configuration or API problem: the message says what to do; exit 2."""


def state_dir(site_id: int) -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "mado-tracking" / "submit" / str(int(site_id))


def parse_vars(values) -> dict[str, str]:
    variables = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not VARIABLE_NAME.fullmatch(name):
            raise SubmitError(f"--var {item!r}: write NAME=VALUE, the name a letter then letters, digits or _ "
                              "(for example --var GROUP=lab01).")
        variables[name] = value
    return variables


@dataclass
class Settings:
    site: int
    everyone: bool = False
    watch: bool = False
    dry_run: bool = False
    interval: float = 10.0
    limit: int | None = None
    work_dir: str | None = None
    variables: dict[str, str] = field(default_factory=dict)

    def claim_body(self) -> dict:
        body: dict = {"all": self.everyone}
        if self.limit:
            body["limit"] = self.limit
        if self.work_dir:
            body["work_dir"] = self.work_dir
        if self.variables:
            body["variables"] = self.variables
        return body


class Interrupts:
    """SIGINT: the first asks the round to be the last, the second raises KeyboardInterrupt."""

    def __init__(self, say):
        self.count = 0
        self._say = say

    def __call__(self, signum, frame):
        self.count += 1
        if self.count == 1:
            self._say("Interrupted: finishing this round (the Jobs already claimed are submitted and reported). "
                      "Press Ctrl-C again to stop at once.")
            return
        raise KeyboardInterrupt

    def install(self):
        return signal.signal(signal.SIGINT, self)


def explain(exc: ApiError, settings: Settings) -> str:
    """A server refusal as a sentence that says what to do."""
    if exc.code == "site_owner_required":
        return ("--all submits everyone's waiting Jobs, so only the computer's owner may use it (403 "
                "site_owner_required). Run it without --all to submit your own Jobs; the owner can submit the rest.")
    if exc.code == "job_token_forbidden" or (exc.status == 403 and exc.code == "job_token"):
        return ("A job token cannot submit Jobs (403). Use your own API token with jobs:write (Project settings → "
                "Project tokens) in MMT_API_TOKEN.")
    if exc.status == 403:
        return (f"{exc} (403) Use your own API token with the scopes read and jobs:write of the project the Jobs "
                "belong to.")
    if exc.status == 404:
        return (f"{exc} (404) Check --site {settings.site}: it is the Computer ID in the computer's details, and the "
                "computer must be one you can use.")
    if exc.code == "site_not_manual":
        return f"{exc} (409)"
    return f"{exc}" + (f" ({exc.status})" if exc.status else "")


class Submitter:
    def __init__(self, api: SiteApi, settings: Settings, *, say, warn, interrupts: Interrupts | None = None,
                 pending: PendingReports | None = None):
        self.api = api
        self.settings = settings
        self.say = say
        self.warn = warn
        self.interrupts = interrupts or Interrupts(warn)
        self.pending = pending or PendingReports(state_dir(settings.site) / "pending")
        self.kept = 0

    @property
    def base(self) -> str:
        return f"sites/{int(self.settings.site)}"

    # -- the whole run ---------------------------------------------------------------------------

    def run(self) -> int:
        try:
            self.resend()
            if self.settings.dry_run:
                self.dry_run()
                return EXIT_OK
            return self.rounds()
        except KeyboardInterrupt:
            self.warn("Stopped. Claimed Jobs that were not submitted return to waiting in at most 15 minutes "
                      "(they end as submit_failed).")
            return EXIT_INTERRUPTED
        except FatalApiError as exc:
            self.warn(str(exc))
            return EXIT_ERROR
        except ApiUnavailable as exc:
            self.warn(f"{exc} Nothing more was submitted; run it again once the server answers.")
            return EXIT_ERROR
        except ApiError as exc:
            self.warn(explain(exc, self.settings))
            return EXIT_ERROR
        except SubmitError as exc:
            self.warn(str(exc))
            return EXIT_ERROR

    def resend(self) -> None:
        sent, kept = self.pending.resend(self.api)
        if sent:
            self.say(f"Sent {sent} report(s) kept from an earlier run.")
        if kept:
            raise ApiUnavailable(f"{kept} report(s) from an earlier run are still kept in {self.pending.dir}: the "
                                 "server could not take them now.")

    def dry_run(self) -> None:
        info = self.api.request("GET", f"{self.base}/submit?all={1 if self.settings.everyone else 0}", attempts=2)
        if self.settings.everyone and not info.get("can_all"):
            raise SubmitError(explain(ApiError("", status=403, code="site_owner_required"), self.settings))
        self.say(f"Computer {info.get('computer')} ({info.get('name')}): {info.get('waiting', 0)} of your Jobs wait "
                 "for manual submission" + (f"; {info['waiting_all']} in the project with --all"
                                             if info.get("waiting_all") is not None else "") + ".")
        self.say(f"Job shell version: {info.get('job_shell_version') or 'none (the owner has not saved one)'}")
        work_dir = self.settings.work_dir or info.get("working_dir")
        self.say(f"Working directory: {work_dir}" + (" (--work-dir)" if self.settings.work_dir else ""))
        variables = dict(info.get("variables") or {})
        variables.update(self.settings.variables)
        self.say("Variables: " + (" ".join(f"{k}={v}" for k, v in variables.items()) or "none"))
        limit = self.settings.limit or "the computer's free capacity"
        whose = "everyone's" if self.settings.everyone else "your own"
        self.say(f"Each round submits up to {limit}, {whose} Jobs.")
        self.say("Nothing was submitted (--dry-run).")

    def rounds(self) -> int:
        failed_any = False
        if self.settings.watch:
            self.say(f"Watching computer {self.settings.site} every {self.settings.interval:g} s; Ctrl-C stops.")
        while True:
            try:
                failed_any |= self.round()
            except ApiUnavailable as exc:
                if not self.settings.watch:
                    raise
                self.warn(f"{exc} Trying again in {self.settings.interval:g} s.")
            if not self.settings.watch or self.interrupts.count:
                break
            deadline = time.monotonic() + self.settings.interval
            while time.monotonic() < deadline and not self.interrupts.count:
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            if self.interrupts.count:
                break
        if self.interrupts.count:
            return EXIT_INTERRUPTED
        if self.kept:
            self.warn(f"{self.kept} report(s) could not be delivered; they are kept in {self.pending.dir} and sent "
                      "first next time.")
            return EXIT_ERROR
        return EXIT_FAILED if failed_any else EXIT_OK

    # -- one round -------------------------------------------------------------------------------

    def round(self) -> bool:
        """Claim, submit and report once. True when a submission failed."""
        data = self.api.request("POST", f"{self.base}/submissions/claim", self.settings.claim_body(), attempts=1)
        items = list(data.get("items") or [])
        if not items and not self.settings.watch:
            self.say(f"No Jobs wait for manual submission on computer {self.settings.site}.")
        failed = False
        for submission in items:
            outcome = self.submit(submission)
            failed |= outcome.outcome != "submitted"
            self.report(submission, outcome)
        return failed

    def submit(self, submission: dict) -> Outcome:
        secrets = [j.get("token") for j in submission.get("jobs") or []] + [self.api._token]
        try:
            write_local(submission)
        except SpecError as exc:
            return Outcome("failed", error=str(exc))
        result = run_local(submission["script"], submission.get("working_dir"))
        return outcome_of(result, secrets)

    def report(self, submission: dict, outcome: Outcome) -> None:
        job_ids = submission.get("job_ids") or [j["id"] for j in submission.get("jobs") or []]
        shown = ", ".join(map(str, job_ids))
        noun = "Job" if len(job_ids) == 1 else "Jobs"
        if outcome.outcome == "submitted":
            self.say(f"{noun} {shown}: submitted" + (f" as scheduler job {outcome.scheduler_job_id}."
                                                     if outcome.scheduler_job_id else " (no scheduler id)."))
        else:
            self.warn(f"{noun} {shown}: submission failed:\n{outcome.error}")
        answer = self.pending.deliver(self.api, f"{self.base}/submissions/report", outcome.body(job_ids))
        if answer is None:
            self.kept += 1


def _clean_env() -> dict[str, str]:
    """This environment without Mado's own variables: the script exports the ones it needs, and the
    caller's API token has no business in a job shell."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MMT_")}


def run_local(script: str, working_dir: str | None, timeout: float = SCRIPT_SECONDS) -> RunResult:
    """Run the script with `bash -s` in its own session, so the first Ctrl-C in the terminal does not
    reach the scheduler command it runs; a second Ctrl-C (KeyboardInterrupt) ends it."""
    cwd = working_dir if working_dir and os.path.isdir(working_dir) else os.path.expanduser("~")
    try:
        proc = subprocess.Popen(["bash", "-s"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=cwd, env=_clean_env(), start_new_session=True)
    except OSError as exc:
        return RunResult(127, b"", f"Cannot run bash: {exc.strerror or exc}".encode())
    try:
        out, err = proc.communicate(script.encode("utf-8"), timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return RunResult(124, b"", f"The job shell did not finish within {timeout:.0f} s.".encode())
    except BaseException:
        _kill(proc)
        raise
    return RunResult(proc.returncode, out, err)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    proc.wait()
