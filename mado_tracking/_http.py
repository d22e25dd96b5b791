"""The HTTP side: MLflow's REST API 2.0 under a tracking URI, its error body, retries while the server is away."""
from __future__ import annotations

import math
import time
import urllib.parse

import requests

API = "/api/2.0/mlflow"
ARTIFACTS_API = "/api/2.0/mlflow-artifacts/artifacts"
# Answers that mean "the server is away or busy, try again": no answer at all, 5xx, 429 and 408.
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class TrackingError(Exception):
    """A refusal from the tracking server (MLflow's `{"error_code", "message"}`) or a failure to reach it.

    `error_code` is MLflow's code (`INVALID_PARAMETER_VALUE`, `PERMISSION_DENIED`, `RESOURCE_DOES_NOT_EXIST`,
    `UNAUTHENTICATED`, ...) or `UNAVAILABLE` when the server could not be reached; `status` is the HTTP status
    (None when there was no answer)."""

    def __init__(self, message: str, error_code: str = "INTERNAL_ERROR", status: int | None = None):
        super().__init__(f"{error_code}: {message}" if error_code else message)
        self.message = message
        self.error_code = error_code
        self.status = status


class Retryable(Exception):
    """Internal: the request may be sent again (no answer, 5xx, 429)."""

    def __init__(self, reason: str, sent: bool = True):
        super().__init__(reason)
        self.sent = sent  # False when the connection was never made: the server cannot have acted on it


def encode_number(value: float):
    """MLflow's JSON (protobuf's) spells the non-finite doubles as strings."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def decode_number(value):
    return float(value) if isinstance(value, str) else value


class Client:
    """One tracking server: `tracking_uri` is the MLflow tracking URI (`<server>/mlflow` for Mado Compute)."""

    def __init__(self, tracking_uri: str, token: str | None, timeout: float = 30.0):
        if not tracking_uri or not tracking_uri.startswith(("http://", "https://")):
            raise TrackingError(
                f"The tracking URI must be an http(s) URL such as https://mado.example.org/mlflow, not {tracking_uri!r}: "
                "set MLFLOW_TRACKING_URI or pass tracking_uri=.", "INVALID_PARAMETER_VALUE")
        self.tracking_uri = tracking_uri.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["User-Agent"] = "mado-tracking-sdk"
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"

    # -- one request ---------------------------------------------------------------------------------

    def _send(self, method: str, url: str, **kwargs):
        try:
            kwargs.setdefault("timeout", self.timeout)
            response = self.session.request(method, url, **kwargs)
        except requests.exceptions.ConnectionError as exc:
            # A refused or unresolved connection never reached the server; a reset one may have.
            text = repr(exc)
            never_sent = "NewConnectionError" in text or "Connection refused" in text or "NameResolution" in text
            raise Retryable(f"cannot reach {self.tracking_uri}: {exc}", sent=not never_sent) from exc
        except requests.exceptions.Timeout as exc:
            raise Retryable(f"no answer from {self.tracking_uri} within {self.timeout} s") from exc
        except requests.exceptions.RequestException as exc:
            raise Retryable(f"request to {self.tracking_uri} failed: {exc}") from exc
        if response.status_code in RETRY_STATUSES:
            raise Retryable(f"{self.tracking_uri} answered {response.status_code}")
        if response.status_code >= 400:
            raise self._error(response)
        return response

    @staticmethod
    def _error(response) -> TrackingError:
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and "error_code" in body:
            return TrackingError(str(body.get("message") or ""), str(body["error_code"]), response.status_code)
        codes = {401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "ENDPOINT_NOT_FOUND"}
        text = response.text[:300].strip()
        return TrackingError(
            f"{response.request.method} {response.url} answered {response.status_code}: {text}",
            codes.get(response.status_code, "BAD_REQUEST"), response.status_code)

    def request(self, method: str, url: str, *, retry_for: float = 0.0, only_if_unsent: bool = False, **kwargs):
        """Send once; while the server is away keep retrying with backoff for up to `retry_for` seconds.
        `only_if_unsent`: retry only when the server cannot have acted on it (not idempotent requests)."""
        deadline = time.monotonic() + retry_for
        delay = 0.2
        while True:
            try:
                return self._send(method, url, **kwargs)
            except Retryable as exc:
                if (only_if_unsent and exc.sent) or time.monotonic() + delay > deadline:
                    raise TrackingError(f"{exc}. Check that the server is running and the URL is right.",
                                        "UNAVAILABLE") from exc
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                if "data" in kwargs and hasattr(kwargs["data"], "seek"):
                    kwargs["data"].seek(0)

    # -- MLflow endpoints ----------------------------------------------------------------------------

    def api(self, method: str, endpoint: str, body: dict | None = None, **options) -> dict:
        url = f"{self.tracking_uri}{API}/{endpoint}"
        if method == "GET":
            response = self.request(method, url, params=body, **options)
        else:
            response = self.request(method, url, json=body or {}, **options)
        return response.json() if response.content else {}

    def api_once(self, method: str, endpoint: str, body: dict) -> dict:
        """One attempt; raises `Retryable` when the server is away (the metric sender does its own backoff)."""
        response = self._send(method, f"{self.tracking_uri}{API}/{endpoint}", json=body)
        return response.json() if response.content else {}

    def artifact_url(self, artifact_uri: str, path: str) -> str:
        """`mlflow-artifacts:/<root>` → `<tracking uri>/api/2.0/mlflow-artifacts/artifacts/<root>/<path>`,
        resolved as MLflow's client does (a host in the URI replaces the tracking URI's)."""
        parsed = urllib.parse.urlparse(artifact_uri)
        if parsed.scheme not in ("mlflow-artifacts", "http", "https"):
            raise TrackingError(
                f"This Run's artifacts live at {artifact_uri!r}, which the SDK cannot write to; "
                "it writes through the server's proxied artifact API (mlflow-artifacts:).", "INVALID_PARAMETER_VALUE")
        if parsed.scheme in ("http", "https"):
            base = artifact_uri.rstrip("/")
        else:
            tracking = urllib.parse.urlparse(self.tracking_uri)
            netloc = parsed.netloc or tracking.netloc
            prefix = "" if parsed.netloc else tracking.path
            base = urllib.parse.urlunparse(
                (tracking.scheme, netloc, f"{prefix}/{ARTIFACTS_API}/{parsed.path}".replace("//", "/"), "", "", ""))
            while "//" in base.split("://", 1)[1]:
                scheme, rest = base.split("://", 1)
                base = f"{scheme}://{rest.replace('//', '/')}"
        quoted = "/".join(urllib.parse.quote(part) for part in path.split("/") if part)
        return f"{base.rstrip('/')}/{quoted}"
