"""Token text: generation, hashing and the prefix kept for display. Plaintext never reaches the database."""
from __future__ import annotations

import hashlib
import secrets

API_TOKEN_PREFIX = "mmt_"
JOB_TOKEN_PREFIX = "mado_mtj_"  # seed 001
# Job tokens issued before the prefix changed: still accepted until their job ends (then revoked as any).
LEGACY_JOB_TOKEN_PREFIXES = ("mmtj_",)
JOB_TOKEN_PREFIXES = (JOB_TOKEN_PREFIX, *LEGACY_JOB_TOKEN_PREFIXES)
DISPLAY_PREFIX_LENGTH = 12


def new_token(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


def hash_token(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def is_job_token(plaintext: str) -> bool:
    return plaintext.startswith(JOB_TOKEN_PREFIXES)


def display_prefix(plaintext: str) -> str:
    return plaintext[:DISPLAY_PREFIX_LENGTH]