"""Token text: generation, hashing and the prefix kept for display. Plaintext never reaches the database."""
from __future__ import annotations

import hashlib
import secrets

API_TOKEN_PREFIX = "mmt_"
JOB_TOKEN_PREFIX = "mmtj_"
DISPLAY_PREFIX_LENGTH = 12


def new_token(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


def hash_token(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def display_prefix(plaintext: str) -> str:
    return plaintext[:DISPLAY_PREFIX_LENGTH]