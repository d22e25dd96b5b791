"""The launcher (`mado-tracking-launcher run`): logs in to automatic sites and submits their Jobs
(docs/sites-protocol.md, "Launcher endpoints"; REFERENCE §5).

One round, every 10 s (the config call long-polls while there is nothing to do):

1. resend the reports a crash or an outage left in `<state dir>/pending/`;
2. `GET /api/launcher/config`;
3. keys: an ed25519 key per site (shared account) or per (site, person) (personal accounts); the
   public key is published when the server does not list its fingerprint;
4. connection checks: a fresh connection, `true`, 60 s, reported ok or with the reason;
5. cancellations: the rendered cancel script over SSH (`bash -s`), reported;
6. for each enabled site with claimable Jobs: claim (limit = the site's capacity), write the spec
   directories over SSH, run the submit script, report `submitted` with the scheduler id (the last
   stdout line) or `failed` with the last 1000 characters of stderr, tokens masked. A failed login
   makes the rest of that poll's submissions through the same login `not_tried`.

Every report is written to disk before it is sent and removed once the server has it, so a report
that cannot be delivered (or a launcher killed meanwhile) is sent again first next time. Nothing the
launcher logs or reports contains a token or a private key."""
from __future__ import annotations

import json
import logging
import os
import re
import socket
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from worker_agent import __version__
from worker_agent.text import TOKEN_RE
from worker_agent.api import ApiClient, ApiError, ApiUnavailable, FatalApiError
from worker_agent.journal import write_json_atomic
from worker_agent.site.keys import KeyFileError, KeyStore
from worker_agent.site.login import CommandTimeout, ConnectError, SiteLogin, SitePool, run_script
from worker_agent.site.spec import SpecError, write_remote
from worker_agent.ssh import RunResult
from worker_agent.text import mask_tokens

log = logging.getLogger("mado.launcher")

POLL_INTERVAL = 10.0
LONG_POLL = 20
CHECK_SECONDS = 60.0
SUBMIT_SECONDS = 300.0
CANCEL_SECONDS = 60.0
TAIL = 1000
MAX_LIMIT = 50
SCHEDULER_ID = re.compile(r"^[A-Za-z0-9][\[\]A-Za-z0-9._:-]{0,199}$")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


# -- what comes back from a job shell --------------------------------------------------------------

def mask_tail(text: str, secrets=(), limit: int = TAIL) -> str:
    """The last `limit` characters of a job shell's stderr, the given secrets and anything shaped like
    a token (mmt_…, mado_mtj_…, mmtj_…) replaced by ****, control characters other than newline and tab removed."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "****")
    text = TOKEN_RE.sub("****", text)
    return _CONTROL.sub("", text)[-limit:]


@dataclass
class Outcome:
    outcome: str  # submitted | failed | not_tried
    scheduler_job_id: str | None = None
    error: str | None = None

    def body(self, job_ids) -> dict:
        optional = {"scheduler_job_id": self.scheduler_job_id, "error": self.error}
        return {"job_ids": list(job_ids), "outcome": self.outcome, **{k: v for k, v in optional.items() if v}}


def outcome_of(result: RunResult, secrets=()) -> Outcome:
    """`submitted` with the last stdout line as the scheduler id (none for hosts without a scheduler),
    or `failed` with the stderr tail."""
    stderr = result.stderr.decode("utf-8", "replace")
    if result.exit_code != 0:
        tail = mask_tail(stderr, secrets).strip()
        return Outcome("failed", error=tail or f"The job shell exited with code {result.exit_code} and printed "
                                               "nothing on stderr.")
    lines = [line.strip() for line in result.stdout.decode("utf-8", "replace").splitlines() if line.strip()]
    if not lines:
        return Outcome("submitted")
    last = lines[-1]
    if len(last) > 200 or not SCHEDULER_ID.fullmatch(last):
        shown = mask_tail(last, secrets, limit=80)
        return Outcome("failed", error=f"The job shell's last stdout line is not a scheduler job id: {shown!r}. "
                                       "A job shell prints only the id on stdout; everything else goes to stderr.")
    return Outcome("submitted", scheduler_job_id=last)


# -- the API ---------------------------------------------------------------------------------------

class SiteApi(ApiClient):
    """worker_agent.api.ApiClient (retries, masking) with the launcher's and `submit`'s wording."""

    def __init__(self, api_url: str, token: str, *, agent: str = "launcher", **kwargs):
        super().__init__(api_url, token, **kwargs)
        self.agent = agent
        self.headers = {"User-Agent": f"mado-tracking-{agent}/{__version__}"}
        if agent == "launcher":
            self.headers.update({"X-Launcher-Hostname": socket.gethostname(), "X-Launcher-Version": __version__})

    @property
    def session(self):
        session = ApiClient.session.fget(self)
        session.headers.update(self.headers)
        return session

    def _answer(self, method, path, response):
        try:
            return super()._answer(method, path, response)
        except FatalApiError as exc:
            if self.agent == "launcher":
                raise FatalApiError("The API server rejected the launcher token (401): it is unknown, revoked or was "
                                    "recreated. Recreate it under Global administration → Launchers and update "
                                    "MMT_API_TOKEN_FILE.", status=401, code=exc.code, body=exc.body) from None
            raise FatalApiError("The API server rejected your token (401): it is unknown, expired or revoked. Issue a "
                                "personal token with jobs:write (Project settings → Project tokens) and set "
                                "MMT_API_TOKEN.", status=401, code=exc.code, body=exc.body) from None
        except ApiError as exc:
            if exc.status == 403 and self.agent == "launcher" and path.startswith("launcher/"):
                raise FatalApiError(f"{exc} (403) Give the launcher its own token from Global administration → "
                                    "Launchers.", status=403, code=exc.code, body=exc.body) from None
            raise

    # launcher endpoints
    def config(self, wait: int = 0) -> dict:
        wait = max(0, min(30, int(wait)))
        return self.request("GET", f"launcher/config?wait={wait}", read_timeout=wait + 30)

    def publish_key(self, computer: int, user: int | None, public_key: str) -> dict:
        return self.request("POST", "launcher/keys", {"computer": computer, "user": user, "public_key": public_key})

    def claim(self, computer: int, limit: int) -> list[dict]:
        # One attempt: a claim whose answer was lost comes back with `adopt: true` on the next one.
        data = self.request("POST", "launcher/submissions/claim", {"computer": computer, "limit": limit}, attempts=1)
        return list(data.get("items") or [])


# -- reports kept on disk ------------------------------------------------------------------------

def ensure_private_dir(path: Path) -> None:
    """Create `path` and missing parents with mode 700; refuse a link or another user's directory."""
    path = Path(path)
    missing = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        os.mkdir(directory, 0o700)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{path} must be a directory, not a link or a file: move it away")
    if st.st_uid != os.geteuid():
        raise OSError(f"{path} belongs to another user: use a directory of your own")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)


class PendingReports:
    """Reports not yet accepted by the server, one JSON file each (600), sent in the order made."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self._seq = 0
        self._lock = threading.Lock()

    def save(self, path: str, body: dict) -> Path:
        ensure_private_dir(self.dir)
        with self._lock:
            self._seq += 1
            name = f"{time.time_ns():020d}-{os.getpid()}-{self._seq}.json"
        file = self.dir / name
        write_json_atomic(file, {"path": path, "body": body})
        return file

    def files(self) -> list[Path]:
        return sorted(self.dir.glob("*.json")) if self.dir.is_dir() else []

    def deliver(self, api: ApiClient, path: str, body: dict, *, file: Path | None = None) -> dict | None:
        """Send one report, kept on disk until the server has it. The answer, or None when kept for
        later (server unreachable). A report the server refuses for good (4xx) is dropped with a log
        line: sending it again cannot succeed. 401/403 raise (the token is wrong; the file stays)."""
        file = file or self.save(path, body)
        try:
            answer = api.request("POST", path, body)
        except FatalApiError:
            raise
        except ApiUnavailable as exc:
            log.warning("report kept in %s to send again: %s", self.dir, exc)
            return None
        except ApiError as exc:
            log.warning("the server refused a report (%s %s), dropped: %s", exc.status, exc.code, exc)
            file.unlink(missing_ok=True)
            return {}
        file.unlink(missing_ok=True)
        return answer

    def resend(self, api: ApiClient) -> tuple[int, int]:
        """Send every kept report, oldest first; stops at the first one the server cannot take now.
        Returns (sent, still kept)."""
        files = self.files()
        sent = 0
        for index, file in enumerate(files):
            try:
                record = json.loads(file.read_text(encoding="utf-8"))
                path, body = record["path"], record["body"]
            except (OSError, ValueError, KeyError, TypeError):
                file.replace(file.with_name(file.name + ".unreadable"))
                log.error("an unreadable pending report was set aside as %s.unreadable", file.name)
                continue
            if self.deliver(api, path, body, file=file) is None:
                return sent, len(files) - index
            sent += 1
        return sent, 0


# -- the launcher ----------------------------------------------------------------------------------

class Stopped(Exception):
    """Raised by the SIGTERM handler while the launcher only waits (a long poll), to end the wait."""


class Launcher:
    def __init__(self, api: SiteApi, state_dir: Path, *, pool: SitePool | None = None,
                 stop: threading.Event | None = None, interval: float = POLL_INTERVAL, long_poll: int = LONG_POLL,
                 submit_seconds: float = SUBMIT_SECONDS):
        self.api = api
        self.state_dir = Path(state_dir)
        self.keys = KeyStore(self.state_dir)
        self.pending = PendingReports(self.state_dir / "pending")
        self.pool = pool or SitePool()
        self.stop = stop or threading.Event()
        self.interval = interval
        self.long_poll = long_poll
        self.submit_seconds = submit_seconds
        self.waiting = False  # True only inside the long poll, where SIGTERM may cut the wait short
        self._secrets = (api._token,)

    # -- the loop ----------------------------------------------------------------------------

    def run_once(self) -> None:
        self.round(wait=0)

    def run_forever(self) -> None:
        last = None
        while not self.stop.is_set():
            if last is not None:
                self.stop.wait(max(0.0, last + self.interval - time.monotonic()))
                if self.stop.is_set():
                    break
            try:
                self.round(wait=self.long_poll)
            except FatalApiError:
                raise
            except ApiError as exc:
                log.warning("%s Trying again in %.0f s.", exc, self.interval)
            except Stopped:
                break
            last = time.monotonic()

    def round(self, *, wait: int) -> dict:
        """One poll: pending reports, config, keys, checks, cancellations, submissions."""
        sent, kept = self.pending.resend(self.api)
        if sent or kept:
            log.info("pending reports: %d sent, %d kept", sent, kept)
        self.waiting = True
        try:
            if self.stop.is_set():
                raise Stopped()
            config = self.api.config(wait)
        finally:
            self.waiting = False
        sites = {int(s["computer"]): s for s in config.get("sites") or []}
        self.sync_keys(sites.values())
        failed_logins: dict[SiteLogin, str] = {}
        for check in config.get("checks") or []:
            if self.stop.is_set():
                return config
            self.answer_check(check, sites)
        for cancel in config.get("cancellations") or []:
            if self.stop.is_set():
                return config
            self.cancel(cancel, sites, failed_logins)
        for site in sites.values():
            if self.stop.is_set():
                return config
            if site.get("enabled", True) and int(site.get("claimable") or 0) > 0 and int(site.get("free", 1)) > 0:
                self.submit_site(site, failed_logins)
        self.pool.prune()
        return config

    def close(self) -> None:
        self.pool.close_all()
        self.api.close()

    # -- keys --------------------------------------------------------------------------------

    def sync_keys(self, sites) -> None:
        for site in sites:
            computer = int(site["computer"])
            if site.get("account") == "personal":
                wanted = [a["user"] for a in site.get("accounts") or [] if a.get("user") is not None]
            else:
                wanted = [None]
            published = {(k.get("user"), k.get("fingerprint")) for k in site.get("keys") or []}
            recreate = {k.get("user") for k in site.get("keys") or [] if k.get("recreate")}
            for user in wanted:
                try:
                    pair, _ = self.keys.ensure(computer, user)
                    if user in recreate and (user, pair.fingerprint) in published:
                        # Someone asked for a new key: the published one is replaced. (A new key whose
                        # publishing failed last round is not published yet, so it is simply sent again.)
                        pair = self.keys.recreate(computer, user)
                except (KeyFileError, OSError) as exc:
                    log.error("no key for computer %s: %s", computer, getattr(exc, "strerror", None) or exc)
                    continue
                if (user, pair.fingerprint) in published:
                    continue
                try:
                    self.api.publish_key(computer, user, pair.public_key)
                except FatalApiError:
                    raise
                except ApiError as exc:
                    log.warning("could not publish the key %s for computer %s: %s", pair.fingerprint, computer, exc)
                    continue
                log.info("published the public key %s for computer %s (%s)", pair.fingerprint, computer,
                         "shared account" if user is None else f"user {user}")

    def login(self, site: dict, user: int | None, account_name: str | None) -> SiteLogin:
        computer = int(site["computer"])
        key_user = user if site.get("account") == "personal" else None
        pair = self.keys.get(computer, key_user)
        if pair is None:
            raise ConnectError("ssh_configuration", "The launcher has no key for this account yet: it makes and "
                                                    "publishes one on its next poll; register it, then try again.")
        name = account_name or site.get("ssh_user") or ""
        return SiteLogin(host=str(site.get("host") or ""), port=int(site.get("port") or 22), user=name,
                         key_path=str(pair.path), known_hosts=str(site.get("known_hosts") or ""),
                         jump_hosts=tuple(site.get("jump_hosts") or ()))

    # -- checks and cancellations ------------------------------------------------------------

    def answer_check(self, check: dict, sites: dict) -> None:
        started = time.monotonic()
        site = sites.get(int(check["computer"]))
        error = None
        if site is None:
            error = "This launcher does not serve that computer (any more): choose the launcher in its settings."
        else:
            try:
                login = self.login(site, check.get("user"), check.get("account_name"))
                connection = self.pool.get(login, fresh=True)
                left = max(1.0, CHECK_SECONDS - (time.monotonic() - started))
                result = connection.run(["true"], timeout=left)
                if result.exit_code != 0:
                    tail = mask_tail(result.stderr.decode("utf-8", "replace"), self._secrets, 300).strip()
                    error = f"Logged in, but `true` exited with code {result.exit_code}" + \
                        (f": {tail}" if tail else ".")
            except ConnectError as exc:
                error = exc.detail
            except CommandTimeout:
                error = f"Logged in, but `true` did not finish within {CHECK_SECONDS:.0f} s."
        body = {"ok": error is None, "duration_ms": int((time.monotonic() - started) * 1000),
                **({"error": error} if error else {})}
        log.info("connection check %s for computer %s: %s", check["id"], check["computer"], error or "ok")
        self.pending.deliver(self.api, f"launcher/checks/{int(check['id'])}/complete", body)

    def cancel(self, item: dict, sites: dict, failed_logins: dict) -> None:
        site = sites.get(int(item["computer"]))
        error = None
        try:
            if site is None:
                raise ConnectError("ssh_configuration", "This launcher does not serve that computer any more.")
            login = self.login(site, item.get("user"), item.get("account_name"))
            if login in failed_logins:
                raise ConnectError("ssh_failed", failed_logins[login])
            try:
                connection = self.pool.get(login)
            except ConnectError as exc:
                failed_logins[login] = exc.detail
                raise
            result = run_script(connection, item["script"], timeout=CANCEL_SECONDS)
            if result.exit_code != 0:
                error = mask_tail(result.stderr.decode("utf-8", "replace"), self._secrets).strip() or \
                    f"The cancel script exited with code {result.exit_code}."
        except ConnectError as exc:
            error = exc.detail
        except CommandTimeout:
            error = f"The cancel script did not finish within {CANCEL_SECONDS:.0f} s."
        log.info("cancellation of job %s (scheduler id %s): %s", item["job_id"], item.get("scheduler_job_id"),
                 error or "done")
        body = {"job_id": item["job_id"], "ok": error is None, **({"error": error} if error else {})}
        self.pending.deliver(self.api, "launcher/cancellations/report", body)

    # -- submissions -------------------------------------------------------------------------

    def submit_site(self, site: dict, failed_logins: dict) -> None:
        computer = int(site["computer"])
        capacity = site.get("free", site.get("max_active_submissions")) or MAX_LIMIT
        limit = max(1, min(MAX_LIMIT, int(capacity)))
        try:
            items = self.api.claim(computer, limit)
        except FatalApiError:
            raise
        except ApiError as exc:
            log.warning("claiming Jobs of computer %s failed: %s", computer, exc)
            return
        for submission in items:
            # Claimed but not started when stopping: they come back with `adopt: true` next time.
            if self.stop.is_set():
                return
            outcome = self.submit(site, submission, failed_logins)
            self.report(submission, outcome)

    def submit(self, site: dict, submission: dict, failed_logins: dict) -> Outcome:
        secrets = [j.get("token") for j in submission.get("jobs") or []] + list(self._secrets)
        try:
            login = self.login(site, (submission.get("user") or {}).get("id"), submission.get("account_name"))
        except ConnectError as exc:
            return Outcome("failed", error=exc.detail)
        if login in failed_logins:
            return Outcome("not_tried", error=f"Not tried: logging in to {login.host} failed first: "
                                              f"{failed_logins[login]}")
        try:
            connection = self.pool.get(login)
        except ConnectError as exc:
            failed_logins[login] = exc.detail
            return Outcome("failed", error=exc.detail)
        if submission.get("adopt"):
            # The answer to an earlier claim was lost: the server rendered the script to look for that
            # try first (mmt_find) and print its scheduler id instead of submitting twice.
            log.info("Jobs %s were claimed before without a report: adopting them", submission.get("job_ids"))
        try:
            write_remote(connection, submission)
            result = run_script(connection, submission["script"], timeout=self.submit_seconds)
        except SpecError as exc:
            return Outcome("failed", error=mask_tail(str(exc), secrets))
        except CommandTimeout:
            return Outcome("failed", error=f"The job shell did not finish within {self.submit_seconds:.0f} s on "
                                           f"{login.host}.")
        except ConnectError as exc:
            return Outcome("failed", error=exc.detail)
        return outcome_of(result, secrets)

    def report(self, submission: dict, outcome: Outcome) -> None:
        job_ids = submission.get("job_ids") or [j["id"] for j in submission.get("jobs") or []]
        if outcome.outcome == "submitted":
            log.info("submitted Jobs %s%s", job_ids,
                     f" as scheduler job {outcome.scheduler_job_id}" if outcome.scheduler_job_id else "")
        else:
            log.warning("Jobs %s %s: %s", job_ids, outcome.outcome.replace("_", " "),
                        mask_tokens((outcome.error or "").splitlines()[-1] if outcome.error else ""))
        self.pending.deliver(self.api, "launcher/submissions/report", outcome.body(job_ids))
