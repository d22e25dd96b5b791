"""State changes of datasets: create a dataset, create a version from a manifest, receive file bytes
in resumable parts or many files as one tar, complete a version, and turn a finished job's declared
outputs into versions.

Bytes are streamed to disk outside database transactions (mado.storage); rows change in short ones."""
from __future__ import annotations

import logging
import os
import re
import shutil
import tarfile
import uuid
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Max, Q, Value
from django.db.models.functions import Concat, Substr
from django.http import UnreadablePostError
from django.utils import timezone

from datasets import access, manifest
from datasets.choices import VersionStatus
from datasets.models import (Dataset, DatasetCacheReport, DatasetEntry, DatasetFile, DatasetVersion, JobInputDataset,
                             stored_path)
from mado import storage
from mado.errors import Conflict, ServiceError
from mado.services import Actor, audit

log = logging.getLogger(__name__)

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
MAX_DESCRIPTION = 2000
RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")
BATCH = 5000  # rows per query: a version may hold 100 000 files


def media(relative: str) -> Path:
    return Path(settings.MEDIA_ROOT) / relative


# Datasets ---------------------------------------------------------------------------------------

def name_problem(name) -> str | None:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        return ("A dataset name is 1–100 letters, digits, '.', '_' or '-', starting with a letter or digit "
                "(e.g. speech-train).")
    if name.isdigit():
        return "A dataset name cannot be only digits: numbers are dataset ids. Add a letter."
    return None


def create_dataset(actor: Actor, project, data: dict) -> Dataset:
    name, description = data.get("name"), data.get("description", "")
    problem = name_problem(name)
    if problem:
        raise ServiceError(problem, "invalid_dataset", fields={"name": [problem]})
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION or "\x00" in description:
        raise ServiceError(f"description is text of at most {MAX_DESCRIPTION} characters.", "invalid_dataset",
                           fields={"description": ["Too long or not text."]})
    try:
        with transaction.atomic():
            dataset = Dataset.objects.create(project=project, name=name, description=description,
                                             created_by=actor.user)
            audit(actor, "dataset.create", dataset, project=project, after={"name": name})
    except IntegrityError:
        raise Conflict(f"Project {project.slug} already has a dataset named {name} (names ignore case); "
                       "upload a new version to it, or choose another name.", "dataset_exists",
                       fields={"name": ["Already used."]}) from None
    return dataset


# Versions ---------------------------------------------------------------------------------------

def create_version(actor: Actor, dataset: Dataset, raw_manifest) -> tuple[DatasetVersion, bool]:
    """A version from a manifest; returns (version, created). The same files sent again resume the
    caller's unfinished upload of them, or return the latest version when it already holds them."""
    entries = manifest.clean(raw_manifest)
    digest = manifest.digest(entries)
    existing = _same_files(dataset, digest, actor.user)
    if existing is not None:
        return existing, False
    with transaction.atomic():
        files = _stored_files(dataset.project, entries)
        version = DatasetVersion.objects.create(
            dataset=dataset, digest=digest, file_count=len(entries), total_size=sum(e["size"] for e in entries),
            created_by=actor.user)
        _add_entries(version, entries, files)
        audit(actor, "dataset_version.create", version, project=dataset.project,
              after={"dataset": dataset.name, "digest": digest, "file_count": len(entries)})
    return version, True


def _same_files(dataset: Dataset, digest: str, user) -> DatasetVersion | None:
    latest = dataset.versions.filter(status=VersionStatus.COMPLETE).order_by("-number").first()
    if latest is not None and latest.digest == digest:
        return latest
    return dataset.versions.filter(status=VersionStatus.UPLOADING, digest=digest, created_by=user,
                                   job__isnull=True).order_by("-id").first()


def _stored_files(project, entries: list[dict]) -> dict[str, DatasetFile]:
    """The project's DatasetFile of every sha256 in `entries`, created where new."""
    sizes: dict[str, int] = {}
    for entry in entries:
        if sizes.setdefault(entry["sha256"], entry["size"]) != entry["size"]:
            raise ServiceError(f"Two files with sha256 {entry['sha256']} have different sizes; hash the files "
                               "again.", "invalid_manifest", fields={"manifest": ["Inconsistent sizes."]})
    found = _fetch(project, list(sizes))
    for sha, stored in found.items():
        if stored.size == sizes[sha]:
            continue
        if stored.complete:
            raise ServiceError(f"The project stores content with sha256 {sha} as {stored.size} bytes, but the "
                               f"manifest says {sizes[sha]}; hash the file again.", "invalid_manifest",
                               fields={"manifest": ["Size does not match the sha256."]})
        _resize(stored, sizes[sha])
    new = [DatasetFile(project=project, sha256=sha, size=size) for sha, size in sizes.items() if sha not in found]
    DatasetFile.objects.bulk_create(new, batch_size=BATCH, ignore_conflicts=True)
    found.update(_fetch(project, [f.sha256 for f in new]))
    return found


def _resize(stored: DatasetFile, size: int) -> None:
    """An unverified size claim gives way to a newer one: no bytes of it were proven. A version that
    still claims the old size cannot complete (complete_version compares the sizes)."""
    storage.remove(media(f"partial/datasets/{stored.pk}"))
    DatasetFile.objects.filter(pk=stored.pk).update(size=size, received_bytes=0)
    stored.size, stored.received_bytes = size, 0


def _fetch(project, shas: list[str]) -> dict[str, DatasetFile]:
    found = {}
    for start in range(0, len(shas), BATCH):
        for stored in DatasetFile.objects.filter(project=project, sha256__in=shas[start:start + BATCH]):
            found[stored.sha256] = stored
    return found


def _add_entries(version: DatasetVersion, entries: list[dict], files: dict[str, DatasetFile]) -> None:
    DatasetEntry.objects.bulk_create(
        [DatasetEntry(version=version, path=e["path"], sha256=e["sha256"], size=e["size"], file=files[e["sha256"]])
         for e in entries], batch_size=BATCH)


def pending_uploads(version: DatasetVersion) -> list[dict]:
    """The files whose bytes the server still needs, one path per content, with what it has so far."""
    rows = (version.entries.filter(file__complete=False).order_by("path")
            .values_list("path", "sha256", "size", "file__received_bytes"))
    seen, pending = set(), []
    for path, sha, size, received in rows.iterator(chunk_size=BATCH):
        if sha not in seen:
            seen.add(sha)
            pending.append({"path": path, "sha256": sha, "size": size, "received_bytes": received})
    return pending


def complete_version(actor: Actor, version: DatasetVersion) -> DatasetVersion:
    with transaction.atomic():
        version = DatasetVersion.objects.select_for_update().select_related("dataset").get(pk=version.pk)
        if version.is_complete:
            return version
        missing = version.entries.filter(Q(file__complete=False) | ~Q(size=F("file__size"))).order_by("path")
        count = missing.count()
        if count:
            first = list(missing.values_list("path", flat=True)[:5])
            raise Conflict(f"{count} file(s) are not uploaded yet ({', '.join(first)}{' …' if count > 5 else ''}); "
                           "upload them, then complete the version.", "version_incomplete",
                           fields={"missing": first})
        _mark_complete(version)
        audit(actor, "dataset_version.complete", version, project=version.dataset.project,
              after={"number": version.number, "digest": version.digest})
    return version


def _mark_complete(version: DatasetVersion) -> None:
    """Numbers go 1, 2, … per dataset in completion order; the dataset row lock serialises them."""
    Dataset.objects.select_for_update().filter(pk=version.dataset_id).first()
    latest = version.dataset.versions.aggregate(latest=Max("number"))["latest"] or 0
    version.number = latest + 1
    version.status = VersionStatus.COMPLETE
    version.completed_at = timezone.now()
    version.save(update_fields=["number", "status", "completed_at"])


# File bytes -------------------------------------------------------------------------------------

def entry_for(version: DatasetVersion, path: str) -> DatasetEntry:
    entry = version.entries.select_related("file").filter(path=path).first()
    if entry is None:
        raise ServiceError(f"{path} is not in this version's manifest; check the path.", "not_in_manifest",
                           status=404)
    return entry


def receive_file(version: DatasetVersion, path: str, readable, content_range: str | None) -> DatasetFile:
    """Store bytes of one file, whole or in parts (Content-Range: bytes start-end/size). A part that
    overlaps what the server has (a part re-sent after a lost answer) is accepted: the bytes already
    held are skipped. The whole file is checked against its sha256 before it counts."""
    stored = entry_for(version, path).file
    if stored.complete:
        return stored
    start, end = _range(content_range, stored.size)
    part = media(f"partial/datasets/{stored.pk}")
    with storage.exclusive(part) as locked:
        if not locked:
            raise Conflict(f"Another upload of {path} (or of a file with the same content) is in progress; "
                           "resume after it ends.", "upload_in_progress")
        stored.refresh_from_db()
        if stored.complete:
            return stored
        have = part.stat().st_size if part.exists() else 0
        if start > have:
            _save_received(stored, have)
            raise Conflict(f"The server has the first {have} bytes of {path}; resume the upload from byte {have}.",
                           "range_mismatch", fields={"received_bytes": [str(have)]})
        _skip(readable, have - start)
        try:
            received = storage.receive(readable, part, limit=min(end + 1, stored.size), append=True)
        except storage.UploadTooLarge:
            os.truncate(part, have)
            raise ServiceError(f"More bytes arrived than Content-Range or the manifest's size ({stored.size}) "
                               f"allow for {path}; send exactly the bytes of the range.", "size_mismatch") from None
        return _finish(stored, path, part, received)


def _range(header: str | None, size: int) -> tuple[int, int]:
    if not header:
        return 0, size - 1
    match = RANGE.match(header.strip())
    if not match or int(match.group(3)) != size or int(match.group(1)) > int(match.group(2)) \
            or int(match.group(2)) >= size:
        raise ServiceError(f"Content-Range must be 'bytes start-end/{size}' with start ≤ end < {size}.",
                           "invalid_range")
    return int(match.group(1)), int(match.group(2))


def _skip(readable, count: int) -> None:
    while count > 0:
        block = readable.read(min(count, storage.CHUNK))
        if not block:
            return
        count -= len(block)


def _save_received(stored: DatasetFile, received: int) -> None:
    DatasetFile.objects.filter(pk=stored.pk).update(received_bytes=received)
    stored.received_bytes = received


def _finish(stored: DatasetFile, path: str, part: Path, received: int) -> DatasetFile:
    if received < stored.size:
        _save_received(stored, received)
        return stored
    if storage.sha256_of(part) != stored.sha256:
        storage.remove(part)
        _save_received(stored, 0)
        raise ServiceError(f"The bytes of {path} do not match its sha256 in the manifest; the server dropped them. "
                           "Check the file did not change while uploading, and upload it again from byte 0.",
                           "sha256_mismatch")
    relative = stored_path(stored, None)
    media(relative).parent.mkdir(parents=True, exist_ok=True)
    os.replace(part, media(relative))
    stored.file.name = relative
    stored.received_bytes = received
    stored.complete = True
    stored.save(update_fields=["file", "received_bytes", "complete"])
    return stored


# Many files in one stream ----------------------------------------------------------------------
# PUT …/versions/{v}/archive: an uncompressed tar of files of the version (the CLI sends the files the
# server still needs, up to UPLOAD_FILE_MAX bytes each, in batches). Not resumable inside a file: a tar
# member always starts at byte 0, so large files keep the resumable parts of receive_file. A tar rather
# than the outputs' frames: any `tar c` makes one, and its length is known before it is sent (the CLI
# builds the headers itself), which the request needs (Django reads no chunked bodies).

UPLOAD_MAX_FILES = 10_000
UPLOAD_MAX_BYTES = 4 << 30  # of one request's body
UPLOAD_COMMIT_EVERY = 200  # verified files are marked complete in groups: one UPDATE each, not one per file


def receive_archive(version: DatasetVersion, readable, length) -> dict:
    """Store the files of an uncompressed tar of `length` bytes read from `readable`: every member a
    regular file named by a path of the version's manifest, with the manifest's size. Each is written
    aside, hashed as it arrives and moved into the project's storage only when its sha256 matches;
    verified files are marked complete in groups as the stream goes and in a `finally`, so a cut upload
    keeps them and asking for the version again (POST …/versions with the manifest) lists only the rest.
    Contents the server holds already are read past. Returns {confirmed, stored_files, received_bytes};
    a member that cannot be taken raises a ServiceError naming the file and what to do (the files before
    it stay stored)."""
    try:
        length = int(length)
    except (TypeError, ValueError):
        raise ServiceError("Send the archive with a Content-Length (an uncompressed tar of the version's files).",
                           "length_required", status=411) from None
    if length > UPLOAD_MAX_BYTES:
        raise ServiceError(f"One archive upload is at most {UPLOAD_MAX_BYTES >> 30} GiB; send the files in several "
                           "archives, or large files in parts (PUT …/files/{path} with Content-Range).",
                           "archive_too_large", status=413)
    wanted = {path: (pk, sha, size, complete) for path, pk, sha, size, complete in version.entries.values_list(
        "path", "file_id", "sha256", "size", "file__complete").iterator(chunk_size=BATCH)}
    prefix = f"datasets/{version.dataset.project_id}/files/"
    scratch = media("partial/datasets")
    scratch.mkdir(parents=True, exist_ok=True)
    confirmed: list[str] = []
    verified: list[int] = []
    done: set[int] = set()
    stored = 0
    try:
        with tarfile.open(fileobj=readable, mode="r|", bufsize=storage.CHUNK) as archive:
            for member in archive:
                path = member.name.removeprefix("./")
                if member.isdir():
                    continue
                pk, sha, size, complete = _upload_member(version, member, path, wanted, len(confirmed))
                if complete or pk in done:
                    confirmed.append(path)  # tarfile reads past the bytes not taken
                    continue
                target = media(f"{prefix}{sha[:2]}/{sha}")
                target.parent.mkdir(parents=True, exist_ok=True)
                _receive_member(archive.extractfile(member), scratch / f"upload-{uuid.uuid4().hex}", target, path,
                                sha)
                verified.append(pk)
                done.add(pk)
                stored += size
                confirmed.append(path)
                if len(verified) % UPLOAD_COMMIT_EVERY == 0:
                    _mark_stored(verified[-UPLOAD_COMMIT_EVERY:], prefix)
    except (tarfile.TarError, EOFError, UnreadablePostError) as exc:  # the client's stream broke off
        after = f" after {confirmed[-1]}" if confirmed else ""
        raise ServiceError(f"The archive ended early or is not an uncompressed tar{after} ({exc}); the files "
                           "before that are stored. Ask for the version again (POST …/versions with the manifest) "
                           "and send the files it still lists.", "archive_truncated", status=400,
                           fields={"confirmed": [str(len(confirmed))]}) from None
    finally:
        _mark_stored(verified[len(verified) - len(verified) % UPLOAD_COMMIT_EVERY:], prefix)
        log.info("dataset version %s: archive upload of %d file(s): %d stored (%d bytes)", version.pk,
                 len(confirmed), len(verified), stored)
    return {"confirmed": confirmed, "stored_files": len(verified), "received_bytes": stored}


def _upload_member(version, member, path: str, wanted: dict, count: int) -> tuple[int, str, int, bool]:
    """The manifest's (file id, sha256, size, stored already) for a member of an uploaded archive."""
    if count >= UPLOAD_MAX_FILES:
        raise ServiceError(f"One archive upload holds at most {UPLOAD_MAX_FILES} files; send the rest in another "
                           "one (the files before stay stored).", "archive_too_large", status=413)
    if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
        raise ServiceError(f"{path} is a link or a special file in the archive; send regular files only (the files "
                           "before it are stored).", "invalid_member", fields={"path": [path]})
    found = wanted.get(path)
    if found is None:
        raise ServiceError(f"{path} is not a file of version {version.pk}'s manifest; send only the files the "
                           "version lists (POST …/versions with the manifest answers which ones the server still "
                           "needs). The files before it are stored.", "not_in_manifest", fields={"path": [path]})
    if member.size != found[2]:
        raise ServiceError(f"{path} is {member.size} bytes in the archive but {found[2]} in the manifest: it changed "
                           "since it was hashed. Upload again from the start (the CLI hashes every file anew); the "
                           "files before it are stored.", "size_mismatch", fields={"path": [path]})
    return found


def _receive_member(source, part: Path, target: Path, path: str, sha: str) -> None:
    """One member's bytes into `target`, through `part`, if they match `sha`."""
    if not storage.keep_if_hash(source, part, target, sha):
        raise ServiceError(f"The bytes of {path} do not match its sha256 in the manifest; the server dropped them "
                           "and kept the files before it. Check that the file did not change since it was "
                           "hashed, then upload again (the CLI hashes every file anew).", "sha256_mismatch",
                           fields={"path": [path]})


def _mark_stored(pks: list[int], prefix: str) -> None:
    if pks:
        DatasetFile.objects.filter(pk__in=pks, complete=False).update(
            complete=True, received_bytes=F("size"),
            file=Concat(Value(prefix), Substr("sha256", 1, 2), Value("/"), F("sha256")))


# Versions declared by a job's result.json -----------------------------------------------------

def check_declarations(project, declared: list[dict]) -> None:
    """Refuse, while the worker can still tell the job's code, a declaration that could not be
    registered when the job finishes: an unknown dataset id or a name that is not a valid name."""
    for index, item in enumerate(declared):
        key = item["dataset_id"]
        where = f"datasets[{index}].datasetId"
        if key.isascii() and key.isdigit():
            if not (len(key) < 19 and Dataset.objects.filter(project=project, pk=int(key)).exists()):
                raise ServiceError(f"{where}: project {project.slug} has no dataset with id {key}; write an existing "
                                   "dataset's id, or its name (a new name creates the dataset).", "unknown_dataset",
                                   fields={"result": [where]})
        elif name_problem(key):
            raise ServiceError(f"{where}: {name_problem(key)}", "invalid_dataset_name", fields={"result": [where]})


def register_job_outputs(job) -> list[DatasetVersion]:
    """Turn the finished job's declared `datasets` into complete versions, from its uploaded output
    files (hard links, no copies). Runs once, inside the job's completion transaction."""
    declared = (job.result or {}).get("datasets") or []
    if not declared or job.dataset_versions.exists():
        return []
    versions = []
    for item in declared:
        dataset = _declared_dataset(job, item["dataset_id"])
        if dataset is None:
            continue
        versions.append(_job_version(job, dataset, item))
    return versions


def _declared_dataset(job, key: str) -> Dataset | None:
    if key.isascii() and key.isdigit() and len(key) < 19:
        dataset = Dataset.objects.filter(project=job.project_id, pk=int(key)).first()
        if dataset is None:
            log.warning("job %s declared dataset %s, deleted since; no version made", job.pk, key)
        return dataset
    dataset = Dataset.objects.filter(project=job.project_id, name__iexact=key).first()
    if dataset is not None:
        return dataset
    try:
        with transaction.atomic():
            dataset = Dataset.objects.create(project=job.project, name=key, created_by=job.created_by,
                                             description=f"Created by job {job.pk}.")
            audit(Actor(job.created_by), "dataset.create", dataset, project=job.project,
                  after={"name": key, "job": job.pk})
            return dataset
    except IntegrityError:  # another job created it a moment ago
        return Dataset.objects.get(project=job.project_id, name__iexact=key)


def _job_version(job, dataset: Dataset, item: dict) -> DatasetVersion:
    version = DatasetVersion(dataset=dataset, created_by=job.created_by, job=job, schema=item.get("schema") or {},
                             metadata=item.get("metadata") or {})
    if item["source"] == "uri":
        version.uri, version.digest = item["uri"], item["digest"]
        version.save()
    else:
        entries, sources = _entries_from_outputs(job, item)
        version.digest = manifest.digest(entries)
        version.file_count, version.total_size = len(entries), sum(e["size"] for e in entries)
        version.save()
        files = _stored_files(dataset.project, entries)
        _adopt(files, sources)
        _add_entries(version, entries, files)
    _mark_complete(version)
    audit(Actor(job.created_by), "dataset_version.create", version, project=dataset.project,
          after={"dataset": dataset.name, "digest": version.digest, "file_count": version.file_count, "job": job.pk})
    return version


def _entries_from_outputs(job, item: dict) -> tuple[list[dict], dict[str, str]]:
    """The version's entries (paths relative to the declared directory) and, per sha256, the stored
    output file that holds those bytes."""
    path = item["path"].rstrip("/")
    rows = job.artifacts.filter(complete=True)
    rows = rows.filter(path__startswith=path + "/") if item["is_directory"] else rows.filter(path=path)
    entries, sources = [], {}
    for artifact_path, sha, size, name in rows.values_list("path", "sha256", "size", "file").iterator(chunk_size=BATCH):
        inside = artifact_path[len(path) + 1:] if item["is_directory"] else artifact_path.rsplit("/", 1)[-1]
        entries.append({"path": inside, "sha256": sha, "size": size})
        sources.setdefault(sha, name)
    entries.sort(key=lambda e: e["path"])
    return entries, sources


def _adopt(files: dict[str, DatasetFile], sources: dict[str, str]) -> None:
    """Store each new content by hard-linking the job's output file (a copy across file systems)."""
    adopted = []
    for sha, stored in files.items():
        if stored.complete:
            continue
        relative = stored_path(stored, None)
        target = media(relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{sha}.{uuid.uuid4().hex}")
        try:
            os.link(media(sources[sha]), temporary)
        except OSError:
            shutil.copyfile(media(sources[sha]), temporary)
        os.replace(temporary, target)
        stored.file.name, stored.received_bytes, stored.complete = relative, stored.size, True
        adopted.append(stored)
    DatasetFile.objects.bulk_update(adopted, ["file", "received_bytes", "complete"], batch_size=BATCH)


# Versions as job inputs -------------------------------------------------------------------------

MAX_INPUTS = 16


def clean_input_datasets(user, project, raw) -> list[DatasetVersion]:
    """The versions a new job reads, from `input_datasets` (a list of version ids): complete versions
    of the project's datasets the creator can see, each once. ServiceError names what to fix."""
    if raw in (None, "", []):
        return []
    field = "input_datasets"
    if not isinstance(raw, list) or not all(_version_id(i) is not None for i in raw):
        raise ServiceError("input_datasets lists dataset version ids, such as [12, 15].", "invalid_job",
                           fields={field: ["A list of version ids."]})
    ids = [_version_id(i) for i in raw]
    if len(ids) > MAX_INPUTS:
        raise ServiceError(f"A job reads at most {MAX_INPUTS} dataset versions; this one names {len(ids)}.",
                           "invalid_job", fields={field: ["Too many versions."]})
    if len(set(ids)) != len(ids):
        raise ServiceError("input_datasets names a version twice; list each version once.", "invalid_job",
                           fields={field: ["Each version once."]})
    found = {v.pk: v for v in DatasetVersion.objects.filter(
        pk__in=ids, dataset__in=access.visible_in(user, project)).select_related("dataset")}
    for pk in ids:
        version = found.get(pk)
        problem = _input_problem(version, pk, project)
        if problem:
            raise ServiceError(problem, "invalid_input_dataset", fields={field: [problem]})
    return [found[pk] for pk in ids]


def _version_id(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 19:
        value = int(value)
    return value if isinstance(value, int) and 0 < value < 2 ** 63 else None


def _input_problem(version: DatasetVersion | None, pk: int, project) -> str | None:
    if version is None:
        return f"Project {project.slug} has no dataset version {pk}; copy the version id from its dataset's page."
    if not version.is_complete:
        return f"Version {pk} of {version.dataset.name} is still uploading; choose it once it is complete."
    if version.uri:
        return (f"Version {version} is stored elsewhere ({version.uri}); Mado cannot deliver it. Have the job "
                "read the uri itself, through a parameter.")
    return None


def attach_inputs(job, versions: list[DatasetVersion]) -> None:
    """Record the job's input versions (inside the job's creation transaction)."""
    JobInputDataset.objects.bulk_create(
        [JobInputDataset(job=job, version=v, position=i) for i, v in enumerate(versions)])


def input_versions(job) -> list[DatasetVersion]:
    return [row.version for row in job.input_datasets.select_related("version__dataset").order_by("position")]


PREFETCH_JOB_INPUTS = "input_datasets__version__dataset"


def job_inputs_summary(job) -> list[dict]:
    """The job's input versions as people see them in the job body, in the order they were given.
    A list of jobs prefetches `input_datasets__version__dataset` (PREFETCH_JOB_INPUTS) so that its
    cost does not grow with the number of jobs."""
    if "input_datasets" in getattr(job, "_prefetched_objects_cache", {}):
        versions = [row.version for row in sorted(job.input_datasets.all(), key=lambda row: row.position)]
    else:
        versions = input_versions(job)
    return [{"id": v.pk, "dataset": {"id": v.dataset_id, "name": v.dataset.name}, "number": v.number,
             "digest": v.digest} for v in versions]


def claim_payload(job) -> list[dict]:
    """What a worker needs to put each input version into the computer's cache (the claim's
    `input_datasets`): relay reads the `worker_*` URLs with the worker's token and lease; direct
    hands the project URLs and the job token to the computer."""
    items = []
    for version in input_versions(job):
        project_base = f"/api/projects/{job.project.slug}/datasets/{version.dataset_id}/versions/{version.pk}"
        worker_base = f"/api/worker/jobs/{job.pk}/datasets/{version.pk}"
        items.append({"id": version.pk, "dataset": {"id": version.dataset_id, "name": version.dataset.name},
                      "number": version.number, "digest": version.digest, "file_count": version.file_count,
                      "total_size": version.total_size,
                      "manifest_url": project_base + "/manifest", "files_url": project_base + "/files/",
                      "archive_url": project_base + "/archive",
                      "worker_manifest_url": worker_base + "/manifest", "worker_files_url": worker_base + "/files/",
                      "worker_archive_url": worker_base + "/archive"})
    return items


def job_input(job, version_pk: int) -> DatasetVersion:
    """An input version of `job`; 404 for any other version (the lease reads only its own inputs)."""
    row = job.input_datasets.select_related("version__dataset").filter(version_id=version_pk).first()
    if row is None:
        raise ServiceError(f"Dataset version {version_pk} is not an input of job {job.pk}.", "not_an_input",
                           status=404)
    return row.version


def record_cache_usage(job, worker_id: str, usage) -> None:
    """The worker's report of the computer's dataset cache after it ensured this job's inputs."""
    if not isinstance(usage, dict):
        raise ServiceError("usage is the object the dataset cache answered.", "invalid_usage",
                           fields={"usage": ["An object."]})
    numbers = {k: usage.get(k) for k in ("used_bytes", "limit_bytes", "complete_count", "pinned_count")}
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 63 for v in numbers.values()):
        raise ServiceError("usage needs used_bytes, limit_bytes, complete_count and pinned_count as whole numbers "
                           "from 0.", "invalid_usage", fields={"usage": ["Numbers missing."]})
    DatasetCacheReport.objects.update_or_create(target_id=job.target_id, defaults={
        "used_bytes": numbers["used_bytes"], "limit_bytes": numbers["limit_bytes"],
        "version_count": numbers["complete_count"], "pinned_count": numbers["pinned_count"],
        "worker_id": str(worker_id or "")[:64], "job": job, "reported_at": timezone.now()})


def input_choices(user, project, limit: int = 200) -> list[tuple[str, str]]:
    """The New job form's picker: complete versions with files, newest first."""
    versions = (DatasetVersion.objects.filter(dataset__in=access.visible_in(user, project), status=VersionStatus.COMPLETE,
                                              uri="").select_related("dataset").order_by("-completed_at", "-id")[:limit])
    return [(str(v.pk), f"{v.dataset.name} v{v.number} · {v.file_count} files · {v.digest_prefix}") for v in versions]
