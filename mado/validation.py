"""Small validators shared by every app, so a rule is written once."""
from __future__ import annotations

import json
import math
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


def int_field(value, low: int, high: int, field: str, errors: dict, message: str, *, whole_floats: bool = False) -> int:
    """`value` as a whole number in [low, high]; otherwise `message` is recorded under `field` in `errors`
    and `low` returned, so that the caller goes on checking the other fields. With `whole_floats`, 22.0
    (from a JSON client) is 22; 1e999 (inf) and 2.5 are never whole numbers."""
    if whole_floats and isinstance(value, float) and value.is_integer():
        value = int(value)
    number = as_int(value, low=low, high=high)
    if number is None:
        errors[field] = [message]
        return low
    return number


# How deep arrays and objects may nest in a request body. Real bodies nest a handful of levels; the
# limit keeps every later recursion (validators, the database adapter, renderers) far from Python's
# stack limit, which the JSON decoder itself hits near 1000 levels.
MAX_JSON_DEPTH = 64
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
# The only ways JSON text can spell a NUL or a lone surrogate: as a \u escape (raw ones do not decode).
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


def json_too_deep(value, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether a parsed JSON value nests arrays and objects more than `limit` levels. Level by level,
    without recursion: a 100 000-entry manifest costs a quarter of its parsing."""
    level = [value]
    for _ in range(limit):
        below = []
        for item in level:
            kind = type(item)
            if kind is dict:
                below.extend(item.values())
            elif kind is list:
                below.extend(item)
        if not below:
            return False
        level = below
    return any(type(item) in (dict, list) for item in level)


class JsonRefused(ValueError):
    """JSON text that parses but cannot be stored or answered; `message` says what to fix."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.message = message
        self.code = code


def loads_storable(text: str, *, parse_constant=None):
    """`json.loads` with the rules every stored JSON value follows: finite numbers only (1e999 is JSON
    text, but no double, nor a jsonb column, holds it), at most MAX_JSON_DEPTH levels of nesting, no
    NUL characters and no lone UTF-16 surrogates (a \\ud800 escape without its pair has no UTF-8 form).
    Raises JsonRefused for those, and ValueError (json.JSONDecodeError) for text that is not JSON."""
    try:
        value = json.loads(text, parse_float=_finite_float, parse_constant=parse_constant)
    except _OutOfRange as exc:
        literal = str(exc) if len(str(exc)) <= 40 else str(exc)[:40] + "…"
        raise JsonRefused(f"The number {literal} is beyond the range of a floating-point number; send a finite "
                          "number.", "number_out_of_range") from None
    except RecursionError:  # the decoder gives up near Python's stack limit (~1000 levels)
        raise JsonRefused(_TOO_DEEP, "nesting_too_deep") from None
    if json_too_deep(value):
        raise JsonRefused(_TOO_DEEP, "nesting_too_deep")
    problem = bad_text_in(value) if may_hold_bad_text(text) else None
    if problem is not None:
        kind, where = problem
        at = f" at {where}" if where else ""
        if kind == "nul":  # "parse_error": the code this refusal had before lone surrogates joined it
            raise JsonRefused(f"Remove the NUL character (\\u0000){at}: text cannot hold it.", "parse_error")
        raise JsonRefused(f"Remove the lone surrogate{at}: \\ud800 to \\udfff are allowed only as the two halves of "
                          "one character; send the whole character.", "invalid_characters")
    return value


_TOO_DEEP = f"The JSON nests arrays and objects more than {MAX_JSON_DEPTH} levels deep; send a flatter document."


class _OutOfRange(ValueError):
    pass


def _finite_float(literal: str) -> float:
    number = float(literal)
    if not math.isfinite(number):
        raise _OutOfRange(literal)
    return number


def may_hold_bad_text(text: str) -> bool:
    """Whether JSON text may decode to a NUL or a lone surrogate; False means it surely does not."""
    return _SUSPECT_ESCAPE.search(text) is not None


def text_problem(text: str) -> str | None:
    """What makes `text` unstorable: "nul" (PostgreSQL text cannot hold U+0000), "lone_surrogate" (half
    of a UTF-16 pair, which has no UTF-8 form, so it can be neither stored nor answered), or None."""
    if "\x00" in text:
        return "nul"
    if not text.isascii() and _LONE_SURROGATE.search(text):
        return "lone_surrogate"
    return None


def bad_text_in(value) -> tuple[str, str] | None:
    """The first string of a parsed JSON value that text_problem refuses, as (problem, where): where is
    a path such as `env.A` or `command[1]` ("" for the whole body), to tell the caller what to fix."""
    stack = [(value, "")]
    while stack:  # an explicit stack: any depth is safe to inspect
        item, where = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                return problem, where
        elif isinstance(item, dict):
            children = []
            for key, child in item.items():
                problem = text_problem(key)
                if problem:
                    return problem, f"a key in {where}" if where else "a key"
                children.append((child, _member(where, key)))
            stack.extend(reversed(children))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]") for i, child in reversed(list(enumerate(item))))
    return None


def _member(where: str, key: str) -> str:
    if len(where) > 200:  # a path to show the caller, not a copy of the body
        return where if where.endswith("…") else where + "…"
    key = key if len(key) <= 40 else key[:40] + "…"
    return f"{where}.{key}" if where else key
