"""The server's error answers as the worker's client (requests) and the site runner's (urllib) read
them: the error classes, which answers are worth another try, and the backoff."""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


class ApiError(Exception):
    """The server answered with an error that retrying this call will not change."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None,
                 body: dict | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.body = body or {}


class Unavailable(ApiError):
    """The server could not be reached, or answered 429/5xx: worth another try."""


def retryable(status: int) -> bool:
    return status >= 500 or status == 429


def error_details(data, mask: Callable[[str], str]) -> tuple[dict, str | None, str]:
    """(body, code, text) of an error answer's JSON `data`: its object (else {}), its `code` when a
    string, and its `error` text with tokens masked ("" when none)."""
    body = data if isinstance(data, dict) else {}
    code = body.get("code") if isinstance(body.get("code"), str) else None
    return body, code, mask(str(body.get("error") or "")) if body else ""


@dataclass
class Backoff:
    """Jittered exponential backoff: attempt n waits base·2ⁿ capped at `cap`, times a random 0.5–1."""
    base: float = 0.5
    cap: float = 30.0

    def delay(self, attempt: int) -> float:
        # The exponent is bounded so that endless retries never overflow a float.
        return min(self.cap, self.base * (2 ** min(attempt, 64))) * random.uniform(0.5, 1.0)
