"""The end of a job on the worker and in the site runner: the supervisor's final state becomes the
completion (`conclude`); after an exit code 0 the outputs are declared (`send_outputs`) and uploaded
(`upload`). Each side passes how it reaches the files and the server, and `note(text, level)` (a
`logging` level) for what it reports."""
from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable

from worker_agent import results
from worker_agent.core.api import ApiError, Unavailable

PART_THRESHOLD = 64 << 20  # files this large go in parts with Content-Range
PART_SIZE = 32 << 20
UPLOAD_REFUSALS = 3  # a file refused this often fails the job rather than being sent again
# Files up to BATCH_FILE_MAX go many to a request (one request per file cost ~0.2 s each: 2,000 small
# outputs took minutes); jobs.outputs.receive_batch takes at most 2,000 files and 256 MiB in one.
BATCH_FILE_MAX = 8 << 20
BATCH_FILES = 1000
BATCH_BYTES = 64 << 20
FINISHED = {"status": "finished", "exit_code": 0}


class UploadFailed(Exception):
    """An output could not be uploaded; the message becomes the job's error (invalid_result)."""


def signal_name(number) -> str:
    try:
        return signal.Signals(int(number)).name
    except (ValueError, TypeError):
        return f"signal {number}"


def invalid_result(error: str) -> dict:
    return {"status": "failed", "exit_code": 0, "end_reason": "invalid_result", "error": error}


def conclude(final: dict, outputs: Callable[[], dict], *, walltime, subject: str,
             lost: Callable[[dict], str]) -> dict:
    """The completion for the supervisor's `final` state. `outputs()` after an exit code 0;
    `subject` starts the sentences ("The job", "The code"); `lost(final)` is the error of a state the
    supervisor did not end in (worker_lost)."""
    status = final.get("status")
    if status == "exited":
        code, sig = final.get("exit_code"), final.get("signal")
        if code == 0:
            return outputs()
        if code is not None:
            return {"status": "failed", "exit_code": int(code), "end_reason": "exit_code"}
        return {"status": "failed", "end_reason": "exit_code",
                "error": f"{subject} was killed by {signal_name(sig)}." if sig else
                (final.get("error") or f"{subject} ended; its exit code is unknown.")}
    if status == "canceled":
        return {"status": "canceled", "end_reason": "canceled"}
    if status == "timed_out":
        return {"status": "failed", "end_reason": "timed_out",
                "error": f"The walltime of {walltime} s was reached; {subject.lower()} was stopped."}
    if status == "failed_to_start":
        return {"status": "failed", "end_reason": "start_failed",
                "error": final.get("error") or f"{subject} could not be started."}
    return {"status": "failed", "end_reason": "worker_lost", "error": lost(final)}


def send_outputs(listing: dict, *, max_files: int, limit_setting: str | None,
                 declare: Callable[[str, list, str | None], dict | None],
                 upload: Callable[[str, int, int, int], None], note: Callable,
                 upload_batch: Callable[[list[dict]], dict] | None = None,
                 gone: Callable[[ApiError], bool] = lambda exc: False,
                 pause: Callable[[float], None] = time.sleep, cap: float = 30.0, transient: tuple = ()) -> dict:
    """The completion of a job that exited 0, from its outputs `listing` ({files, result, manifest}:
    result.json's and the manifest's bytes, None when absent): result.json validated here, then
    `declare(result_text, files, manifest_text)` (the server's answer; None: it will not hear of them
    now, and {} is returned), then the files it asks for: with `upload_batch`, those up to BATCH_FILE_MAX
    bytes many to a request (see `send_batches`), and each other one with `upload(path, size, number,
    count)`. An invalid result, a refused declaration or an UploadFailed ends the job invalid_result."""
    if listing.get("result") is None:
        return dict(FINISHED)
    entries = [results.OutputFile(path=f["path"], size=int(f["size"]), sha256=f.get("sha256") or "",
                                  kind=f.get("kind") or "file") for f in listing["files"]]
    try:
        parsed = results.parse_result_json(listing["result"])
        validated = results.validate_result(parsed, entries, manifest_text=listing.get("manifest"),
                                            max_files=max_files, limit_setting=limit_setting)
    except results.ResultError as exc:
        note(f"result.json is not valid: {exc.message}", logging.WARNING)
        return invalid_result(exc.message)
    manifest = listing["manifest"].decode("utf-8") if listing.get("manifest") is not None else None

    def pending() -> list[str] | None:
        """The declaration (sent again after a cut: the server answers with what it still lacks)."""
        answer = declare(listing["result"].decode("utf-8"), listing["files"], manifest)
        return None if answer is None else [p for p in answer.get("upload") or [] if p in sizes]

    sizes = {a["path"]: int(a["size"]) for a in validated.artifacts}
    try:
        wanted = pending()
    except ApiError as exc:
        note(f"The server refused result.json: {exc}", logging.WARNING)
        return invalid_result(str(exc))
    if wanted is None:
        return {}
    note(f"result.json accepted ({len(validated.artifacts)} artifact(s), {len(validated.metrics)} metric point(s)); "
         f"uploading {len(wanted)} file(s), {sum(sizes[p] for p in wanted)} bytes.", logging.INFO)
    batched = [p for p in wanted if upload_batch is not None and sizes[p] <= BATCH_FILE_MAX]
    if upload_batch is not None:
        try:
            left = send_batches(batched, sizes, upload_batch,
                                pending=pending, gone=gone, pause=pause, note=note, cap=cap, transient=transient)
        except UploadFailed as exc:
            return invalid_result(str(exc))
        except ApiError as exc:  # the declaration sent again was refused
            if gone(exc):
                raise
            note(f"The server refused result.json: {exc}", logging.WARNING)
            return invalid_result(str(exc))
        if left is None:
            return {}
    alone = [p for p in wanted if upload_batch is None or sizes[p] > BATCH_FILE_MAX]
    for number, path in enumerate(alone, start=len(batched) + 1):  # numbered among all the files uploaded
        try:
            upload(path, sizes[path], number, len(wanted))
        except UploadFailed as exc:
            return invalid_result(str(exc))
    return dict(FINISHED)


def send_batches(paths: list[str], sizes: dict[str, int], upload_batch: Callable[[list[dict]], dict], *,
                 pending: Callable[[], list[str] | None], gone: Callable[[ApiError], bool],
                 pause: Callable[[float], None], note: Callable, cap: float = 30.0,
                 transient: tuple = ()) -> list[str] | None:
    """Upload `paths` in batches of up to BATCH_FILES files and BATCH_BYTES bytes:
    `upload_batch([{path, size}])` sends one and returns the server's answer ({confirmed: [paths]}).
    After a cut (Unavailable, OSError, `transient`: a pause of at most `cap` seconds first) or a
    refusal, `pending()` (the declaration sent again) tells what the server still lacks, so a file it
    confirmed is never sent twice; the UPLOAD_REFUSALS-th refusal raises UploadFailed, one that
    `gone(exc)` says ends the lease is raised. Returns [] when all arrived, None when `pending()` did."""
    queue = list(paths)
    total_files, total_bytes = len(queue), sum(sizes[p] for p in queue)
    sent_files = sent_bytes = failures = refused = 0
    started = time.monotonic()
    while queue:
        batch, size = [], 0
        for path in queue:
            if batch and (len(batch) >= BATCH_FILES or size + sizes[path] > BATCH_BYTES):
                break
            batch.append({"path": path, "size": sizes[path]})
            size += sizes[path]
        try:
            answer = upload_batch(batch)
        except (Unavailable, OSError, EOFError, *transient) as exc:
            failures += 1
            note(f"Upload of {len(batch)} output(s) interrupted ({exc}); sending those not confirmed again.",
                 logging.WARNING)
            pause(min(cap, 0.5 * 2 ** min(failures, 8)))
        except ApiError as exc:
            if gone(exc):
                raise
            refused += 1
            if refused >= UPLOAD_REFUSALS:
                raise UploadFailed(f"The upload of the outputs was refused: {exc}") from None
            note(f"Upload of {len(batch)} output(s) refused ({exc}); sending those not confirmed again.",
                 logging.WARNING)
        else:
            failures = 0
            confirmed = set(answer.get("confirmed") or [])
            sent_files += len(confirmed)
            sent_bytes += sum(sizes.get(p, 0) for p in confirmed)
            queue = [p for p in queue if p not in confirmed]
            elapsed = max(time.monotonic() - started, 1e-6)
            note(f"Uploaded {sent_files} of {total_files} small output(s), {sent_bytes} of {total_bytes} bytes "
                 f"({sent_bytes / 1e6 / elapsed:.1f} MB/s).", logging.INFO)
            if len(confirmed) == len(batch):
                continue
        left = pending()  # what the server confirmed of the batch that broke off
        if left is None:
            return None
        still = set(left)
        queue = [p for p in queue if p in still]
    return []


def upload(path: str, size: int, put: Callable[[int, int, str | None], dict], *, gone: Callable[[ApiError], bool],
           pause: Callable[[float], None], note: Callable, cap: float = 30.0, transient: tuple = (),
           progress: Callable[[int], None] | None = None) -> None:
    """Upload one output: in one request, or from PART_THRESHOLD bytes on in parts of PART_SIZE with
    Content-Range. `put(offset, length, content_range)` sends those bytes and returns the answer.
    Network trouble (Unavailable, `transient`) sends the part again after a `pause` of at most `cap`
    seconds; `range_mismatch` resumes from the byte the server confirmed; another refusal starts over,
    the UPLOAD_REFUSALS-th raises UploadFailed; one that `gone(exc)` says ends the lease is raised.
    `progress(offset)` after each part but the last."""
    offset = failures = refused = 0
    started = time.monotonic()
    while True:
        parts = size >= PART_THRESHOLD
        length = min(PART_SIZE, size - offset) if parts else size
        try:
            answer = put(offset if parts else 0, length,
                         f"bytes {offset}-{offset + length - 1}/{size}" if parts else None)
        except (Unavailable, *transient) as exc:
            failures += 1
            note(f"Upload of {path} interrupted ({exc}); trying again.", logging.WARNING)
            pause(min(cap, 0.5 * 2 ** min(failures, 8)))
            continue
        except ApiError as exc:
            if gone(exc):
                raise
            if exc.code == "range_mismatch":
                received = (exc.body.get("fields") or {}).get("received_bytes") or ["0"]  # the bytes it has
                offset = int(received[0] if isinstance(received, list) else received)
                note(f"The upload of {path} resumes at byte {offset}.", logging.INFO)
                continue
            refused += 1
            if refused >= UPLOAD_REFUSALS:
                raise UploadFailed(f"The upload of {path} was refused: {exc}") from None
            note(f"Upload of {path} refused ({exc}); sending it again from the start.", logging.WARNING)
            offset = 0
            continue
        failures = 0
        offset = int(answer.get("received_bytes", offset + length))
        if answer.get("complete") or offset >= size:
            elapsed = max(time.monotonic() - started, 1e-6)
            note(f"Uploaded {path} ({size} bytes, {size / 1e6 / elapsed:.1f} MB/s).", logging.INFO)
            return
        if parts and progress is not None:
            progress(offset)
