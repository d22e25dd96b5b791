"""Small validators shared by every app, so a rule is written once."""
from __future__ import annotations

import re

# Names of service accounts, computers and workers: 1–64 letters, digits, '.', '_' or '-'.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_ASCII_INT = re.compile(r"^-?[0-9]{1,19}$")

BIGINT_MAX = 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def as_int(value, *, low: int, high: int) -> int | None:
    """The whole number `value` stands for (an int, or a string of ASCII digits) if it lies in
    [low, high]; None otherwise. Booleans and floats are not numbers here."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        if not _ASCII_INT.match(value.strip()):
            return None
        value = int(value.strip())
    if not isinstance(value, int) or not low <= value <= high:
        return None
    return value


def has_nul(value) -> bool:
    """Whether a parsed JSON value holds a NUL character anywhere (PostgreSQL text cannot store it)."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_nul(v) for v in value)
    return False
