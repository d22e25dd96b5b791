"""`mado-tracking datasets upload NAME DIR`: a directory becomes a new version of a dataset.

The files are hashed here; the server answers which contents it still needs (a new version that
changes one file of a large set uploads that one file). Files up to 8 MiB go up as uncompressed tar
archives of up to 5,000 files / 256 MiB each (one request per archive, every file verified by the
server as it arrives); larger files in parts of 8 MiB with Content-Range, since a tar member cannot
start inside a file. An archive cut midway is followed by asking the server again and sending only
what it lacks; when a run is interrupted, running the same command again does the same. stdout gets
the version id alone, for scripts; progress (with MB/s) goes to stderr."""
from __future__ import annotations

import hashlib
import os
import re
import stat
import sys
import tarfile
import time
from pathlib import Path
from urllib.parse import quote

import click
import requests
import urllib3

from worker_agent.cli_client import TIMEOUT, Api, api_client, token_project
from worker_agent.dataset_transfer import tar_header

PART = 8 * 2**20
BATCH_FILE_MAX = PART  # files up to this size go in archives; larger ones in resumable parts
BATCH_FILES = 5000  # per archive request: a cut one resends at most what the server had not verified
BATCH_BYTES = 256 * 2**20
HASH_CHUNK = 2**20
RETRY_DELAYS = (2, 4)  # seconds before the second and third try of a part
_UNSAFE = re.compile(r"[\x00-\x1f\x7f\\]")
RESUME_HINT = "Run the same command again to resume: the server keeps what it already received."


@click.group()
def datasets() -> None:
    """Upload directories as dataset versions, download versions into directories."""


@datasets.command("upload")
@click.argument("name")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--project", help="The project identifier. [default: your token's project]")
@click.option("--description", default="", help="The dataset's description, when this upload creates it.")
@click.pass_context
def upload(ctx: click.Context, name: str, directory: Path, project: str | None, description: str) -> None:
    """Upload the files under DIRECTORY as a new version of dataset NAME (created when missing)."""
    api = api_client(ctx)  # its connections close when the command ends (api_client says so)
    project = project or token_project(api)
    local = _scan(directory)
    manifest = _hash(local)
    dataset = _dataset(api, project, name, description)
    base = f"/api/projects/{quote(project)}/datasets/{dataset['id']}/versions"
    version = api.call("POST", base, json={"manifest": manifest})
    if version["status"] != "complete":
        _send(api, f"{base}/{version['id']}", version["upload"], local,
              lambda: api.call("POST", base, json={"manifest": manifest})["upload"])
        version = api.call("POST", f"{base}/{version['id']}/complete")
        click.echo(f"Uploaded {dataset['name']} v{version['number']}: {version['file_count']} files, "
                   f"{version['total_size']} bytes, digest {version['digest']}.", err=True)
    else:
        click.echo(f"{dataset['name']} v{version['number']} already holds exactly these files; nothing uploaded.",
                   err=True)
    click.echo(version["id"])


@datasets.command("download")
@click.argument("name")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--version", "number", type=click.IntRange(min=1),
              help="The version number. [default: the newest complete version]")
@click.option("--project", help="The project identifier. [default: your token's project]")
@click.pass_context
def download(ctx: click.Context, name: str, directory: Path, number: int | None, project: str | None) -> None:
    """Download a version of dataset NAME into DIRECTORY as one stream, every file checked against the
    version's sha256. Files already in DIRECTORY with the right bytes are kept: run the same command
    again after an interruption and only the rest comes."""
    api = api_client(ctx)  # its connections close when the command ends (api_client says so)
    project = project or token_project(api)
    base = f"/api/projects/{quote(project)}/datasets/{quote(name, safe='')}/versions"
    complete = [v for v in api.call("GET", base)["items"] if v["status"] == "complete"]
    version = next((v for v in complete if number is None or v["number"] == number), None)
    if version is None:
        which = f"version {number}" if number else "a complete version"
        raise click.ClickException(f"Dataset {name} has no {which} (complete: "
                                   f"{', '.join(str(v['number']) for v in complete) or 'none'}). "
                                   "Choose one with --version.")
    manifest = api.call("GET", f"{base}/{version['id']}/manifest")["items"]
    places = {item["path"]: _place(directory, item["path"]) for item in manifest}
    missing = [item for item in manifest if not _holds(places[item["path"]], item)]
    if missing:
        archive = f"{base}/{version['id']}/archive"
        with Progress(sum(item["size"] for item in missing), "Downloading") as bar:
            _receive(api, archive, missing, places, bar, whole=len(missing) == len(manifest))
    click.echo(f"{version['dataset']['name']} v{version['number']}: {len(manifest)} files in {directory} "
               f"({len(manifest) - len(missing)} already there), each checked against its sha256.", err=True)
    click.echo(str(directory))


def _place(directory: Path, path: str) -> Path:
    """Where a manifest path goes under DIRECTORY; never outside it."""
    parts = path.split("/")
    if path.startswith("/") or any(part in ("", ".", "..") for part in parts) or _UNSAFE.search(path):
        raise click.ClickException(f"The version names a file {path!r} that cannot be written under {directory}.")
    return directory.joinpath(*parts)


def _holds(place: Path, item: dict) -> bool:
    try:
        if not place.is_file() or place.stat().st_size != item["size"]:
            return False
        digest = hashlib.sha256()
        with open(place, "rb") as handle:
            for block in iter(lambda: handle.read(HASH_CHUNK), b""):
                digest.update(block)
        return digest.hexdigest() == item["sha256"]
    except OSError:
        return False


def _receive(api: Api, url: str, expected: list[dict], places: dict[str, Path], bar: Progress, *, whole: bool) -> None:
    """The archive of `expected` (the whole version: GET; some files: POST {files}) into place, member by
    member: each must be the next expected file with its size and sha256, written aside and moved into
    place only when it matches."""
    try:
        if whole:
            response = api.session.get(api.url + url, stream=True, timeout=TIMEOUT, allow_redirects=False)
        else:
            response = api.session.post(api.url + url, json={"files": [item["path"] for item in expected]},
                                        stream=True, timeout=TIMEOUT, allow_redirects=False)
    except requests.RequestException as error:
        raise click.ClickException(f"Cannot reach the Mado server at {api.url} ({type(error).__name__}). "
                                   "Check MMT_API_URL and your network.") from None
    with response:
        if response.status_code >= 400:
            raise click.ClickException(api._explain(response))
        response.raw.decode_content = True
        done = 0
        try:
            with tarfile.open(fileobj=response.raw, mode="r|") as archive:
                for member in archive:
                    if done == len(expected):
                        break
                    _take(archive, member, expected[done], places[expected[done]["path"]], bar)
                    done += 1
        except (tarfile.TarError, requests.RequestException, urllib3.exceptions.HTTPError, OSError) as error:
            raise click.ClickException(f"The download broke off after {done} of {len(expected)} files "
                                       f"({type(error).__name__}). Run the same command again: the files "
                                       "already checked are kept.") from None
    if done < len(expected):
        raise click.ClickException(f"The download ended after {done} of {len(expected)} files. Run the same "
                                   "command again: the files already checked are kept.")


def _take(archive: tarfile.TarFile, member: tarfile.TarInfo, item: dict, place: Path, bar: Progress) -> None:
    if member.name != item["path"] or not member.isfile() or member.size != item["size"]:
        raise click.ClickException(f"The server sent {member.name!r} where {item['path']!r} ({item['size']} bytes) "
                                   "was next; nothing of it was kept. Run the command again.")
    place.parent.mkdir(parents=True, exist_ok=True)
    part = place.with_name(place.name + ".part")
    digest = hashlib.sha256()
    source = archive.extractfile(member)
    try:
        with open(part, "wb") as out:
            for block in iter(lambda: source.read(HASH_CHUNK), b""):
                digest.update(block)
                out.write(block)
                bar.add(len(block))
        if digest.hexdigest() != item["sha256"]:
            raise click.ClickException(f"{item['path']} arrived with other bytes than the version holds (sha256 "
                                       "mismatch); nothing of it was kept. Run the command again.")
        os.replace(part, place)
    finally:
        part.unlink(missing_ok=True)  # a file cut off or wrong is never left half-written


def _scan(directory: Path) -> dict[str, Path]:
    """Regular files under `directory` by their '/'-separated path inside it. Symbolic links to files
    are followed; links to directories and special files are left out, with a note."""
    found: dict[str, Path] = {}
    for top, dirs, names in os.walk(directory):
        dirs.sort()
        for entry in sorted(names) + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            path = Path(top, entry)
            relative = path.relative_to(directory).as_posix()
            if _UNSAFE.search(relative):
                raise click.ClickException(f"{relative!r} has a backslash or a control character in its name; "
                                           "rename it, then upload again.")
            try:
                mode = path.stat().st_mode
            except OSError as error:
                raise click.ClickException(f"Cannot read {relative}: {error.strerror}. Fix or remove it, then "
                                           "upload again.") from None
            if stat.S_ISREG(mode):
                found[relative] = path
            else:
                click.echo(f"Skipping {relative}: not a regular file.", err=True)
    if not found:
        raise click.ClickException(f"{directory} holds no files; choose the directory that holds the dataset.")
    return found


def _hash(local: dict[str, Path]) -> list[dict]:
    sizes = {relative: path.stat().st_size for relative, path in local.items()}
    manifest = []
    with Progress(sum(sizes.values()), "Hashing") as bar:
        for relative, path in local.items():
            digest = hashlib.sha256()
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(HASH_CHUNK), b""):
                    digest.update(block)
                    bar.add(len(block))
            manifest.append({"path": relative, "sha256": digest.hexdigest(), "size": sizes[relative]})
    return manifest


def _dataset(api: Api, project: str, name: str, description: str) -> dict:
    """The dataset named NAME (names ignore case), created when the project has none."""
    listing = api.call("GET", f"/api/projects/{quote(project)}/datasets")["items"]
    for dataset in listing:
        if dataset["name"].lower() == name.lower():
            return dataset
    dataset = api.call("POST", f"/api/projects/{quote(project)}/datasets",
                       json={"name": name, "description": description})
    click.echo(f"Created dataset {dataset['name']} in project {project}.", err=True)
    return dataset


class Progress:
    """A progress bar on stderr with the rate of this run (MB/s) beside it."""

    def __init__(self, length: int, label: str):
        self.started, self.moved = time.monotonic(), 0
        self.bar = click.progressbar(length=max(length, 1), label=label, file=sys.stderr, item_show_func=self._rate)

    def _rate(self, _item) -> str:
        return f"{self.moved / 1e6 / max(time.monotonic() - self.started, 1e-3):.1f} MB/s"

    def add(self, count: int) -> None:
        self.moved += count
        self.bar.update(count, current_item=count)

    def left(self, remaining: int) -> None:
        """What is left after the server was asked again (a resumed round)."""
        self.bar.pos = max(self.bar.length - remaining, 0)
        self.bar.update(0)

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        self.bar.__exit__(*exc)
        # One line with the rate also where no bar is drawn (stderr not a terminal: logs, scripts).
        elapsed = max(time.monotonic() - self.started, 1e-3)
        click.echo(f"{self.bar.label}: {self.moved / 1e6:.1f} MB in {elapsed:.1f} s ({self._rate(None)})", err=True)


class Interrupted(Exception):
    """An archive upload that broke off (network, 5xx): the server keeps what it verified."""


def _send(api: Api, version_url: str, pending: list[dict], local: dict[str, Path], ask) -> None:
    """The files the server still needs: those up to BATCH_FILE_MAX bytes as tar archives of up to
    BATCH_FILES files / BATCH_BYTES (one request each), larger ones in resumable parts. An archive that
    breaks off is not resent as it was: the server is asked again (`ask()`, the version's `upload`
    list) and only what it still lacks goes, after 2 s and 4 s."""
    remaining = sum(item["size"] - item["received_bytes"] for item in pending)
    with Progress(remaining, "Uploading") as bar:
        for attempt in range(len(RETRY_DELAYS) + 1):
            small = [item for item in pending if item["size"] <= BATCH_FILE_MAX]
            try:
                for batch in _batches(small):
                    _send_archive(api, version_url, batch, local, bar)
            except Interrupted as error:
                if attempt == len(RETRY_DELAYS):
                    raise click.ClickException(f"{error}. {RESUME_HINT}") from None
                click.echo(f"\n{error}; asking the server what it still needs in {RETRY_DELAYS[attempt]} s.",
                           err=True)
                time.sleep(RETRY_DELAYS[attempt])
                pending = ask()
                bar.left(sum(item["size"] - item["received_bytes"] for item in pending))
                continue
            for item in pending:
                if item["size"] > BATCH_FILE_MAX:
                    _send_file(api, f"{version_url}/files/{quote(item['path'])}", item, local[item["path"]], bar)
            return


def _batches(items: list[dict]):
    batch, size = [], 0
    for item in items:
        if batch and (len(batch) >= BATCH_FILES or size + item["size"] > BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += item["size"]
    if batch:
        yield batch


class ArchiveBody:
    """An uncompressed tar of `items` read from their local files, streamed with its exact length
    (`read(n)`, `__len__`: requests sends it with a Content-Length, which the server needs). A file that
    changed size since it was hashed is cut or padded to its manifest size, so the server refuses it
    by its sha256 instead of the stream going out of step."""

    def __init__(self, items: list[dict], local: dict[str, Path], bar: Progress):
        self.items, self.local, self.bar = items, local, bar
        self.headers = [tar_header(item["path"], item["size"]) for item in items]
        self.length = sum(len(h) + item["size"] + (-item["size"] % tarfile.BLOCKSIZE)
                          for h, item in zip(self.headers, items)) + 2 * tarfile.BLOCKSIZE
        self._blocks = self._generate()
        self._buffer, self._at = b"", 0

    def __len__(self):
        return self.length

    def _generate(self):
        for header, item in zip(self.headers, self.items):
            yield header
            left = item["size"]
            with open(self.local[item["path"]], "rb") as handle:
                while left > 0:
                    block = handle.read(min(left, HASH_CHUNK)) or b"\0" * min(left, HASH_CHUNK)
                    left -= len(block)
                    self.bar.add(len(block))
                    yield block
            yield b"\0" * (-item["size"] % tarfile.BLOCKSIZE)
        yield b"\0" * (2 * tarfile.BLOCKSIZE)

    def read(self, n=-1):
        """At most `n` bytes (fewer at the end of a block); b"" at the end."""
        while self._at >= len(self._buffer):
            block = next(self._blocks, None)
            if block is None:
                return b""
            self._buffer, self._at = block, 0
        end = len(self._buffer) if n is None or n < 0 else self._at + n
        data = self._buffer[self._at:end]
        self._at += len(data)
        return data


def _send_archive(api: Api, version_url: str, batch: list[dict], local: dict[str, Path], bar: Progress) -> None:
    """One archive; 4xx (a file not in the manifest, a wrong digest: the server names it) ends the
    command with the server's sentence, a broken connection or 5xx raises Interrupted."""
    body = ArchiveBody(batch, local, bar)
    try:
        response = api.session.put(api.url + version_url + "/archive", data=body, timeout=(5, 600),
                                   headers={"Content-Type": "application/x-tar"}, allow_redirects=False)
    except requests.RequestException as error:
        raise Interrupted(f"The upload of {len(batch)} file(s) broke off ({type(error).__name__})") from None
    if response.status_code >= 500 or (response.status_code == 400
                                       and _body(response).get("code") == "archive_truncated"):
        raise Interrupted(f"The server answered {response.status_code} while receiving {len(batch)} file(s)")
    if response.status_code >= 400:
        raise click.ClickException(f"Uploading failed: {api._explain(response)}")
    confirmed = len(response.json().get("confirmed") or [])
    if confirmed != len(batch):
        raise Interrupted(f"The server confirmed {confirmed} of {len(batch)} file(s)")


def _send_file(api: Api, url: str, item: dict, path: Path, bar) -> None:
    size, offset = item["size"], item["received_bytes"]
    with open(path, "rb") as handle:
        while True:
            handle.seek(offset)
            data = handle.read(min(PART, size - offset))
            if size and not data:
                raise click.ClickException(f"{item['path']} is shorter than when it was hashed: it changed during "
                                           "the upload. Upload again once it stays the same.")
            headers = {"Content-Type": "application/octet-stream"}
            if size:
                headers["Content-Range"] = f"bytes {offset}-{offset + len(data) - 1}/{size}"
            answer = _put(api, url, data, headers, item["path"])
            bar.add(max(answer["received_bytes"] - offset, 0) if not answer["complete"] else size - offset)
            if answer["complete"]:
                return
            offset = answer["received_bytes"]


def _put(api: Api, url: str, data: bytes, headers: dict, path: str) -> dict:
    """One part, tried up to three times when the network or the server fails; a 409 that names the
    server's offset continues from there."""
    for attempt, delay in enumerate((0, *RETRY_DELAYS)):
        time.sleep(delay)
        try:
            response = api.session.put(api.url + url, data=data, headers=headers, timeout=TIMEOUT,
                                       allow_redirects=False)
        except requests.RequestException as error:
            failure = f"Cannot reach the Mado server at {api.url} ({type(error).__name__})"
            continue
        if response.status_code < 400:
            return response.json()
        if response.status_code == 409 and _body(response).get("code") == "range_mismatch":
            received = int(_body(response)["fields"]["received_bytes"][0])
            return {"received_bytes": received, "complete": False}
        if response.status_code < 500:
            raise click.ClickException(f"Uploading {path} failed: {api._explain(response)}")
        failure = f"The server answered {response.status_code} while receiving {path}"
    raise click.ClickException(f"{failure}. {RESUME_HINT}")


def _body(response) -> dict:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
