"""Sending a job's stdout/stderr to the server as frames of bytes (docs/logs.md).

The follow stream hands the worker chunks of at most 256 KiB; `merge` joins the contiguous ones of
a stream into chunks of up to MERGED_BYTES, and `post_frames` sends a batch of them as one body of
frames (`<stream> <offset> <length>\\n` and the bytes) to worker/jobs/{id}/log-frames: no JSON to
encode here or decode there, and one row per merged chunk. A server without that endpoint answers
404; the caller then sends the same chunks as JSON (worker/jobs/{id}/logs) as before.

`Throughput` writes the worker's log line with MB/s after a large delivery: while the worker is
behind (every batch full) it counts, and once it has caught up (or the job ended) it says how many
MB went in how long, when that was at least REPORT_BYTES."""
from __future__ import annotations

import time

from worker_agent.api import ApiClient, ApiError
from worker_agent.supervisor import LogChunk

MERGED_BYTES = 4 << 20  # one row on the server; a body holds ≤ 32 MiB
JSON_CHUNK_BYTES = 256 << 10  # what the follow stream hands over; the JSON endpoint takes ≤ 1 MiB a chunk
REPORT_BYTES = 10 * 10 ** 6


def cut_points(pending: list) -> frozenset:
    """Where the chunks of a batch in flight when the worker stopped began and ended, as (stream, offset):
    the Rechunker cuts the re-sent chunks there, and `merge` must keep them so, because the server may
    already hold them under those offsets (a merged chunk at a stored offset would be ignored whole)."""
    return frozenset(cut for stream, offset, length in pending
                     for cut in ((stream, int(offset)), (stream, int(offset) + int(length))))


def merge(batch: list[LogChunk], limit: int = MERGED_BYTES, cuts: frozenset = frozenset()) -> list[LogChunk]:
    """Join neighbouring chunks of the same stream whose bytes follow each other, up to `limit` bytes
    each, never across one of `cuts`; the order of the batch (stdout and stderr as they arrived) is kept."""
    out: list[LogChunk] = []
    parts: list[bytes] = []
    size = 0
    for chunk in batch:
        last = out[-1] if out else None
        if (last is not None and last.stream == chunk.stream and last.offset + size == chunk.offset
                and size + len(chunk.data) <= limit and (chunk.stream, chunk.offset) not in cuts):
            parts.append(chunk.data)
            size += len(chunk.data)
            continue
        if last is not None and len(parts) > 1:
            out[-1] = LogChunk(last.stream, last.offset, b"".join(parts))
        out.append(chunk)
        parts, size = [chunk.data], len(chunk.data)
    if out and len(parts) > 1:
        out[-1] = LogChunk(out[-1].stream, out[-1].offset, b"".join(parts))
    return out


def split(batch: list[LogChunk], limit: int = JSON_CHUNK_BYTES) -> list[LogChunk]:
    """The other way (for the JSON endpoint): chunks of at most `limit` bytes, cut from each one's start."""
    out = []
    for chunk in batch:
        for at in range(0, len(chunk.data), limit) if len(chunk.data) > limit else [0]:
            out.append(LogChunk(chunk.stream, chunk.offset + at, chunk.data[at:at + limit]))
    return out


def frames_body(chunks: list[LogChunk]) -> bytes:
    return b"".join(b"%s %d %d\n%s" % (c.stream.encode(), c.offset, len(c.data), c.data) for c in chunks)


class NotServed(Exception):
    """The server has no log-frames endpoint (an older server): send JSON chunks instead."""


def post_frames(api: ApiClient, job_id: int, worker_id: str, lease_id: str, chunks: list[LogChunk],
                replica: str | None = None) -> dict:
    """One attempt (the caller retries); raises NotServed on 404 from a server that does not route it."""
    params = {"worker_id": worker_id, "lease_id": lease_id}
    if replica:
        params["replica"] = replica
    try:
        response = api._raw("POST", f"worker/jobs/{int(job_id)}/log-frames", params=params, data=frames_body(chunks),
                            headers={"Content-Type": "application/octet-stream"})
    except ApiError as exc:
        # An unknown job is a 404 too; the JSON call that follows answers it the same way, and the
        # caller's lease handling takes it from there.
        if exc.status in (404, 405):
            raise NotServed(str(exc)) from None
        raise
    return api._answer("POST", "worker/jobs/…/log-frames", response)


class Throughput:
    """Counts a run of full batches (the worker behind the job's output) and says how fast it went."""

    def __init__(self, report_bytes: int = REPORT_BYTES):
        self.report_bytes = report_bytes
        self.started: float | None = None
        self.bytes = 0

    def delivered(self, nbytes: int, *, behind: bool, started: float | None = None) -> str | None:
        """After each post: `behind` when the batch was cut for its size (more output is waiting).
        Returns the sentence to log when a large delivery has just ended, else None."""
        if self.started is None:
            self.started = started if started is not None else time.monotonic()
        self.bytes += nbytes
        if behind:
            return None
        return self.finish()

    def finish(self) -> str | None:
        if self.started is None:
            return None
        seconds = max(time.monotonic() - self.started, 1e-6)
        nbytes, self.started, self.bytes = self.bytes, None, 0
        if nbytes < self.report_bytes:
            return None
        return (f"delivered {nbytes / 1e6:.1f} MB of logs in {seconds:.1f} s "
                f"({nbytes / seconds / 1e6:.1f} MB/s)")
