"""Text that leaves the worker: tokens masked, control characters removed, length bounded.

Anything the worker reports (check details, log lines, error messages) passes through here, because
it may carry a token, a key path or bytes a remote command printed."""
from __future__ import annotations

import re

# The token shapes and masking live in core (the site runner has them too); re-exported for the agent's callers.
from worker_agent.core.tokens import API_TOKEN_RE, JOB_TOKEN_PREFIXES, TOKEN_RE, job_token_prefix, mask_tokens

__all__ = ["API_TOKEN_RE", "JOB_TOKEN_PREFIXES", "TOKEN_RE", "job_token_prefix", "mask_tokens", "sanitize_detail"]

_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_PRIVATE_KEY_RE = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")
DETAIL_LIMIT = 200


def sanitize_detail(text: str | None, *, secrets: tuple[str, ...] = (), limit: int = DETAIL_LIMIT) -> str:
    """A detail safe to report: one line, no control characters, tokens masked, at most `limit`
    characters. A detail that mentions one of `secrets` (key and known_hosts paths) or private key
    material is dropped entirely: a shortened path would still name the file."""
    if not text:
        return ""
    if _PRIVATE_KEY_RE.search(text):
        return ""
    for secret in secrets:
        if secret and secret in text:
            return ""
    text = text.replace("\r\n", " ").replace("\n", " ").replace("\t", " ")
    text = _CONTROL_RE.sub("", text)
    text = mask_tokens(text)
    text = re.sub(r" {2,}", " ", text).strip()
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text
