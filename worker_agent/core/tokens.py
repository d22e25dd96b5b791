"""The server's token shapes, and masking them in any text that leaves the agent."""
from __future__ import annotations

import re

# Tokens of the server: API tokens `mmt_…` and job tokens `mado_mtj_…` (before: `mmtj_…`, still masked), url-safe
# base64 after the prefix.
TOKEN_RE = re.compile(r"\b(?:mmtj?|mado_mtj)_[A-Za-z0-9_\-]{16,}")
# An API token as a worker or launcher takes it (its own token, never a job token).
API_TOKEN_RE = re.compile(r"mmt_[A-Za-z0-9_\-]{16,200}")
# Job tokens belong to one running Job: a worker or launcher refuses them as its own token.
JOB_TOKEN_PREFIXES = ("mado_mtj_", "mmtj_")


def job_token_prefix(token: str) -> str | None:
    """The job-token prefix `token` starts with, or None for any other token."""
    return next((prefix for prefix in JOB_TOKEN_PREFIXES if token.startswith(prefix)), None)


def mask_token(token: str) -> str:
    """A token shortened to its first 12 characters, as the server shows it."""
    if not token:
        return ""
    return token[:12] + "…" if len(token) > 12 else "…"


def mask_tokens(text: str, *known: str) -> str:
    """`text` with the given tokens and anything shaped like a token masked."""
    for token in known:
        if token:
            text = text.replace(token, mask_token(token))
    return TOKEN_RE.sub(lambda m: mask_token(m.group(0)), text)
