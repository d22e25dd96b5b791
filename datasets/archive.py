"""A complete version (or some of its files) as one uncompressed tar stream: what the relay pipes into
a computer's dataset cache over one SSH channel instead of one request per file (docs/datasets.md,
"The archive"). Read only: nothing here changes state.

Members are regular files named by their manifest path with the manifest's size, mode 0644 and mtime 0,
in PAX format (UTF-8 and long paths), in the order asked for (the manifest's order when no list is
given). The headers are made with tarfile.TarInfo.tobuf, exactly as tarfile's own writer makes them;
the data blocks are streamed from storage, because tarfile's writer reads a whole member at once.

Verification: the bytes were checked against their sha256 when they were stored; as they are read
again they are hashed, and the last block of every member is held back until its digest matches the
manifest. A file whose stored bytes no longer match (or that is shorter, or gone) ends the stream
right there, short of that member's end: the reader sees a cut archive, never a complete member with
wrong bytes. The computer's cache checks every sha256 again before the version counts."""
from __future__ import annotations

import hashlib
import logging
import tarfile
from collections.abc import Iterator

from django.http import StreamingHttpResponse

from datasets.models import DatasetEntry, DatasetVersion
from datasets.services import media
from mado.errors import Conflict, ServiceError
from mado.validation import text_problem

log = logging.getLogger(__name__)

BLOCK = 1 << 20
MAX_FILES = 100_000  # a version holds at most this many


def member_header(path: str, size: int) -> bytes:
    info = tarfile.TarInfo(path)
    info.size, info.mode, info.mtime, info.type = size, 0o644, 0, tarfile.REGTYPE
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


def clean_files(raw) -> list[str] | None:
    """The `files` parameter: None (the whole version) or a list of distinct manifest paths."""
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw) or len(raw) > MAX_FILES:
        raise ServiceError(f"files is a list of at most {MAX_FILES} paths of the version's manifest.",
                           "invalid_files", fields={"files": ["A list of paths."]})
    if any(text_problem(p) for p in raw):
        # Not echoed back: a path with a NUL or half a surrogate pair can be neither stored nor answered.
        raise ServiceError("files names a path with a NUL character or an unpaired surrogate; no manifest path "
                           "has one. Send the paths as the manifest lists them.", "invalid_files",
                           fields={"files": ["Unstorable characters."]})
    if len(set(raw)) != len(raw):
        raise ServiceError("files names a path twice; name each file once.", "invalid_files",
                           fields={"files": ["Duplicate path."]})
    return raw


def members(version: DatasetVersion, paths: list[str] | None) -> list[tuple[str, str, int, str]]:
    """(path, sha256, size, stored location) of each member, in the order they will be sent. Every
    file must be in the manifest and its bytes present now: a 404 before the first byte is clearer
    than a cut stream."""
    if not version.is_complete:
        raise Conflict("This version is still uploading; read its files once it is complete.", "version_incomplete")
    rows = DatasetEntry.objects.filter(version=version).order_by("path").values_list(
        "path", "sha256", "size", "file__file")
    if paths is not None:
        wanted = set(paths)
        by_path = {row[0]: row for row in rows.filter(path__in=wanted)} if len(wanted) < 5000 else \
            {row[0]: row for row in rows if row[0] in wanted}
        unknown = [p for p in paths if p not in by_path]
        if unknown:
            raise ServiceError(f"{unknown[0]} is not in this version's manifest ({len(unknown)} such path(s)); "
                               "ask only for paths of the manifest.", "not_in_manifest", status=404)
        rows = [by_path[p] for p in paths]
    out = []
    for path, sha256, size, name in rows:
        location = str(media(name)) if name else ""
        if not location or not media(name).is_file():
            raise ServiceError(f"The server no longer holds the bytes of {path}; upload the version again.",
                               "file_missing", status=404)
        out.append((path, sha256, size, location))
    return out


def stream(version_id: int, items: list[tuple[str, str, int, str]]) -> Iterator[bytes]:
    """The tar, in blocks of about BLOCK bytes; small members are gathered into one block."""
    pending: list[bytes] = []
    pending_size = 0
    for path, sha256, size, location in items:
        pending.append(member_header(path, size))
        pending_size += len(pending[-1])
        digest, left, held = hashlib.sha256(), size, b""
        try:
            with open(location, "rb") as handle:
                while left > 0:
                    block = handle.read(min(left, BLOCK))
                    if not block:
                        break
                    left -= len(block)
                    digest.update(block)
                    if held:
                        pending.append(held)
                        pending_size += len(held)
                    held = block
                    if pending_size >= BLOCK:
                        yield b"".join(pending)
                        pending, pending_size = [], 0
        except OSError as exc:
            log.error("dataset version %s: %s could not be read for the archive (%s); the stream stops here",
                      version_id, path, exc)
            break
        if left or digest.hexdigest() != sha256:
            # Held back: the member stays short, so no reader takes these bytes for the file.
            log.error("dataset version %s: the stored bytes of %s do not match the manifest's sha256 and size; the "
                      "archive stops before its end", version_id, path)
            break
        pending.append(held + b"\0" * (-size % tarfile.BLOCKSIZE))
        pending_size += len(pending[-1])
        if pending_size >= BLOCK:
            yield b"".join(pending)
            pending, pending_size = [], 0
    else:
        pending.append(b"\0" * (2 * tarfile.BLOCKSIZE))
    if pending:
        yield b"".join(pending)


def response_for(version: DatasetVersion, paths: list[str] | None):
    items = members(version, paths)
    response = StreamingHttpResponse(stream(version.pk, items), content_type="application/x-tar")
    response["X-Archive-Files"] = str(len(items))
    response["X-Archive-Bytes"] = str(sum(item[2] for item in items))
    response["Content-Disposition"] = f'attachment; filename="dataset-version-{version.pk}.tar"'
    return response
