"""Input dataset versions into the computer's cache before a job starts (seed 002 "Input dataset
transfer", REFERENCE §6). The cache itself is `worker_agent/target/dataset_cache.py`, run on the target
over the job's connection (shipped by worker_agent.core.ship); this module is the worker's side of it.

- relay (default): the worker reads the manifest and the version's archive (one tar, one request:
  datasets/archive.py) from the API with its own token under the job's lease, and writes its members
  as ONE uncompressed tar into `dataset_cache.py ensure` on the existing SSH connection, block by
  block: nothing of the set is stored on the worker's disk. Only the files the cache lacks are asked
  for (what a cut fetch verified stays there). A download that breaks resumes without resending: the
  member it broke in with Range, the rest with a new archive request naming them (retries after 2 s
  and 4 s); 404 fails at once. The target checks every file's sha256 before the version counts.
- direct: the target downloads itself with the job token (`dataset_cache.py` uses urllib): the
  manifest, then the files its cache lacks as ONE tar from the project API's archive endpoint, resumed
  like the relay's; the worker only hands it the URLs and the token (on stdin, never in an argv).

Either way the target answers `have` when the version is complete in its cache already, so a second
job moves no bytes, and concurrent jobs wait on the entry's lock while the first one fetches."""
from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import tarfile
import time
from collections import deque
from pathlib import Path
from urllib.parse import quote

import requests
import urllib3

from worker_agent.api import ApiClient, ApiError, ApiUnavailable
from worker_agent.core import ship
from worker_agent.ssh import ConnectError

log = logging.getLogger("mado.worker.datasets")

CACHE = ".mmt-cache/datasets"
RETRY_DELAYS = (2.0, 4.0)
BLOCK = 1 << 20
WAIT_SECONDS = 6 * 3600.0  # for the answer while another job fetches the same version
GIB = 1 << 30
PROGRAM = ship.Program.of_file(str(Path(__file__).with_name("target") / "dataset_cache.py"))


class DatasetError(Exception):
    """An input version cannot be delivered; the job fails to start with this message."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def cache_root(working_dir: str) -> str:
    return f"{working_dir.rstrip('/')}/{CACHE}"


# -- one command with stdin and stdout open at once -----------------------------------------------

class Duplex:
    """A command on the target whose stdin we write while reading its stdout (stderr merged)."""

    def __init__(self, connection, argv: list[str]):
        self._buffer = b""
        self.sent = 0  # the payload's bytes (a program sent first does not count)
        if hasattr(connection, "_channel"):  # worker_agent.ssh.Connection
            self._connection = connection
            connection._acquire()
            try:
                self._channel = connection._channel()
                self._channel.set_combine_stderr(True)
                self._channel.settimeout(WAIT_SECONDS)
                self._channel.exec_command(shlex.join(argv))
            except BaseException:
                connection._release()
                raise
            self._proc = None
        else:  # LocalConnection (development)
            self._connection = None
            self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, env=getattr(connection, "env", None),
                                          cwd=os.path.expanduser("~"), start_new_session=True)

    def write(self, data: bytes, *, payload: bool = True) -> None:
        try:
            if self._proc is not None:
                self._proc.stdin.write(data)
            else:
                self._channel.sendall(data)
        except (OSError, EOFError) as exc:
            raise BrokenPipeError(f"the target stopped reading ({type(exc).__name__})") from None
        self.sent += len(data) if payload else 0

    def close_write(self) -> None:
        try:
            if self._proc is not None:
                self._proc.stdin.close()
            else:
                self._channel.shutdown_write()
        except (OSError, EOFError):
            pass

    def _recv(self) -> bytes:
        try:
            if self._proc is not None:
                return os.read(self._proc.stdout.fileno(), 65536)
            return self._channel.recv(65536)
        except TimeoutError:
            raise ConnectError("ssh_failed", "The dataset cache on the target did not answer in time.") from None

    def message(self) -> dict | None:
        """The next JSON object the program printed (other lines are logged); None at the end."""
        while True:
            line, sep, rest = self._buffer.partition(b"\n")
            if sep:
                self._buffer = rest
                try:
                    value = json.loads(line.decode("utf-8"))
                except ValueError:
                    value = None
                if isinstance(value, dict):
                    return value
                if line.strip():
                    log.info("dataset cache on the target: %s", line.decode("utf-8", "replace")[:500])
                continue
            block = self._recv()
            if not block:
                if self._buffer.strip():
                    log.info("dataset cache on the target: %s", self._buffer.decode("utf-8", "replace")[:500])
                self._buffer = b""
                return None
            self._buffer += block

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
        else:
            try:
                self._channel.close()
            finally:
                self._connection._release()


def open_cache(connection, python: str, *args: str) -> Duplex:
    """The cache program as a Duplex: by its hash where this connection ran it already, else sent along
    first (a duplex cannot be tried and run again, as ship.stream)."""
    send = not ship.known(connection, PROGRAM)
    duplex = Duplex(connection, PROGRAM.command(python, args, send=send))
    if send:
        try:
            duplex.write(PROGRAM.source, payload=False)
        except BaseException:
            duplex.close()
            raise
    ship.remember(connection, PROGRAM)
    return duplex


# -- the worker's downloads (relay) ---------------------------------------------------------------

class Relay:
    """Reads one input version from the API under the job's lease."""

    def __init__(self, api: ApiClient, worker_id: str, lease: str, sleep=time.sleep):
        self.api = api
        self.params = {"worker_id": worker_id, "lease_id": lease}
        self.sleep = sleep

    def _retrying(self, action, what: str):
        for attempt in range(len(RETRY_DELAYS) + 1):
            try:
                return action()
            except ApiUnavailable as exc:
                error = str(exc)
            except requests.RequestException as exc:
                error = f"the download broke off ({type(exc).__name__})"
            except ApiError as exc:
                if exc.status == 404:
                    raise DatasetError("not_found", f"The server answered 404 for {what}: {exc}") from None
                raise DatasetError("download_refused", f"The server refused {what}: {exc}") from None
            if attempt == len(RETRY_DELAYS):
                raise DatasetError("download_failed", f"Downloading {what} failed {attempt + 1} times ({error}).")
            log.warning("downloading %s failed (%s); trying again in %.0f s", what, error, RETRY_DELAYS[attempt])
            self.sleep(RETRY_DELAYS[attempt])

    def manifest(self, version: dict) -> list[dict]:
        def get():
            response = self.api._raw("GET", version["worker_manifest_url"].removeprefix("/api/"), params=self.params,
                                     read_timeout=300)
            try:
                return response.json()["items"]
            finally:
                response.close()

        return self._retrying(get, f"the manifest of version {version['id']}")

    def copy(self, version: dict, item: dict, write, start: int = 0) -> None:
        """Write the file's bytes from `start` with `write`, resuming with Range after a broken download."""
        state = {"have": start}
        self._retrying(lambda: self._rest_of(version, item, write, state), f"{item['path']} of version {version['id']}")

    def _rest_of(self, version: dict, item: dict, write, state: dict) -> None:
        """One GET of the file from state['have'] (Range when not from 0); raises when it breaks off."""
        path = version["worker_files_url"].removeprefix("/api/") + quote(item["path"], safe="/")
        headers = {"Range": f"bytes={state['have']}-"} if state["have"] else None
        response = self.api._raw("GET", path, params=self.params, headers=headers, stream=True, read_timeout=120)
        try:
            if state["have"] and response.status_code != 206:
                raise DatasetError("download_refused", f"The server ignored the Range request for {item['path']}.")
            for block in response.iter_content(BLOCK):
                block = block[:item["size"] - state["have"]]
                write(block)
                state["have"] += len(block)
        finally:
            response.close()
        if state["have"] < item["size"]:
            raise requests.ConnectionError(f"ended after {state['have']} of {item['size']} bytes")

    def send_archive(self, version: dict, items: list[dict], write, whole: bool = False) -> None:
        """The members of `items` as tar members (header, bytes, padding; no end blocks) with `write`,
        from ONE archive request (worker_archive_url) rather than one request per file. A download that
        breaks off resumes: the member it broke in is finished with a Range request of that file, and
        the rest comes from a new archive request naming only the files still to send (POST {files}),
        after 2 s and 4 s; three failures in a row give up, unless bytes moved meanwhile (then a new round,
        at most three rounds). The member names and sizes are checked
        against `items` (the manifest), so a member can never be taken for another file. `whole`: items
        are every file of the version, which a plain GET asks for."""
        url = (version.get("worker_archive_url") or version["worker_manifest_url"].removesuffix("/manifest")
               + "/archive").removeprefix("/api/")
        pending = deque(items)
        state = {"open": None, "have": 0}  # the member whose header went out, and its bytes sent so far

        def close_member(item):
            write(b"\0" * (-item["size"] % tarfile.BLOCKSIZE))
            pending.popleft()
            state["open"], state["have"] = None, 0

        def attempt():
            if state["open"] is not None:  # broke off inside a member: the rest of that one file
                self._rest_of(version, state["open"], write, state)
                close_member(state["open"])
            if not pending:
                return
            everything = whole and len(pending) == len(items)
            response = self.api._raw("GET" if everything else "POST", url, params=self.params, stream=True,
                                     read_timeout=120,
                                     headers=None if everything else {"Content-Type": "application/json"},
                                     data=None if everything else json.dumps({"files": [i["path"] for i in pending]}))
            try:
                response.raw.decode_content = True
                with tarfile.open(fileobj=response.raw, mode="r|", bufsize=BLOCK) as archive:
                    for member in archive:
                        item = pending[0] if pending else None
                        if item is None or member.name != item["path"] or member.size != item["size"] \
                                or not member.isfile():
                            raise DatasetError("download_refused", f"The server's archive of version {version['id']}"
                                               f" holds {member.name!r} where {item and item['path']!r} was expected;"
                                               " update the worker or the server.")
                        write(tar_header(item["path"], item["size"]))
                        state["open"] = item
                        source = archive.extractfile(member)
                        for block in iter(lambda: source.read(BLOCK), b""):
                            write(block)
                            state["have"] += len(block)
                        if state["have"] < item["size"]:
                            raise requests.ConnectionError(f"the archive ended inside {item['path']}")
                        close_member(item)
                while response.raw.read(BLOCK):
                    pass  # the end blocks tarfile stopped at: a drained answer keeps the connection
            except BrokenPipeError:
                raise  # the target stopped reading: its answer says why
            except (tarfile.TarError, EOFError, OSError, urllib3.exceptions.HTTPError) as exc:
                raise requests.ConnectionError(f"the archive broke off ({type(exc).__name__}: {exc})") from None
            finally:
                response.close()
            if pending:
                raise requests.ConnectionError(f"the archive ended before {pending[0]['path']}")

        for tries in range(len(RETRY_DELAYS) + 1):
            before = len(pending), state["have"]
            try:
                return self._retrying(attempt, f"the archive of version {version['id']}")
            except DatasetError as exc:
                # A break that still moved bytes starts a fresh round of retries: only a stream that
                # makes no progress three times in a row gives up.
                if exc.code != "download_failed" or (len(pending), state["have"]) == before \
                        or tries == len(RETRY_DELAYS):
                    raise


def tar_header(path: str, size: int) -> bytes:
    info = tarfile.TarInfo(path)
    info.size, info.mode, info.mtime, info.type = size, 0o644, 0, tarfile.REGTYPE
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


def send_tar(duplex: Duplex, relay: Relay, version: dict, have: frozenset = frozenset()) -> None:
    """The manifest line, then the tar of the files the cache does not hold verified yet (`have`: what
    an earlier, cut fetch of this version left there), from one archive request."""
    items = relay.manifest(version)
    duplex.write((json.dumps(items) + "\n").encode("utf-8"))
    wanted = [item for item in items if item["path"] not in have]
    if wanted:
        relay.send_archive(version, wanted, duplex.write, whole=len(wanted) == len(items))
    duplex.write(b"\0" * (2 * tarfile.BLOCKSIZE))
    duplex.close_write()


# -- one version, then all of a job's ---------------------------------------------------------------

def _header(job: dict, version: dict, mode: str) -> dict:
    computer = job.get("computer") or {}
    header = {"job_id": int(job["id"]), "mode": mode,
              "limit_bytes": int(float(computer.get("dataset_cache_limit_gib") or 100) * GIB),
              "version": {k: version[k] for k in ("id", "digest", "total_size", "file_count")}}
    if mode == "direct":
        header.update(api_url=str(job.get("api_url") or "").rstrip("/"), token=str(job.get("job_token") or ""),
                      manifest_url=version["manifest_url"], files_url=version["files_url"],
                      archive_url=version.get("archive_url") or version["manifest_url"].removesuffix("/manifest")
                      + "/archive")
    return header


def ensure_version(connection, relay: Relay, job: dict, version: dict, *, python: str, working_dir: str) -> dict:
    """Put one version into the target's cache; returns the program's answer plus `sent` (bytes the
    worker wrote over SSH). Raises DatasetError when the version cannot be delivered."""
    mode = "direct" if (job.get("computer") or {}).get("dataset_transfer") == "direct" else "relay"
    duplex = open_cache(connection, python, "ensure", cache_root(working_dir))
    try:
        try:
            duplex.write((json.dumps(_header(job, version, mode)) + "\n").encode("utf-8"))
        except BrokenPipeError:
            pass  # it ended at once (a copy removed from the target's cache): no answer below
        answer = duplex.message()
        while answer is not None and answer.get("state") in ("fetching", "retrying"):
            if answer.get("state") == "retrying":
                log.warning("job %s: the computer's download of %s failed (%s); it tries again in %s s", job["id"],
                            answer.get("what"), answer.get("error"), answer.get("delay"))
            answer = duplex.message()
        if answer is not None and answer.get("state") == "send":
            try:
                send_tar(duplex, relay, version, frozenset(answer.get("have") or ()))
            except BrokenPipeError:
                pass  # the target stopped reading: its answer says why
            except DatasetError:
                duplex.close_write()
                raise
        if answer is not None and "state" in answer:
            answer = duplex.message()
        while answer is not None and "ok" not in answer:
            answer = duplex.message()
    finally:
        sent = duplex.sent
        duplex.close()
    if answer is None:
        ship.forget(connection, PROGRAM)  # the next try sends it, should the target have lost its copy
        raise ConnectError("ssh_failed", "The dataset cache on the target ended without an answer.")
    if not answer.get("ok"):
        raise DatasetError(str(answer.get("code") or "failed"), str(answer.get("error") or "failed"))
    return dict(answer, sent=sent, mode=mode)


def describe(version: dict) -> str:
    dataset = (version.get("dataset") or {}).get("name") or "dataset"
    number = f" v{version['number']}" if version.get("number") else ""
    return f"input dataset version {version['id']} ({dataset}{number})"


def ensure_inputs(connection, api: ApiClient, job: dict, *, worker_id: str, lease: str, python: str,
                  working_dir: str, sleep=time.sleep) -> list[dict]:
    """Every input version of the job into the cache, one after the other; logs what moved."""
    relay = Relay(api, worker_id, lease, sleep=sleep)
    answers = []
    for version in job.get("input_datasets") or []:
        started = time.monotonic()
        try:
            answer = ensure_version(connection, relay, job, version, python=python, working_dir=working_dir)
        except DatasetError as exc:
            raise DatasetError(exc.code, f"{describe(version)[0].upper()}{describe(version)[1:]} could not be "
                                         f"delivered: {exc.message}") from None
        elapsed = max(time.monotonic() - started, 1e-6)
        moved = answer["sent"] if answer["mode"] == "relay" else answer.get("received_bytes", 0)
        if answer.get("fetched"):
            log.info("job %s: %s fetched by %s: %d bytes moved in %.1f s (%.1f MB/s)%s", job["id"],
                     describe(version), answer["mode"], moved, elapsed, moved / 1e6 / elapsed,
                     f", evicted {len(answer['evicted'])} older version(s)" if answer.get("evicted") else "")
        else:
            log.info("job %s: %s is in the computer's cache already: 0 bytes moved", job["id"], describe(version))
        answers.append(dict(answer, moved=moved))
    return answers


def release(connection, job_id, *, python: str, working_dir: str) -> None:
    """Drop the job's pins (the job will not start): its versions may be evicted again."""
    ship.run(connection, python, PROGRAM, ["release", cache_root(working_dir), str(int(job_id))], timeout=60)


def report_usage(api: ApiClient, job: dict, worker_id: str, lease: str, usage: dict) -> None:
    try:
        api.request("POST", f"worker/jobs/{int(job['id'])}/dataset-cache",
                    {"worker_id": worker_id, "lease_id": lease,
                     "usage": {k: usage.get(k) for k in ("used_bytes", "limit_bytes", "complete_count",
                                                         "pinned_count")}}, attempts=2)
    except ApiError as exc:  # only the details page misses it
        log.info("job %s: the dataset cache usage was not reported (%s)", job["id"], exc)
