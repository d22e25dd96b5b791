"""Validation of a job's ``result.json`` (versions 1 and 2): the completion declaration that code
running without the SDK writes last into its outputs directory (``MMT_OUTPUTS_DIR``, ``/mmt/outputs``
in containers). The worker reports the file list of that directory (path, size, sha256, kind) and the
text of ``result.json`` and of the artifacts manifest; this module decides whether the declaration is
acceptable and returns what the server stores. Standard library only, no Django, no I/O: the server
(jobs/outputs.py) and the worker (before uploading) run the very same checks.

Two entry points::

    result = parse_result_json(raw_bytes)                  # size limit, UTF-8, one JSON object
    validated = validate_result(result, files, manifest_text=..., max_files=limit, limit_setting=name)

Every rejection is a :class:`ResultError` whose ``code`` is a stable snake_case word and whose
``message`` is one or two sentences naming the offending key, index, line or path and saying what to
write instead; ``location`` holds the JSON location (``artifacts[2].path``) or ``None``.

The document (seeds ``001-worker-install``, REFERENCE §2)
-----------------------------------------------------------
``{"version": 1, "complete": true, "artifacts": [...], "metrics": [...]}``; version 2 adds
``artifactsManifest``, ``models`` and ``datasets``. Unknown keys are rejected at every level.

* artifact ``{path, sha256, size, mimeType?}``. A path is relative to the outputs directory, at most
  1024 characters, POSIX separators, no ``..``, no ``\\``, no NUL/CR/LF, not a symlink or special
  file, not an unfinished ``*.partial`` / ``*.tmp`` file. The regular files present must equal the
  declared ones plus ``result.json`` and the manifest, and every size and sha256 must match.
* ``artifactsManifest``: the path of a JSON Lines file, one ``{"path","sha256","size"}`` per line
  (``mimeType`` allowed too); lines at most 4 KiB.
* metric ``{name, value, step?, timestamp?}``: value finite, step an integer 0..2^53-1.
* model ``{path, modelId?, metadata?}``: weights registered as a model version.
* dataset ``{datasetId, path | uri, digest?, schema?, metadata?}``: ``path`` names an output file or
  a directory (all output files under it form one dataset version, paths inside the version relative
  to that directory); with ``path`` no digest is sent (the server computes it from the file list);
  with ``uri`` a digest is required.
* Limits: result.json 1 MiB, 10 000 output files (``max_files``: the worker's
  ``MMT_WORKER_MAX_OUTPUT_FILES``, up to the server's maximum ``MADO_MAX_OUTPUT_FILES``; messages name
  ``limit_setting``, the setting that decided the limit, and say how to raise it), 1000 metric points,
  16 models, 64 datasets, 100 000 files under one dataset directory.

Decisions where the documents are silent
----------------------------------------
* Encoding: strict UTF-8; a byte order mark is rejected (``invalid_encoding``). Duplicate keys in one
  JSON object are rejected (``duplicate_key``): a reader could not tell which value counts.
  ``NaN``/``Infinity``/``-Infinity`` literals and numbers that overflow to infinity (``1e999``) are
  rejected while parsing with the location named (``non_finite_metric`` under ``metrics[i].value``,
  ``non_finite_number`` elsewhere). An empty body or a top level other than an object is rejected.
* ``artifacts`` and ``metrics`` may be omitted (an empty list); ``complete`` and ``version`` may not.
  ``null`` is not accepted in place of a list or an object: leave the key out instead.
  ``artifactsManifest``/``models``/``datasets`` in a version 1 document are unknown keys.
* Paths: besides NUL/CR/LF every other C0 control character and DEL is rejected; empty components
  (``a//b``, a trailing ``/``) and ``.`` components are rejected so each file has exactly one
  spelling; the ``.partial``/``.tmp`` rule applies to the last component's name. Declared paths may not
  be ``result.json`` or the manifest itself. The same path twice (in ``artifacts``, the manifest or
  both) is ``duplicate_path``.
* ``sha256`` is 64 hex digits; upper case is accepted and returned in lower case. ``size`` is an
  integer 0..2^53-1 (never a boolean or ``1.0``). ``mimeType`` is ``type/subtype`` with optional
  parameters, at most 255 characters; when omitted it is guessed from the file name with Python's
  built-in table (never the host's ``/etc/mime.types``, so the answer is the same on every machine);
  compressed names map to their compression type (``x.tar.gz`` → ``application/gzip``), anything
  unknown is ``application/octet-stream``.
* File list from the worker: ``result.json`` may be listed or not (either is accepted); a ``dir``
  entry is never an error; the same path listed twice is ``duplicate_output_entry``; reported paths
  pass the same path rules as declared ones, and a regular file needs an integer size and a 64-digit
  sha256 (``invalid_file_list``). The file count limit counts regular files other than
  ``result.json`` and the manifest, and applies to the declared artifacts too.
* Manifest: the caller passes its text (decoded UTF-8; :func:`decode_manifest` does that with the
  limits; bytes passed to ``validate_result`` are decoded the same way). It must be listed as a
  regular file, and the text must hash to the sha256 the worker reported for it
  (``manifest_mismatch``). Lines are split on ``\\n``; a trailing ``\\r`` is tolerated; blank lines are
  skipped; each line is one JSON object; line numbers in messages count from 1. The whole text may be
  at most ``max_files`` × 4 KiB. ``artifacts`` and a manifest may both be used. ``manifest_text`` is
  ignored when the document declares no manifest.
* Metrics: name 1..250 characters (MLflow's key limit), no control characters, not only spaces; a
  ``value`` written as a string is rejected (``non_finite_metric`` when it spells NaN/inf, else
  ``invalid_metric_value``); ``step`` defaults to 0; ``timestamp`` is an ISO 8601 date-time with a
  time zone (``2024-05-01T12:00:00Z``), returned as written, or ``None`` when omitted (the caller
  stamps the time it received the result).
* Models: ``path`` must name a declared artifact file (a directory is rejected: name the weights
  file); the same path twice is rejected. ``modelId`` is an optional model reference (non-empty
  string of at most 100 characters, or a positive integer; returned as a string). ``metadata`` is an
  optional JSON object. Whether the run may declare models (training/fine-tuning runs, a token with
  ``registry:write``) is the caller's check: this module has no run.
* Datasets: ``datasetId`` is required (same shape as ``modelId``). ``path`` and ``uri`` are mutually
  exclusive and one is required. A ``digest`` next to ``path`` is rejected (``digest_not_allowed``);
  the returned digest for a path source is ``sha256:`` + the sha256 of the lines
  ``"<sha256> <size> <relative path>\\n"`` sorted by relative path. ``uri`` is at most 4000 characters
  and ``digest`` at most 1000, neither with control characters. A dataset directory may be written
  with one trailing ``/``; a path that names neither a declared file nor a directory holding declared
  files is ``undeclared_dataset_path``. A file path makes a one-file version named by its base name.
  The same (datasetId, path/uri) twice is ``duplicate_dataset``. ``schema``/``metadata`` are optional
  JSON objects.

Checks run in this order and the first problem is the one reported: the header (object, version,
unknown top-level keys, ``complete``), the files the worker listed (unsafe paths, symlinks, special
files, unfinished files, the file count), the list sizes (metrics, models, datasets), the manifest and
each declared artifact, the files against the declarations (missing, size, sha256, undeclared), then
metrics, models and datasets. Artifacts come back in declared order (the list, then the manifest's
lines); a dataset's ``files`` are sorted by their path inside the version.

Returned shapes (snake_case, as the API stores them)::

    artifacts: {path, sha256, size, mime_type}
    metrics:   {name, value: float, step: int, timestamp: str | None}
    models:    {path, model_id: str | None, sha256, size, metadata: dict}
    datasets:  {dataset_id, source: "path" | "uri", path: str | None, uri: str | None,
                is_directory: bool, digest: str, files: [{path, sha256, size}], file_count, size,
                schema: dict, metadata: dict}
"""
from __future__ import annotations

import hashlib
import json
import math
import mimetypes
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, NoReturn

RESULT_FILENAME = "result.json"
MAX_RESULT_BYTES = 1024 * 1024
DEFAULT_MAX_OUTPUT_FILES = 10_000
WORKER_LIMIT_SETTING = "MMT_WORKER_MAX_OUTPUT_FILES"  # the worker's, seed 001: the one a user changes
SERVER_LIMIT_SETTING = "MADO_MAX_OUTPUT_FILES"  # the server's maximum of it
MAX_PATH_LENGTH = 1024
MAX_MANIFEST_LINE_BYTES = 4096
MAX_METRIC_POINTS = 1000
MAX_MODELS = 16
MAX_DATASETS = 64
MAX_DATASET_DIRECTORY_FILES = 100_000
MAX_METRIC_STEP = 2**53 - 1
MAX_SIZE = 2**53 - 1
MAX_METRIC_NAME_LENGTH = 250
MAX_MIME_TYPE_LENGTH = 255
MAX_REFERENCE_ID_LENGTH = 100
MAX_URI_LENGTH = 4000
MAX_DIGEST_LENGTH = 1000
TEMPORARY_SUFFIXES = (".partial", ".tmp")

VERSION_KEYS = {
    1: ("version", "complete", "artifacts", "metrics"),
    2: ("version", "complete", "artifacts", "metrics", "artifactsManifest", "models", "datasets"),
}
ARTIFACT_KEYS = ("path", "sha256", "size", "mimeType")
METRIC_KEYS = ("name", "value", "step", "timestamp")
MODEL_KEYS = ("path", "modelId", "metadata")
DATASET_KEYS = ("datasetId", "path", "uri", "digest", "schema", "metadata")
FILE_KINDS = ("file", "symlink", "special", "dir")

_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MIME_TOKEN = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
_MIME = re.compile(rf"{_MIME_TOKEN}/{_MIME_TOKEN}(?:\s*;\s*[\x21-\x7e]+(?:\s*[\x21-\x7e]+)*)?")
_ISO_DATETIME = re.compile(
    r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:\.\d{1,9})?)?(?:Z|z|[+-]\d\d:?\d\d)"
)
_NON_FINITE_WORDS = {"nan", "+nan", "-nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"}
_COMPRESSION_TYPES = {
    "gzip": "application/gzip",
    "bzip2": "application/x-bzip2",
    "xz": "application/x-xz",
    "compress": "application/x-compress",
    "br": "application/x-brotli",
}
# Built from Python's own table only, so the guess does not depend on the host's mime.types files.
_MIME_TABLE = mimetypes.MimeTypes()


@dataclass(frozen=True)
class OutputFile:
    """One entry of the outputs directory as the worker saw it."""

    path: str  # relative POSIX path under the outputs directory
    size: int
    sha256: str  # lower-case hex; "" for symlinks/special files
    kind: str = "file"  # "file" | "symlink" | "special" | "dir"


class ResultError(Exception):
    """A rejected result: ``message`` says what to fix, ``code`` is a stable snake_case word."""

    def __init__(self, code: str, message: str, *, location: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.location = location

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"ResultError(code={self.code!r}, message={self.message!r})"


@dataclass(frozen=True)
class ValidatedResult:
    version: int
    artifacts: list[dict]  # [{path, sha256, size, mime_type}]
    metrics: list[dict]  # [{name, value: float, step: int, timestamp: str|None}]
    models: list[dict]
    datasets: list[dict]
    manifest_path: str | None


# --------------------------------------------------------------------------- helpers for messages


def _show(value: Any, limit: int = 80) -> str:
    """A value quoted for a message: JSON-escaped (control characters visible), long text cut."""
    if isinstance(value, str):
        text = value if len(value) <= limit else value[:limit] + "…"
        return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")
    if value is None or isinstance(value, bool):
        return json.dumps(value)  # null, true, false
    if isinstance(value, (int, float)):
        text = repr(value)
        return text if len(text) <= limit else text[:limit] + "…"
    return {dict: "an object", list: "a list"}.get(type(value), type(value).__name__)


# The first match names a value's JSON type (bool before int: a boolean is an int in Python).
_JSON_TYPES = ((type(None), "null"), (bool, "a boolean"), ((int, float), "a number"), (str, "a string"),
               (list, "a list"), (dict, "an object"))


def _json_type(value: Any) -> str:
    return next((name for kinds, name in _JSON_TYPES if isinstance(value, kinds)), type(value).__name__)


def _bytes_text(count: int) -> str:
    if count >= 1024 * 1024 and count % (1024 * 1024) == 0:
        return f"{count} bytes ({count // (1024 * 1024)} MiB)"
    return f"{count} bytes"


def _key_location(parent: str, key: str) -> str:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{parent}.{key}" if parent else key
    return f"{parent}[{json.dumps(key, ensure_ascii=False)}]"


def _fail(code: str, message: str, location: str | None = None) -> NoReturn:
    raise ResultError(code, message, location=location)


def _first_time(seen: set, key: Any, code: str, message: str, location: str | None = None) -> None:
    """Remember `key`; the same key a second time is the error `code`."""
    if key in seen:
        _fail(code, message, location)
    seen.add(key)


# --------------------------------------------------------------------------- parsing


class _NonFinite:
    __slots__ = ("literal",)

    def __init__(self, literal: str):
        self.literal = literal


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        self.key = key


def _object_pairs(pairs: list[tuple[str, Any]]) -> dict:
    result: dict = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def _parse_float(text: str) -> Any:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def _loads(text: str, what: str, hint: str) -> Any:
    """json.loads with duplicate keys, NaN/Infinity literals and overflowing numbers rejected."""
    try:
        value = json.loads(
            text, parse_constant=_NonFinite, parse_float=_parse_float, object_pairs_hook=_object_pairs
        )
    except _DuplicateKey as error:
        _fail("duplicate_key", f"{what} has the key {_show(error.key)} twice in one object; keep one of them.")
    except json.JSONDecodeError as error:
        _fail(
            "invalid_json",
            f"{what} is not valid JSON ({error.msg} at line {error.lineno} column {error.colno}); {hint}",
        )
    except RecursionError:
        _fail("invalid_json", f"{what} is nested too deeply to read; {hint}")
    except ValueError as error:  # e.g. an integer longer than Python's digit limit
        _fail("invalid_json", f"{what} could not be read ({error}); {hint}")
    found = _find_non_finite(value)
    if found is not None:
        location, literal = found
        code = "non_finite_metric" if re.fullmatch(r"metrics\[\d+\]\.value", location) else "non_finite_number"
        where = f" at {location}" if location else ""
        hint = " or leave that metric point out" if code == "non_finite_metric" else ""
        _fail(
            code,
            f"{what} has the non-finite number {literal}{where}; JSON has no NaN or Infinity — write a "
            f"finite number there{hint}.",
            location or None,
        )
    return value


def _find_non_finite(root: Any) -> tuple[str, str] | None:
    stack: list[tuple[Any, str]] = [(root, "")]
    while stack:
        value, location = stack.pop()
        if isinstance(value, _NonFinite):
            return location, value.literal
        if isinstance(value, dict):
            stack.extend((item, _key_location(location, key)) for key, item in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((item, f"{location}[{index}]") for index, item in reversed(list(enumerate(value))))
    return None


def parse_result_json(raw: bytes, *, max_bytes: int = MAX_RESULT_BYTES) -> dict:
    """Read ``result.json``: at most ``max_bytes``, strict UTF-8, one JSON object, no NaN/Infinity."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise TypeError("parse_result_json() takes the raw bytes of result.json")
    raw = bytes(raw)
    if len(raw) > max_bytes:
        _fail(
            "result_too_large",
            f"result.json is {len(raw)} bytes, over the limit of {_bytes_text(max_bytes)}; list thousands of "
            "files in an artifactsManifest JSON Lines file instead of the artifacts list, and keep metrics to at most "
            f"{MAX_METRIC_POINTS} points.",
        )
    if raw.startswith(b"\xef\xbb\xbf"):
        _fail(
            "invalid_encoding",
            "result.json starts with a UTF-8 byte order mark; write it as plain UTF-8 without a BOM.",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        _fail(
            "invalid_encoding",
            f"result.json is not valid UTF-8 (byte {error.start}); write the file as UTF-8 JSON.",
        )
    if not text.strip():
        _fail("invalid_json", "result.json is empty; write a JSON object such as {\"version\": 2, \"complete\": true}.")
    value = _loads(
        text,
        "result.json",
        "write one JSON object, for example {\"version\": 2, \"complete\": true, \"artifacts\": []}.",
    )
    if not isinstance(value, dict):
        _fail(
            "not_an_object",
            f"result.json holds {_json_type(value)}; it must be one JSON object such as "
            "{\"version\": 2, \"complete\": true, \"artifacts\": []}.",
        )
    return value


def fewer_files(limit_setting: str | None = WORKER_LIMIT_SETTING) -> str:
    """What to do about too many output files, naming the setting that decided the limit (None: none can
    change it)."""
    fewer = "write fewer output files (e.g. pack small files into an archive)"
    if limit_setting == SERVER_LIMIT_SETTING:
        return (f"{fewer}, or ask the server's administrator to raise {SERVER_LIMIT_SETTING} (the server's maximum, "
                f"lower than this worker's {WORKER_LIMIT_SETTING})")
    if limit_setting:
        return f"{fewer} or raise {limit_setting} on the worker"
    return fewer


def too_many_files(count: str, max_files: int, limit_setting: str | None = WORKER_LIMIT_SETTING) -> str:
    """The message of an outputs directory over the limit; `count` is how many files it holds ("12",
    "more than 10")."""
    return (f"The outputs directory holds {count} files; the limit is {max_files} — "
            f"{fewer_files(limit_setting)}.")


def decode_manifest(raw: bytes, *, max_files: int = DEFAULT_MAX_OUTPUT_FILES, path: str = "artifacts manifest") -> str:
    """The text of an artifacts manifest file, for ``validate_result(manifest_text=...)``."""
    limit = max_files * MAX_MANIFEST_LINE_BYTES
    if len(raw) > limit:
        _fail(
            "manifest_too_large",
            f"The artifacts manifest {_show(path)} is {len(raw)} bytes, over the limit of {limit} bytes "
            f"({max_files} lines of at most {MAX_MANIFEST_LINE_BYTES} bytes); list fewer files.",
        )
    if raw.startswith(b"\xef\xbb\xbf"):
        _fail(
            "invalid_encoding",
            f"The artifacts manifest {_show(path)} starts with a byte order mark; write it as plain UTF-8.",
        )
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError as error:
        _fail(
            "invalid_encoding",
            f"The artifacts manifest {_show(path)} is not valid UTF-8 (byte {error.start}); write it as UTF-8 JSON "
            "Lines.",
        )


# --------------------------------------------------------------------------- paths


def _check_path(
    path: Any, where: str, *, location: str | None, allow_trailing_slash: bool = False, is_file: bool = True
) -> str:
    """A safe relative POSIX path under the outputs directory, or a ResultError naming ``where``."""
    if not isinstance(path, str):
        _fail(
            "invalid_type",
            f"{where} is {_json_type(path)}; write the path as a string relative to the outputs directory.",
            location,
        )
    if path == "":
        _fail(
            "invalid_path",
            f"{where} is empty; write the file's path relative to the outputs directory, e.g. \"model/weights.bin\".",
            location,
        )
    if len(path) > MAX_PATH_LENGTH:
        _fail(
            "path_too_long",
            f"{where} {_show(path)} is {len(path)} characters long; paths may have at most "
            f"{MAX_PATH_LENGTH} characters — use shorter directory and file names.",
            location,
        )
    control = _CONTROL.search(path)
    if control:
        names = {"\x00": "NUL", "\r": "a carriage return (CR)", "\n": "a line feed (LF)"}
        name = names.get(control.group(), f"the control character U+{ord(control.group()):04X}")
        _fail(
            "control_character",
            f"{where} {_show(path)} contains {name}; rename the file without control characters.",
            location,
        )
    if "\\" in path:
        _fail(
            "backslash_in_path",
            f"{where} {_show(path)} contains a backslash; separate directories with \"/\" and do not use \"\\\" in "
            "names.",
            location,
        )
    if path.startswith("/"):
        _fail(
            "absolute_path",
            f"{where} {_show(path)} is absolute; write it relative to the outputs directory "
            "(\"model/weights.bin\", not \"/mmt/outputs/model/weights.bin\").",
            location,
        )
    body = path[:-1] if allow_trailing_slash and path.endswith("/") and len(path) > 1 else path
    parts = body.split("/")
    if ".." in parts:
        _fail(
            "path_traversal",
            f"{where} {_show(path)} uses \"..\" to leave its directory; only files inside the outputs directory can "
            "be declared — remove \"..\".",
            location,
        )
    if any(part in ("", ".") for part in parts):
        _fail(
            "invalid_path",
            f"{where} {_show(path)} has an empty or \".\" component; write each file with one spelling, "
            "without \"//\", \"./\" or a trailing \"/\".",
            location,
        )
    if is_file and parts[-1].endswith(TEMPORARY_SUFFIXES):
        _fail(
            "temporary_file",
            f"{where} {_show(path)} is an unfinished file (*.partial / *.tmp); finish writing it and rename it "
            "to its final name (or delete it), then write result.json last.",
            location,
        )
    return body


# --------------------------------------------------------------------------- small value checks


def _require_object(value: Any, where: str, location: str, example: str) -> dict:
    if not isinstance(value, dict):
        _fail("invalid_type", f"{where} is {_json_type(value)}; write an object such as {example}.", location)
    return value


def _require_list(result: dict, key: str, example: str) -> list:
    value = result.get(key, [])
    if not isinstance(value, list):
        _fail(
            "invalid_type",
            f"result.json \"{key}\" is {_json_type(value)}; write a list such as {example}, or leave the key out.",
            key,
        )
    return value


def _reject_unknown_keys(value: dict, allowed: tuple[str, ...], where: str, location: str) -> None:
    for key in value:
        if key not in allowed:
            _fail(
                "unknown_key",
                f"{where} has the unknown key {_show(key)}; remove it (allowed keys: {', '.join(allowed)}).",
                _key_location(location, key),
            )


def _require_key(value: dict, key: str, where: str, location: str, hint: str) -> Any:
    if key not in value:
        _fail("missing_key", f"{where} has no \"{key}\"; {hint}", _key_location(location, key))
    return value[key]


def _optional_object(value: dict, key: str, where: str, location: str) -> dict:
    if key not in value:
        return {}
    item = value[key]
    if not isinstance(item, dict):
        _fail(
            "invalid_type",
            f"{where} \"{key}\" is {_json_type(item)}; write a JSON object or leave it out.",
            _key_location(location, key),
        )
    return item


def _reference_id(value: Any, key: str, where: str, location: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        _fail(
            "invalid_reference",
            f"{where} \"{key}\" is {_json_type(value)}; write the ID as a string (or a positive integer).",
            location,
        )
    if isinstance(value, int):
        if value < 1:
            _fail(
                "invalid_reference",
                f"{where} \"{key}\" is {value}; IDs are positive integers or non-empty strings.",
                location,
            )
        return str(value)
    if not value.strip() or len(value) > MAX_REFERENCE_ID_LENGTH or _CONTROL.search(value):
        _fail(
            "invalid_reference",
            f"{where} \"{key}\" {_show(value)} is not an ID; write a non-empty string of at most "
            f"{MAX_REFERENCE_ID_LENGTH} characters without control characters.",
            location,
        )
    return value


def _plain_text(value: Any, key: str, where: str, location: str, maximum: int, code: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > maximum or _CONTROL.search(value):
        shown = _show(value) if isinstance(value, str) else _json_type(value)
        _fail(
            code,
            f"{where} \"{key}\" {shown} must be a non-empty string of at most {maximum} characters without control "
            "characters.",
            location,
        )
    return value


def _guess_mime_type(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    mime_type, encoding = _MIME_TABLE.guess_type(name, strict=True)
    if encoding:
        return _COMPRESSION_TYPES.get(encoding, "application/octet-stream")
    return mime_type or "application/octet-stream"


# --------------------------------------------------------------------------- artifacts


def _artifact(entry: Any, where: str, location: str, reserved: dict[str, str]) -> dict:
    example = '{"path": "model/weights.bin", "sha256": "<64 hex digits>", "size": 1048576}'
    entry = _require_object(entry, where, location, example)
    _reject_unknown_keys(entry, ARTIFACT_KEYS, where, location)
    path = _require_key(entry, "path", where, location, "write the file's path relative to the outputs directory.")
    path = _check_path(path, f"{where} path", location=_key_location(location, "path"))
    if path in reserved:
        _fail(
            "reserved_path",
            f"{where} declares {_show(path)}, which is {reserved[path]}; it is not an artifact — remove this entry.",
            _key_location(location, "path"),
        )
    sha256 = _require_key(entry, "sha256", where, location, f"write the sha256 of {_show(path)} as 64 hex digits.")
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
        _fail(
            "invalid_sha256",
            f"{where} sha256 {_show(sha256)} for {_show(path)} is not a SHA-256 digest; write the 64 hex digits "
            "that `sha256sum` prints for the file.",
            _key_location(location, "sha256"),
        )
    size = _require_key(entry, "size", where, location, f"write the size of {_show(path)} in bytes.")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_SIZE:
        _fail(
            "invalid_size",
            f"{where} size {_show(size)} for {_show(path)} is not a byte count; write the file's size as a whole "
            "number of bytes (0 or more, without a decimal point).",
            _key_location(location, "size"),
        )
    if "mimeType" in entry:
        mime_type = entry["mimeType"]
        if (
            not isinstance(mime_type, str)
            or len(mime_type) > MAX_MIME_TYPE_LENGTH
            or not _MIME.fullmatch(mime_type)
        ):
            _fail(
                "invalid_mime_type",
                f"{where} mimeType {_show(mime_type)} for {_show(path)} is not a media type; write one such as "
                f"\"application/octet-stream\" or \"text/plain; charset=utf-8\" (at most {MAX_MIME_TYPE_LENGTH} "
                "characters), or leave mimeType out.",
                _key_location(location, "mimeType"),
            )
    else:
        mime_type = _guess_mime_type(path)
    return {"path": path, "sha256": sha256.lower(), "size": size, "mime_type": mime_type}


def _manifest_entries(
    text: str, manifest_path: str, max_files: int, already: int, limit_setting: str | None
) -> list[tuple[Any, str, str]]:
    name = f"artifactsManifest {_show(manifest_path)}"
    limit = max_files * MAX_MANIFEST_LINE_BYTES
    if len(text) > limit:  # characters ≤ bytes, so this is a cheap first bound
        _fail(
            "manifest_too_large",
            f"The {name} is over {limit} bytes; list at most {max_files} files, one per line.",
            "artifactsManifest",
        )
    entries: list[tuple[Any, str, str]] = []
    for number, line in enumerate(text.split("\n"), start=1):
        if line.endswith("\r"):
            line = line[:-1]
        if not line.strip():
            continue
        where = f"{name} line {number}"
        location = f"artifactsManifest:{number}"
        size = len(line.encode("utf-8"))
        if size > MAX_MANIFEST_LINE_BYTES:
            _fail(
                "manifest_line_too_long",
                f"The {name} line {number} is {size} bytes; each line may have at most "
                f"{MAX_MANIFEST_LINE_BYTES} bytes — write one {{\"path\", \"sha256\", \"size\"}} object per line "
                "with a shorter path.",
                location,
            )
        hint = (
            'write exactly one JSON object per line, e.g. {"path": "a.wav", "sha256": "<64 hex digits>", '
            '"size": 1234}.'
        )
        try:
            value = _loads(line, f"The {name} line {number}", hint)
        except ResultError as error:
            if error.code == "invalid_json":
                error.code = "manifest_malformed"
            error.location = location
            raise
        if not isinstance(value, dict):
            _fail("manifest_malformed", f"The {name} line {number} holds {_json_type(value)}; {hint}", location)
        entries.append((value, where, location))
        if already + len(entries) > max_files:
            _fail(
                "too_many_files",
                f"The declared artifacts exceed the limit of {max_files} files at {name} line {number}; "
                f"{fewer_files(limit_setting)}.",
                location,
            )
    return entries


# --------------------------------------------------------------------------- metrics


def _metric(entry: Any, index: int) -> dict:
    where = f"metrics[{index}]"
    entry = _require_object(entry, where, where, '{"name": "train.loss", "value": 0.12, "step": 100}')
    _reject_unknown_keys(entry, METRIC_KEYS, where, where)
    name = _require_key(entry, "name", where, where, "write the metric's name, e.g. \"train.loss\".")
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_METRIC_NAME_LENGTH or _CONTROL.search(name):
        shown = _show(name) if isinstance(name, str) else _json_type(name)
        _fail(
            "invalid_metric_name",
            f"{where} name {shown} is not a metric name; write a non-empty string of at most "
            f"{MAX_METRIC_NAME_LENGTH} characters without control characters, e.g. \"train.loss\".",
            f"{where}.name",
        )
    value = _require_key(entry, "value", where, where, f"write the value of {_show(name)} as a number.")
    if isinstance(value, str):
        if value.strip().lower() in _NON_FINITE_WORDS:
            _fail(
                "non_finite_metric",
                f"{where} value {_show(value)} for {_show(name)} is not a finite number; NaN and infinity cannot be "
                "stored — write a finite number or leave this point out.",
                f"{where}.value",
            )
        _fail(
            "invalid_metric_value",
            f"{where} value {_show(value)} for {_show(name)} is a string; write the value as a JSON number without "
            "quotes.",
            f"{where}.value",
        )
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(
            "invalid_metric_value",
            f"{where} value for {_show(name)} is {_json_type(value)}; write the value as a JSON number.",
            f"{where}.value",
        )
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        _fail(
            "non_finite_metric",
            f"{where} value for {_show(name)} is not finite; NaN and infinity cannot be stored — write a finite "
            "number or leave this point out.",
            f"{where}.value",
        )
    step = entry.get("step", 0)
    if isinstance(step, bool) or not isinstance(step, int):
        _fail(
            "invalid_step",
            f"{where} step {_show(step)} for {_show(name)} is not an integer; write a whole number from 0 to "
            f"{MAX_METRIC_STEP} without a decimal point.",
            f"{where}.step",
        )
    if not 0 <= step <= MAX_METRIC_STEP:
        _fail(
            "invalid_step",
            f"{where} step {step} for {_show(name)} is out of range; steps are whole numbers from 0 to "
            f"{MAX_METRIC_STEP}.",
            f"{where}.step",
        )
    timestamp = entry.get("timestamp")
    if "timestamp" in entry:
        if not isinstance(timestamp, str) or not _ISO_DATETIME.fullmatch(timestamp) or not _valid_datetime(timestamp):
            _fail(
                "invalid_timestamp",
                f"{where} timestamp {_show(timestamp)} for {_show(name)} is not an ISO 8601 date-time with a "
                "time zone; write e.g. \"2024-05-01T12:00:00Z\" or leave timestamp out.",
                f"{where}.timestamp",
            )
    return {"name": name, "value": number, "step": step, "timestamp": timestamp}


def _valid_datetime(text: str) -> bool:
    normalized = text[:-1] + "+00:00" if text[-1] in "Zz" else text
    try:
        parsed = datetime.fromisoformat(normalized)
    except ValueError:
        return False
    return parsed.tzinfo is not None


# --------------------------------------------------------------------------- models and datasets


def _model(entry: Any, index: int, artifacts: dict[str, dict], directories: set[str], seen: set[str]) -> dict:
    where = f"models[{index}]"
    entry = _require_object(entry, where, where, '{"path": "model/weights.bin"}')
    _reject_unknown_keys(entry, MODEL_KEYS, where, where)
    path = _require_key(
        entry,
        "path",
        where,
        where,
        "write the path of the weights file, which must also be a declared artifact.",
    )
    path = _check_path(path, f"{where} path", location=f"{where}.path")
    if path not in artifacts:
        if path in directories:
            _fail(
                "undeclared_model_path",
                f"{where} path {_show(path)} is a directory; name the weights file itself (a declared artifact).",
                f"{where}.path",
            )
        _fail(
            "undeclared_model_path",
            f"{where} path {_show(path)} is not a declared artifact; list the weights file in artifacts (or the "
            "manifest) with its sha256 and size, or fix the path.",
            f"{where}.path",
        )
    _first_time(seen, path, "duplicate_model",
                f"{where} declares {_show(path)} a second time; declare each model file once.", f"{where}.path")
    model_id = None
    if "modelId" in entry:
        model_id = _reference_id(entry["modelId"], "modelId", where, f"{where}.modelId")
    metadata = _optional_object(entry, "metadata", where, where)
    artifact = artifacts[path]
    return {
        "path": path,
        "model_id": model_id,
        "sha256": artifact["sha256"],
        "size": artifact["size"],
        "metadata": metadata,
    }


def _path_digest(files: list[dict]) -> str:
    digest = hashlib.sha256()
    for item in files:
        digest.update(f"{item['sha256']} {item['size']} {item['path']}\n".encode("utf-8"))
    return "sha256:" + digest.hexdigest()


def _dataset(entry: Any, index: int, artifacts: dict[str, dict], ordered_paths: list[str], seen: set) -> dict:
    where = f"datasets[{index}]"
    entry = _require_object(entry, where, where, '{"datasetId": "<dataset ID>", "path": "prepared"}')
    _reject_unknown_keys(entry, DATASET_KEYS, where, where)
    dataset_id = _require_key(
        entry,
        "datasetId",
        where,
        where,
        "write the ID of the dataset that receives this version.",
    )
    dataset_id = _reference_id(dataset_id, "datasetId", where, f"{where}.datasetId")
    has_path, has_uri = "path" in entry, "uri" in entry
    if has_path == has_uri:
        _fail(
            "invalid_dataset_source",
            f"{where} has {'both' if has_path else 'neither'} \"path\" and \"uri\"; write exactly one: \"path\" for "
            "output files, or \"uri\" with a \"digest\" for data stored elsewhere.",
            where,
        )
    schema = _optional_object(entry, "schema", where, where)
    metadata = _optional_object(entry, "metadata", where, where)
    if has_uri:
        uri = _plain_text(entry["uri"], "uri", where, f"{where}.uri", MAX_URI_LENGTH, "invalid_uri")
        if "digest" not in entry:
            _fail(
                "missing_digest",
                f"{where} names the uri {_show(uri)} without a \"digest\"; a dataset given by uri needs its digest.",
                f"{where}.digest",
            )
        digest = _plain_text(entry["digest"], "digest", where, f"{where}.digest", MAX_DIGEST_LENGTH, "invalid_digest")
        _first_time(seen, (dataset_id, "uri", uri), "duplicate_dataset",
                    f"{where} declares the uri {_show(uri)} for dataset {_show(dataset_id)} a second time; declare "
                    "it once.", where)
        return {
            "dataset_id": dataset_id, "source": "uri", "path": None, "uri": uri, "is_directory": False,
            "digest": digest, "files": [], "file_count": 0, "size": 0, "schema": schema, "metadata": metadata,
        }
    if "digest" in entry:
        _fail(
            "digest_not_allowed",
            f"{where} has a \"digest\" next to \"path\"; remove it — the server computes the digest of output files "
            "itself.",
            f"{where}.digest",
        )
    path = _check_path(entry["path"], f"{where} path", location=f"{where}.path", allow_trailing_slash=True)
    if path in artifacts:
        artifact = artifacts[path]
        files = [{"path": path.rsplit("/", 1)[-1], "sha256": artifact["sha256"], "size": artifact["size"]}]
        is_directory = False
    else:
        prefix = path + "/"
        files = [
            {"path": name[len(prefix):], "sha256": artifacts[name]["sha256"], "size": artifacts[name]["size"]}
            for name in ordered_paths
            if name.startswith(prefix)
        ]
        if not files:
            _fail(
                "undeclared_dataset_path",
                f"{where} path {_show(path)} is neither a declared artifact nor a directory holding declared "
                "artifacts; declare the files (in artifacts or the manifest) or fix the path.",
                f"{where}.path",
            )
        if len(files) > MAX_DATASET_DIRECTORY_FILES:
            _fail(
                "too_many_dataset_files",
                f"{where} directory {_show(path)} holds {len(files)} files; one dataset version may have at most "
                f"{MAX_DATASET_DIRECTORY_FILES} — split it into several directories or datasets.",
                f"{where}.path",
            )
        is_directory = True
    _first_time(seen, (dataset_id, "path", path), "duplicate_dataset",
                f"{where} declares {_show(path)} for dataset {_show(dataset_id)} a second time; declare it once.",
                f"{where}.path")
    files.sort(key=lambda item: item["path"])
    return {
        "dataset_id": dataset_id, "source": "path", "path": path, "uri": None, "is_directory": is_directory,
        "digest": _path_digest(files), "files": files, "file_count": len(files),
        "size": sum(item["size"] for item in files), "schema": schema, "metadata": metadata,
    }


# --------------------------------------------------------------------------- the whole result


def _header(result: Any) -> int:
    if not isinstance(result, dict):
        _fail(
            "not_an_object",
            f"result.json holds {_json_type(result)}; it must be one JSON object such as {{\"version\": 2, "
            f"\"complete\": true}}.",
        )
    version = _require_key(result, "version", "result.json", "", "write \"version\": 2 (or 1).")
    if isinstance(version, bool) or not isinstance(version, int) or version not in VERSION_KEYS:
        _fail(
            "unsupported_version",
            f"result.json \"version\" is {_show(version)}; write the integer 1 or 2 (2 for artifactsManifest, models "
            "and datasets).",
            "version",
        )
    for key in result:
        if key not in VERSION_KEYS[version]:
            if version == 1 and key in VERSION_KEYS[2]:
                _fail(
                    "unknown_key",
                    f"result.json version 1 has the key {_show(key)}, which exists only in version 2; write "
                    "\"version\": 2 or remove it.",
                    key,
                )
            _fail(
                "unknown_key",
                f"result.json has the unknown key {_show(key)}; remove it (allowed keys in version {version}: "
                f"{', '.join(VERSION_KEYS[version])}).",
                _key_location("", key),
            )
    complete = _require_key(result, "complete", "result.json", "",
                            "write \"complete\": true once every output file has been written.")
    if complete is not True:
        _fail(
            "not_complete",
            f"result.json \"complete\" is {_show(complete)}; the outputs are accepted only when it is true — "
            "finish writing every output, then write \"complete\": true.",
            "complete",
        )
    return version


def _present_files(files: Iterable[OutputFile]) -> tuple[dict[str, OutputFile], set[str]]:
    present: dict[str, OutputFile] = {}
    directories: set[str] = set()
    seen: set[str] = set()
    for entry in files:
        if not isinstance(entry, OutputFile):
            raise TypeError("validate_result() takes a list of OutputFile")
        where = "The output file"
        if entry.kind not in FILE_KINDS:
            _fail(
                "invalid_file_list",
                f"The worker reported {_show(entry.path)} with the unknown kind {_show(entry.kind)}; expected one of "
                f"{', '.join(FILE_KINDS)}.",
            )
        is_dir = entry.kind == "dir"
        path = _check_path(entry.path, where, location=None, allow_trailing_slash=is_dir, is_file=not is_dir)
        _first_time(seen, path, "duplicate_output_entry",
                    f"The worker reported {_show(path)} twice in the outputs file list; each path must appear once.")
        if entry.kind == "symlink":
            _fail(
                "symlink",
                f"The outputs directory holds the symbolic link {_show(path)}; symlinks are not accepted — copy the "
                "real file into the outputs directory or delete the link.",
            )
        if entry.kind == "special":
            _fail(
                "special_file",
                f"The outputs directory holds {_show(path)}, which is not a regular file (a FIFO, socket or device); "
                "remove it — only regular files can be outputs.",
            )
        if entry.kind == "dir":
            directories.add(path)
            continue
        if isinstance(entry.size, bool) or not isinstance(entry.size, int) or entry.size < 0 or not (
            isinstance(entry.sha256, str) and _SHA256.fullmatch(entry.sha256)
        ):
            _fail(
                "invalid_file_list",
                f"The worker reported {_show(path)} without a byte size and a 64-digit sha256; report every regular "
                "file as {path, size, sha256, kind}.",
            )
        present[path] = entry
    return present, directories


def validate_result(
    result: dict,
    files: list[OutputFile],
    *,
    manifest_text: str | None = None,  # bytes are accepted too and decoded as strict UTF-8
    max_files: int = DEFAULT_MAX_OUTPUT_FILES,
    limit_setting: str | None = WORKER_LIMIT_SETTING,  # the setting that decided max_files, named in messages
) -> ValidatedResult:
    """Check a parsed ``result.json`` against the outputs directory; raise :class:`ResultError`."""
    if isinstance(max_files, bool) or not isinstance(max_files, int) or max_files < 1:
        raise ValueError("max_files must be a positive integer")
    if isinstance(manifest_text, (bytes, bytearray)):
        manifest_text = decode_manifest(bytes(manifest_text), max_files=max_files)
    elif manifest_text is not None and not isinstance(manifest_text, str):
        _fail("invalid_type", "The artifacts manifest must be sent as text (the file's UTF-8 content).")
    version = _header(result)

    manifest_path = None
    if "artifactsManifest" in result:
        manifest_path = _check_path(
            result["artifactsManifest"],
            "result.json artifactsManifest",
            location="artifactsManifest",
        )
        if manifest_path == RESULT_FILENAME:
            _fail(
                "reserved_path",
                "result.json artifactsManifest points at result.json itself; write the list to a separate file such "
                "as \"artifacts.jsonl\".",
                "artifactsManifest",
            )
    reserved = {RESULT_FILENAME: "result.json itself"}
    if manifest_path:
        reserved[manifest_path] = "the artifactsManifest file"

    present, directories = _present_files(files)
    counted = [path for path in present if path not in reserved]
    if len(counted) > max_files:
        _fail(
            "too_many_files",
            too_many_files(str(len(counted)), max_files, limit_setting),
        )

    # Declared artifacts: the list first, then the manifest's lines.
    listed = _require_list(
        result,
        "artifacts",
        '[{"path": "model/weights.bin", "sha256": "<64 hex digits>", "size": 1048576}]',
    )
    if len(listed) > max_files:
        _fail(
            "too_many_files",
            f"result.json declares {len(listed)} artifacts; the limit is {max_files} files — "
            f"{fewer_files(limit_setting)}.",
            "artifacts",
        )
    candidates: list[tuple[Any, str, str]] = [
        (item, f"artifacts[{i}]", f"artifacts[{i}]") for i, item in enumerate(listed)
    ]
    metrics_raw = _require_list(result, "metrics", '[{"name": "train.loss", "value": 0.12, "step": 100}]')
    # Version 1 has neither key (_header refused them).
    models_raw = _require_list(result, "models", '[{"path": "model/weights.bin"}]')
    datasets_raw = _require_list(result, "datasets", '[{"datasetId": "<dataset ID>", "path": "prepared"}]')
    if len(metrics_raw) > MAX_METRIC_POINTS:
        _fail(
            "too_many_metrics",
            f"result.json has {len(metrics_raw)} metric points; the limit is {MAX_METRIC_POINTS} — log the rest from "
            "the code with the SDK, or keep fewer points.",
            "metrics",
        )
    if len(models_raw) > MAX_MODELS:
        _fail(
            "too_many_models",
            f"result.json declares {len(models_raw)} models; the limit is {MAX_MODELS} per run — declare fewer.",
            "models",
        )
    if len(datasets_raw) > MAX_DATASETS:
        _fail(
            "too_many_datasets",
            f"result.json declares {len(datasets_raw)} datasets; the limit is {MAX_DATASETS} per run — declare fewer "
            "(a directory path makes one version of many files).",
            "datasets",
        )

    if manifest_path:
        manifest_file = present.get(manifest_path)
        if manifest_file is None:
            _fail(
                "missing_file",
                f"result.json artifactsManifest names {_show(manifest_path)}, which is not in the outputs directory; "
                "write the manifest before result.json or fix the path.",
                "artifactsManifest",
            )
        if manifest_text is None:
            _fail(
                "manifest_unavailable",
                f"The text of the artifactsManifest {_show(manifest_path)} was not received; the worker must send it "
                "with result.json.",
                "artifactsManifest",
            )
        received = hashlib.sha256(manifest_text.encode("utf-8")).hexdigest()
        if received != manifest_file.sha256.lower():
            _fail(
                "manifest_mismatch",
                f"The text received for the artifactsManifest {_show(manifest_path)} does not match the file's "
                "sha256; the manifest changed while it was read — write it completely before result.json.",
                "artifactsManifest",
            )
        candidates.extend(_manifest_entries(manifest_text, manifest_path, max_files, len(candidates), limit_setting))

    artifacts: list[dict] = []
    by_path: dict[str, dict] = {}
    for entry, where, location in candidates:
        artifact = _artifact(entry, where, location, reserved)
        if artifact["path"] in by_path:
            _fail(
                "duplicate_path",
                f"{where} declares {_show(artifact['path'])} again; each file may be declared once — remove the "
                "duplicate.",
                _key_location(location, "path"),
            )
        by_path[artifact["path"]] = artifact
        artifacts.append(artifact)

    for artifact, (_, where, location) in zip(artifacts, candidates):
        path = artifact["path"]
        actual = present.get(path)
        if actual is None:
            what = "a directory" if path in directories else "not in the outputs directory"
            _fail(
                "missing_file",
                f"{where} declares {_show(path)}, which is {what}; write the file before result.json, or remove the "
                "entry.",
                _key_location(location, "path"),
            )
        if actual.size != artifact["size"]:
            _fail(
                "size_mismatch",
                f"{where} declares {_show(path)} with size {artifact['size']} but the file has {actual.size} "
                "bytes; write result.json after the file is complete, with its real size.",
                _key_location(location, "size"),
            )
        if actual.sha256.lower() != artifact["sha256"]:
            _fail(
                "sha256_mismatch",
                f"{where} declares {_show(path)} with sha256 {artifact['sha256']} but the file's sha256 is "
                f"{actual.sha256.lower() or 'unknown'}; recompute it after the file is complete.",
                _key_location(location, "sha256"),
            )

    extra = sorted(path for path in present if path not in by_path and path not in reserved)
    if extra:
        more = f" and {len(extra) - 1} more" if len(extra) > 1 else ""
        _fail(
            "undeclared_file",
            f"The outputs directory holds {_show(extra[0])}{more}, not declared in result.json; declare every output "
            "file in artifacts (or the artifactsManifest) with its sha256 and size, or delete it.",
        )

    metrics = [_metric(entry, index) for index, entry in enumerate(metrics_raw)]
    all_directories = directories | {
        "/".join(parts[:n]) for parts in (path.split("/") for path in by_path) for n in range(1, len(parts))
    }
    model_paths: set[str] = set()
    models = [_model(entry, index, by_path, all_directories, model_paths) for index, entry in enumerate(models_raw)]
    dataset_keys: set = set()
    ordered = [artifact["path"] for artifact in artifacts]
    datasets = [_dataset(entry, index, by_path, ordered, dataset_keys) for index, entry in enumerate(datasets_raw)]
    return ValidatedResult(
        version=version,
        artifacts=artifacts,
        metrics=metrics,
        models=models,
        datasets=datasets,
        manifest_path=manifest_path,
    )
