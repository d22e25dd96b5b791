"""`mado-tracking datasets upload NAME DIR`: a directory becomes a new version of a dataset.

The files are hashed here; the server answers which contents it still needs (a new version that
changes one file of a large set uploads that one file). Files go up in parts of 8 MiB with
Content-Range; when a run is interrupted, running the same command again asks the server what it
has and sends only the rest. stdout gets the version id alone, for scripts; progress goes to stderr."""
from __future__ import annotations

import hashlib
import os
import re
import stat
import sys
import time
from pathlib import Path
from urllib.parse import quote

import click
import requests

from worker_agent.cli_client import TIMEOUT, Api, api_client, token_project

PART = 8 * 2**20
HASH_CHUNK = 2**20
RETRY_DELAYS = (2, 4)  # seconds before the second and third try of a part
_UNSAFE = re.compile(r"[\x00-\x1f\x7f\\]")
RESUME_HINT = "Run the same command again to resume: the server keeps what it already received."


@click.group()
def datasets() -> None:
    """Upload directories as dataset versions."""


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
        _send(api, f"{base}/{version['id']}", version["upload"], local)
        version = api.call("POST", f"{base}/{version['id']}/complete")
        click.echo(f"Uploaded {dataset['name']} v{version['number']}: {version['file_count']} files, "
                   f"{version['total_size']} bytes, digest {version['digest']}.", err=True)
    else:
        click.echo(f"{dataset['name']} v{version['number']} already holds exactly these files; nothing uploaded.",
                   err=True)
    click.echo(version["id"])


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
    with click.progressbar(length=sum(sizes.values()), label="Hashing", file=sys.stderr) as bar:
        for relative, path in local.items():
            digest = hashlib.sha256()
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(HASH_CHUNK), b""):
                    digest.update(block)
                    bar.update(len(block))
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


def _send(api: Api, version_url: str, pending: list[dict], local: dict[str, Path]) -> None:
    remaining = sum(item["size"] - item["received_bytes"] for item in pending)
    with click.progressbar(length=remaining, label="Uploading", file=sys.stderr) as bar:
        for item in pending:
            _send_file(api, f"{version_url}/files/{quote(item['path'])}", item, local[item["path"]], bar)


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
            bar.update(max(answer["received_bytes"] - offset, 0) if not answer["complete"] else size - offset)
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
