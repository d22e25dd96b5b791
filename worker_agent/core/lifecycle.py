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
                 upload: Callable[[str, int, int, int], None], note: Callable) -> dict:
    """The completion of a job that exited 0, from its outputs `listing` ({files, result, manifest}:
    result.json's and the manifest's bytes, None when absent): result.json validated here, then
    `declare(result_text, files, manifest_text)` (the server's answer; None: it will not hear of them
    now, and {} is returned), then `upload(path, size, number, count)` for each file it asks for.
    An invalid result, a refused declaration or an UploadFailed ends the job invalid_result."""
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
    try:
        answer = declare(listing["result"].decode("utf-8"), listing["files"], manifest)
    except ApiError as exc:
        note(f"The server refused result.json: {exc}", logging.WARNING)
        return invalid_result(str(exc))
    if answer is None:
        return {}
    sizes = {a["path"]: int(a["size"]) for a in validated.artifacts}
    wanted = [p for p in answer.get("upload") or [] if p in sizes]
    note(f"result.json accepted ({len(validated.artifacts)} artifact(s), {len(validated.metrics)} metric point(s)); "
         f"uploading {len(wanted)} file(s), {sum(sizes[p] for p in wanted)} bytes.", logging.INFO)
    for number, path in enumerate(wanted, start=1):
        try:
            upload(path, sizes[path], number, len(wanted))
        except UploadFailed as exc:
            return invalid_result(str(exc))
    return dict(FINISHED)


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
