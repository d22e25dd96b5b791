"""MLflow's limits and rules on what is logged (mlflow.utils.validation, MLflow 3), with its messages."""
from __future__ import annotations

import math
import posixpath
import re

from tracking.errors import invalid

MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
MAX_ENTITIES_PER_BATCH = 1000
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000
MAX_EXPERIMENT_NAME_LENGTH = 500
MAX_EXPERIMENT_TAG_VAL_LENGTH = 20000
MAX_ENTITY_KEY_LENGTH = 250
MAX_RUN_NAME_LENGTH = 250
MAX_DATASET_NAME_SIZE = 500
MAX_DATASET_DIGEST_SIZE = 36
MAX_DATASET_SOURCE_SIZE = 65535
MAX_DATASET_SCHEMA_SIZE = 1048575
MAX_DATASETS_PER_BATCH = 1000
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

_NAME = re.compile(r"^[/\w.\- :]*$")
_RUN_ID = re.compile(r"^[a-zA-Z0-9][\w\-]{0,255}$")
_BAD_CHARS = ("Names may only contain alphanumerics, underscores (_), dashes (-), periods (.), spaces ( ), "
              "colon(:) and slashes (/).")


def invalid_value(path: str, value, message: str | None = None) -> str:
    shown = repr(value) if not isinstance(value, str) else f"'{value[:200]}'"
    if message:
        return f"Invalid value {shown} for parameter '{path}' supplied: {message}"
    return f"Invalid value {shown} for parameter '{path}' supplied."


def missing_value(path: str) -> str:
    return f"Missing value for required parameter '{path}'."


def _path(base: str, name: str) -> str:
    return f"{base}.{name}" if base else name


def validate_key(key, path: str, what: str) -> str:
    """A metric, param or tag key: MLflow's characters, a normalized path, at most 250 characters."""
    if key is None or key == "":
        raise invalid(missing_value(path) if key is None else invalid_value(path, key, f"{what} name cannot be empty."))
    if not isinstance(key, str):
        raise invalid(invalid_value(path, key, f"{what} name must be a string."))
    if not _NAME.fullmatch(key):
        raise invalid(invalid_value(path, key, _BAD_CHARS))
    norm = posixpath.normpath(key)
    if norm != key or norm == "." or norm.startswith("..") or norm.startswith("/"):
        raise invalid(invalid_value(path, key, "Names may be treated as files in certain cases, and must not "
                                               f"resolve to other names when treated as such. This name would "
                                               f"resolve to {norm!r}"))
    if len(key) > MAX_ENTITY_KEY_LENGTH:
        raise invalid(f"'{path}' exceeds the maximum length of {MAX_ENTITY_KEY_LENGTH} characters")
    return key


def validate_text(value, path: str, limit: int, *, required: bool = True) -> str:
    if value is None:
        if required:
            raise invalid(missing_value(path))
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise invalid(invalid_value(path, value, "Expected a string."))
    if isinstance(value, float) and not math.isfinite(value):  # JSON's NaN/Infinity: MLflow wants a string
        raise invalid(invalid_value(path, value, "Expected a string."))
    value = str(value)
    if len(value) > limit:
        raise invalid(f"'{path}' exceeds the maximum length of {limit} characters")
    if "\x00" in value:
        raise invalid(invalid_value(path, value, "NUL characters are not allowed."))
    return value


_SPECIAL = {"nan": math.nan, "infinity": math.inf, "-infinity": -math.inf, "inf": math.inf, "-inf": -math.inf}


def metric_value(value, path: str, key: str, timestamp) -> float:
    """A double: a JSON number, or protobuf JSON's "NaN", "Infinity", "-Infinity" (MLflow stores NaN and
    ±inf as they come)."""
    if value is None:
        raise invalid(missing_value(path))
    if isinstance(value, str) and value.strip().lower() in _SPECIAL:
        return _SPECIAL[value.strip().lower()]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid(invalid_value(path, value, f"(timestamp={timestamp}). Please specify value as a valid double "
                                                 "(64-bit floating point)"))
    try:
        return float(value)
    except OverflowError:
        raise invalid(invalid_value(path, value, "Please specify value as a valid double (64-bit floating "
                                                 "point)")) from None


def as_long(value, path: str, *, default=None, minimum: int = INT64_MIN, message: str = "") -> int | None:
    """An int64, as a JSON number or protobuf JSON's decimal string."""
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        raise invalid(invalid_value(path, value, message or "Expected a long (64-bit integer)."))
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,20}", value.strip()):
        value = int(value)
    if not isinstance(value, int) or not (minimum <= value <= INT64_MAX):
        raise invalid(invalid_value(path, value, message or "Expected a long (64-bit integer)."))
    return value


def validate_run_id(run_id, path: str = "run_id") -> str:
    if run_id is None or run_id == "":
        raise invalid(missing_value(path))
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise invalid(invalid_value(path, run_id))
    return run_id


def experiment_id(value, path: str = "experiment_id") -> int:
    """An experiment ID: ASCII digits (as a string or a JSON number) within int64; "0" is the default one."""
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    if text is None or not text.isascii() or not text.isdigit() or int(text) > INT64_MAX:
        raise invalid(f"Invalid experiment ID '{str(value)[:200]}' for parameter '{path}'. Experiment ID must be a "
                      "valid integer.")
    return int(text)


def validate_batch_limits(metrics: list, params: list, tags: list) -> None:
    for name, limit, length in (("metrics", MAX_METRICS_PER_BATCH, len(metrics)),
                                ("params", MAX_PARAMS_TAGS_PER_BATCH, len(params)),
                                ("tags", MAX_PARAMS_TAGS_PER_BATCH, len(tags)),
                                ("metrics, params, and tags", MAX_ENTITIES_PER_BATCH,
                                 len(metrics) + len(params) + len(tags))):
        if length > limit:
            raise invalid(f"A batch logging request can contain at most {limit} {name}. Got {length} {name}. "
                          "Please split up {name} across multiple requests and try again.".replace("{name}", name))


def experiment_name(name) -> str:
    if name is None or (isinstance(name, str) and not name.strip()):
        raise invalid(f"Invalid experiment name: '{name}'")
    if not isinstance(name, str):
        raise invalid(f"Invalid experiment name: {name}. Expects a string.")
    if len(name) > MAX_EXPERIMENT_NAME_LENGTH:
        raise invalid(f"'name' exceeds the maximum length of {MAX_EXPERIMENT_NAME_LENGTH} characters")
    if "\x00" in name:
        raise invalid(f"Invalid experiment name: '{name}'")
    return name
