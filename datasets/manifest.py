"""A version's manifest as a client sends it: checked, put in canonical order, and digested.

The digest is the one result.json declarations get (worker_agent.results): "sha256:" + the sha256 of
the lines "<sha256> <size> <path>\\n" sorted by path. The same files give the same digest whether
they were uploaded or written by a job."""
from __future__ import annotations

import re

from mado.errors import ServiceError
from worker_agent import results

MAX_FILES = results.MAX_DATASET_DIRECTORY_FILES
MAX_PATH_BYTES = 1024
MAX_SIZE = results.MAX_SIZE
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def digest(entries: list[dict]) -> str:
    """`entries` sorted by path."""
    return results._path_digest(entries)


def path_problem(path) -> str | None:
    """Why `path` cannot name a file inside a version, or None. One spelling per file: relative,
    '/'-separated, no empty, '.' or '..' component, no backslash or control character (NUL included)."""
    if not isinstance(path, str) or not path:
        return "a path is a non-empty string"
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        return f"a path is at most {MAX_PATH_BYTES} bytes"
    if _CONTROL.search(path):
        return "a path may not hold control characters (NUL, newlines, …)"
    if "\\" in path:
        return "write paths with '/', not '\\'"
    if path.startswith("/"):
        return "a path is relative to the dataset's top directory; remove the leading '/'"
    parts = path.split("/")
    if ".." in parts:
        return "a path may not contain '..'"
    if any(part in ("", ".") for part in parts):
        return "a path may not have empty or '.' components ('a//b', 'a/./b', a trailing '/')"
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return "a path must be valid UTF-8"
    return None


def _invalid(message: str, location: str) -> ServiceError:
    return ServiceError(message, "invalid_manifest", fields={location: [message]})


def _entry(item, index: int) -> dict:
    where = f"manifest[{index}]"
    if not isinstance(item, dict) or set(item) - {"path", "sha256", "size"}:
        raise _invalid(f"{where} must be an object with path, sha256 and size only.", where)
    problem = path_problem(item.get("path"))
    if problem:
        raise _invalid(f"{where}.path: {problem}.", f"{where}.path")
    sha = item.get("sha256")
    if not isinstance(sha, str) or not _SHA256.match(sha.lower()):
        raise _invalid(f"{where}.sha256 must be the 64 hex digits of the file's SHA-256.", f"{where}.sha256")
    size = item.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_SIZE:
        raise _invalid(f"{where}.size must be the file's size in bytes, a whole number from 0.", f"{where}.size")
    return {"path": item["path"], "sha256": sha.lower(), "size": size}


def clean(raw) -> list[dict]:
    """The manifest in canonical order, or a ServiceError naming the first problem."""
    if not isinstance(raw, list) or not raw:
        raise _invalid("manifest lists the version's files: [{path, sha256, size}, …], at least one.", "manifest")
    if len(raw) > MAX_FILES:
        raise ServiceError(f"A dataset version holds at most {MAX_FILES} files; this manifest lists {len(raw)}. "
                           "Split the files into several datasets, or pack small files into archives.",
                           "too_many_files", fields={"manifest": ["Too many files."]})
    entries = sorted((_entry(item, index) for index, item in enumerate(raw)), key=lambda e: e["path"])
    _check_layout(entries)
    return entries


def _check_layout(entries: list[dict]) -> None:
    """Each path once, and no file where another path needs a directory ('a' and 'a/b')."""
    paths = set()
    for entry in entries:
        if entry["path"] in paths:
            raise _invalid(f"{entry['path']} is listed twice; list each file once.", "manifest")
        paths.add(entry["path"])
    for entry in entries:
        parts = entry["path"].split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent in paths:
                raise _invalid(f"{parent} is a file, but {entry['path']} needs it to be a directory; rename one.",
                               "manifest")
