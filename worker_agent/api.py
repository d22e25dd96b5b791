"""The worker's side of the HTTP contract in docs/worker-protocol.md: one method per endpoint.

Transient failures (connection errors, timeouts, 5xx, 429) are retried with jittered exponential
backoff; 401 and 403 are unrecoverable and raise `FatalApiError` with a sentence saying which token or
scope is wrong; other 4xx raise `ApiError` with the server's code. The token never appears in a
message: every text that leaves this module passes through `mask_tokens`."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import requests

from worker_agent import __version__
from worker_agent.core.api import ApiError, Backoff, error_details, retryable
from worker_agent.core.api import Unavailable as ApiUnavailable  # the server could not be reached after every retry
from worker_agent.core.tokens import mask_tokens

log = logging.getLogger("mado.worker.api")

CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 30.0
MAX_WAIT = 30


def _bounded_wait(wait: int) -> int:
    return max(0, min(MAX_WAIT, int(wait)))


class FatalApiError(ApiError):
    """401/403: the token itself is wrong. The worker stops; retrying cannot help."""


class ApiClient:
    def __init__(self, api_url: str, token: str, *, attempts: int = 5, backoff: Backoff | None = None,
                 sleep: Callable[[float], Any] | None = None, stop: threading.Event | None = None):
        self.api_url = api_url.rstrip("/")
        self._token = token
        self.attempts = attempts
        self.backoff = backoff or Backoff()
        self._stop = stop
        self._sleep = sleep or self._interruptible_sleep
        self._local = threading.local()

    # one requests.Session per thread: the loop's threads each keep their own keep-alive connection
    @property
    def session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.headers.update({
                "Authorization": f"Bearer {self._token}",
                "User-Agent": f"mado-tracking-worker/{__version__}",
                "Accept": "application/json",
            })
            session.trust_env = True
            self._local.session = session
        return session

    def close(self) -> None:
        session = getattr(self._local, "session", None)
        if session is not None:
            session.close()
            self._local.session = None

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _interruptible_sleep(self, seconds: float) -> None:
        if self._stop is not None:
            self._stop.wait(seconds)
        else:
            time.sleep(seconds)

    def mask(self, text: str) -> str:
        return mask_tokens(text, self._token)

    # -- transport -----------------------------------------------------------------------------

    def request(self, method: str, path: str, body: dict | None = None, *, read_timeout: float = READ_TIMEOUT,
                auth: bool = True, attempts: int | None = None) -> dict:
        attempts = attempts or self.attempts
        last: Exception | None = None
        for attempt in range(attempts):
            if attempt:
                delay = self.backoff.delay(attempt - 1)
                log.info("retrying %s %s in %.1f s (%s)", method, path, delay, last)
                self._sleep(delay)
                if self._stop is not None and self._stop.is_set():
                    break
            try:
                response = self._send(method, path, json=body, headers=None if auth else {"Authorization": None},
                                      read_timeout=read_timeout,
                                      hint=" Check MMT_API_URL and that the server is running.")
            except ApiUnavailable as exc:
                last = exc
                continue
            return self._answer(method, path, response)
        raise last if last is not None else ApiUnavailable("The worker is stopping.")

    def _send(self, method: str, path: str, *, read_timeout: float, hint: str = "", **kwargs) -> requests.Response:
        """One attempt: the answer, or ApiUnavailable for network trouble and 429/5xx (`hint` ends the
        sentence of a server that cannot be reached)."""
        url = f"{self.api_url}/api/{path.lstrip('/')}"
        try:
            response = self.session.request(method, url, timeout=(CONNECT_TIMEOUT, read_timeout),
                                            allow_redirects=False, **kwargs)
        except requests.Timeout:
            raise ApiUnavailable(f"The API server at {self.api_url} did not answer {method} /api/{path} in time.") \
                from None
        except requests.RequestException as exc:
            raise ApiUnavailable(self.mask(
                f"Cannot reach the API server at {self.api_url} ({type(exc).__name__}).{hint}")) from None
        if retryable(response.status_code):
            response.close()
            raise ApiUnavailable(f"The API server answered {response.status_code} to {method} /api/{path}.",
                                 status=response.status_code)
        return response

    def _answer(self, method: str, path: str, response: requests.Response) -> dict:
        try:
            data = response.json()
        except ValueError:
            data = None
        if 300 <= response.status_code < 400:
            raise ApiError(f"The API server redirected /api/{path} to {response.headers.get('Location', '?')}: "
                           "set MMT_API_URL to the final address (for example https:// instead of http://).",
                           status=response.status_code, code="redirect")
        if response.status_code < 300:
            if not isinstance(data, dict):
                raise ApiError(f"The API server answered {method} /api/{path} with something other than JSON: "
                               "check that MMT_API_URL points at the Mado server.", status=response.status_code)
            return data
        body, code, server_text = error_details(data, self.mask)
        if response.status_code == 401:
            raise FatalApiError(
                "The API server rejected the worker token (401): it is unknown, expired or revoked, or its service "
                "account is disabled. Issue a new token for the service account and run `mado-tracking-worker "
                "install` again (or update MMT_API_TOKEN)." + (f" Server: {server_text}" if server_text else ""),
                status=401, code=code or "unauthorized", body=body)
        if response.status_code == 403 and path.startswith("worker/"):
            raise FatalApiError(
                "The worker token lacks the worker:execute scope (403). Issue a token for an admin-role service "
                "account with the scopes read, worker:execute and artifacts:write, then run `mado-tracking-worker "
                "install` again." + (f" Server: {server_text}" if server_text else ""),
                status=403, code=code or "missing_scope", body=body)
        raise ApiError(server_text or f"The API server answered {response.status_code} to {method} /api/{path}.",
                       status=response.status_code, code=code, body=body)

    # -- endpoints -----------------------------------------------------------------------------

    def health(self) -> dict:
        return self.request("GET", "health", auth=False, attempts=1, read_timeout=5)

    def token_info(self) -> dict:
        return self.request("GET", "auth/token", attempts=1, read_timeout=10)

    def hello(self, payload: dict) -> dict:
        return self.request("POST", "worker/hello", payload)

    def claim_check(self, worker_id: str, wait: int = 0) -> dict | None:
        # Re-sending a check claim returns the check already held (same lease), so a retry is safe.
        return self._claim("checks", worker_id, wait)

    def complete_check(self, check_id: int, worker_id: str, lease_id: str, status: str, result: dict) -> dict:
        return self.request("POST", f"worker/checks/{int(check_id)}/complete",
                            {"worker_id": worker_id, "lease_id": lease_id, "status": status, "result": result})

    def claim_read(self, worker_id: str, wait: int = 0) -> dict | None:
        return self._claim("reads", worker_id, wait)

    def _claim(self, kind: str, worker_id: str, wait: int) -> dict | None:
        wait = _bounded_wait(wait)
        data = self.request("POST", f"worker/{kind}/claim", {"worker_id": worker_id, "wait": wait},
                            read_timeout=wait + READ_TIMEOUT)
        return data.get("item")

    def complete_read(self, read_id: int, worker_id: str, lease_id: str, entries: list[dict],
                      error: str | None) -> dict:
        return self.request("POST", f"worker/reads/{int(read_id)}/complete",
                            {"worker_id": worker_id, "lease_id": lease_id, "entries": entries, "error": error})

    # -- jobs ----------------------------------------------------------------------------------

    def claim_job(self, worker_id: str, active_job_ids: list[int], wait: int = 0) -> tuple[dict | None, dict]:
        """One attempt only: a claim whose answer was lost is recovered with `resume_jobs`, never by
        sending the claim again (a replay could take a second job). Returns (item, answer): with no
        item, the answer's `reason` says why the wait ended early (`active_jobs_ended`)."""
        wait = _bounded_wait(wait)
        data = self.request("POST", "worker/claim",
                            {"worker_id": worker_id, "active_job_ids": list(active_job_ids), "wait": wait},
                            read_timeout=wait + READ_TIMEOUT, attempts=1)
        return data.get("item"), data

    def gpu_readings(self, computer_id: int, worker_id: str, gpus: list[dict]) -> dict:
        """What the GPU watch read on a computer this worker serves (docs/gpus.md "The GPU watch")."""
        return self.request("POST", f"worker/computers/{int(computer_id)}/gpus", {"worker_id": worker_id, "gpus": gpus},
                            attempts=2)

    def goodbye(self, worker_id: str) -> dict:
        """Draining before exit: the server hands this worker nothing more and puts back in the queue
        the jobs it claimed but never started. Once, briefly: a worker that cannot say it still exits."""
        return self.request("POST", "worker/goodbye", {"worker_id": worker_id}, read_timeout=5.0, attempts=1)

    def resume_jobs(self, worker_id: str, active_job_ids: list[int]) -> list[dict]:
        data = self.request("POST", "worker/resume", {"worker_id": worker_id, "active_job_ids": list(active_job_ids)})
        items = data.get("items")
        return items if isinstance(items, list) else []

    def _leased(self, job_id: int, call: str, worker_id: str, lease_id: str, body: dict, **kwargs) -> dict:
        return self.request("POST", f"worker/jobs/{int(job_id)}/{call}",
                            {"worker_id": worker_id, "lease_id": lease_id, **body}, **kwargs)

    def job_heartbeat(self, job_id: int, worker_id: str, lease_id: str, status: str | None = None,
                      waiting: str | None = None) -> dict:
        """`waiting`: why a claimed job has not started yet (its GPUs busy outside Mado), for its page."""
        body = {"status": status} if status else {}
        if waiting:
            body["waiting"] = waiting
        return self._leased(job_id, "heartbeat", worker_id, lease_id, body, attempts=2)

    def job_release(self, job_id: int, worker_id: str, lease_id: str, reason: str) -> dict:
        """Give a claimed, never-started job back to the queue with the reason (its GPUs busy outside Mado)."""
        return self._leased(job_id, "release", worker_id, lease_id, {"reason": reason[:450]})

    def job_logs(self, job_id: int, worker_id: str, lease_id: str, chunks: list[dict]) -> dict:
        return self._leased(job_id, "logs", worker_id, lease_id, {"chunks": chunks})

    def job_metrics(self, job_id: int, worker_id: str, lease_id: str, metrics: list[dict]) -> dict:
        return self._leased(job_id, "metrics", worker_id, lease_id, {"metrics": metrics})

    def job_outputs(self, job_id: int, worker_id: str, lease_id: str, result: str, files: list[dict],
                    manifest: str | None, *, max_files: int | None = None) -> dict:
        """`max_files`: this worker's MMT_WORKER_MAX_OUTPUT_FILES, which the server applies up to its maximum."""
        body: dict = {"result": result, "files": files, "manifest": manifest}
        if max_files is not None:
            body["max_files"] = int(max_files)
        return self._leased(job_id, "outputs", worker_id, lease_id, body)

    def complete_job(self, job_id: int, worker_id: str, lease_id: str, status: str, *, exit_code: int | None = None,
                     error: str | None = None, end_reason: str | None = None, replica: str | None = None) -> dict:
        # `replica`: a cluster job ended by this replica (docs/cluster-jobs.md "End"); an exit code 0 is sent.
        optional = {"replica": replica, "exit_code": exit_code, "error": error, "end_reason": end_reason}
        body = {"status": status, **{key: value for key, value in optional.items() if value not in (None, "")}}
        return self._leased(job_id, "complete", worker_id, lease_id, body)

    def _raw(self, method: str, path: str, *, params: dict, data=None, headers: dict | None = None,
             stream: bool = False, read_timeout: float = READ_TIMEOUT) -> requests.Response:
        """One attempt of a request whose body or answer is bytes (artifacts, sources): the caller
        retries, because a streamed body cannot be sent twice. Errors raise as in `request`."""
        response = self._send(method, path, params=params, data=data, headers=headers, stream=stream,
                              read_timeout=read_timeout)
        if response.status_code >= 300:
            self._answer(method, path, response)  # raises with the server's code
        return response

    def put_artifact(self, job_id: int, worker_id: str, lease_id: str, path: str, body, *,
                     content_range: str | None = None) -> dict:
        """PUT one artifact (or one part of it, with `Content-Range: bytes start-end/total`). `body` is
        bytes or a file-like object with `__len__` (sent with a Content-Length, streamed)."""
        headers = {"Content-Type": "application/octet-stream"}
        if content_range:
            headers["Content-Range"] = content_range
        response = self._raw("PUT", f"worker/jobs/{int(job_id)}/artifacts/{quote(path, safe='/')}",
                             params={"worker_id": worker_id, "lease_id": lease_id}, data=body, headers=headers,
                             read_timeout=READ_TIMEOUT * 4)
        return self._answer("PUT", "worker/jobs/…/artifacts", response)

    def put_artifacts_batch(self, job_id: int, worker_id: str, lease_id: str, body) -> dict:
        """PUT many small artifacts in one request: `body` is worker_agent.core.outputs.FramedBody (frames of
        many files, file-like with `__len__`, streamed). Answers {confirmed: [paths], received_bytes}."""
        response = self._raw("PUT", f"worker/jobs/{int(job_id)}/artifacts-batch",
                             params={"worker_id": worker_id, "lease_id": lease_id}, data=body,
                             headers={"Content-Type": "application/octet-stream"}, read_timeout=READ_TIMEOUT * 4)
        return self._answer("PUT", "worker/jobs/…/artifacts-batch", response)

    def download_source(self, job_id: int, worker_id: str, lease_id: str, out) -> int:
        """Write the job's source archive into the binary file `out`; returns its size."""
        response = self._raw("GET", f"worker/jobs/{int(job_id)}/source",
                             params={"worker_id": worker_id, "lease_id": lease_id}, stream=True)
        size = 0
        try:
            for block in response.iter_content(1 << 20):
                out.write(block)
                size += len(block)
        except requests.RequestException as exc:
            raise ApiUnavailable(f"The source download broke off ({type(exc).__name__}).") from None
        finally:
            response.close()
        return size
