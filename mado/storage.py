"""Receiving uploaded bytes: streamed to disk with their sha256, never held in memory whole."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from pathlib import Path

CHUNK = 1024 * 1024


class UploadTooLarge(Exception):
    pass


def receive(readable, destination: Path, *, limit: int, append: bool = False) -> int:
    """Copy a request body to `destination`, refusing more than `limit` bytes in all; returns bytes written."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    written = destination.stat().st_size if append and destination.exists() else 0
    with open(destination, "ab" if append else "wb") as out:
        while True:
            block = readable.read(CHUNK)
            if not block:
                break
            written += len(block)
            if written > limit:
                raise UploadTooLarge(written)
            out.write(block)
    return written


def keep_if_hash(readable, part: Path, target: Path, sha256: str, *, size: int | None = None) -> bool:
    """Write `readable`'s bytes (to its end, or exactly `size` of them) to `part`, then move them to
    `target` if they hash to `sha256`: True. Bytes that do not match are removed, `target` untouched:
    False. A body that ends before `size` raises EOFError (nothing kept)."""
    digest = hashlib.sha256()
    left = size
    try:
        with open(part, "wb") as out:
            while left is None or left > 0:
                block = readable.read(CHUNK if left is None else min(left, CHUNK))
                if not block:
                    if left is None:
                        break
                    raise EOFError(f"{left} bytes short")
                digest.update(block)
                out.write(block)
                if left is not None:
                    left -= len(block)
        if digest.hexdigest() != sha256:
            return False
        os.replace(part, target)
        return True
    finally:
        remove(part)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def remove(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


@contextlib.contextmanager
def exclusive(path: Path):
    """Hold a lock file next to `path` without waiting; yields whether the lock was taken. Two
    uploads of the same part would otherwise interleave their bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
