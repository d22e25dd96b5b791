"""Sources going to a job and outputs coming back: source archives, result.json, artifact uploads.

Uploads are streamed to disk outside any database transaction; rows are updated in short ones."""
from __future__ import annotations

import json
import logging
import os
import re
import uuid
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Q, Sum, Value
from django.db.models.functions import Concat
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext as _

from jobs import hooks
from jobs.choices import HELD_STATUSES
from jobs.models import Artifact, Job, Metric, SourceArchive
from mado import access as identity
from mado import storage
from mado.choices import Role, Scope
from mado.errors import Conflict, Forbidden, ServiceError
from mado.services import Actor, audit
from mado.validation import text_problem
from worker_agent import results

GZIP_MAGIC = b"\x1f\x8b"
log = logging.getLogger(__name__)


# result.json `datasets` and `models` ------------------------------------------------------------
# jobs may not import the apps that keep them (DESIGN §2): datasets and the registry register a handler
# of their section here in their AppConfig.ready(). check(job, declared) runs when the declaration arrives
# (raise ServiceError to refuse it, as the other result.json errors); register(job) runs in the completion
# transaction of a finished job, after every declared artifact arrived. Without a handler, a section's
# declarations are kept in job.result only.

SECTIONS = ("datasets", "models")  # checked and registered in this order
_section_handlers: dict[str, dict[str, tuple]] = {section: {} for section in SECTIONS}


def register_section_handler(section: str, name: str, *, check, register) -> None:
    """Add a handler of one result.json section. The same name again replaces it (ready() may run twice
    in tests)."""
    _section_handlers[section][name] = (check, register)


def register_models_handler(name: str, *, check, register) -> None:
    register_section_handler("models", name, check=check, register=register)


RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")


def media(relative: str) -> Path:
    return Path(settings.MEDIA_ROOT) / relative


def _incoming() -> Path:
    return media(f"incoming/{uuid.uuid4().hex}")


# Sources ----------------------------------------------------------------------------------------

def store_source(actor: Actor, project, readable) -> SourceArchive:
    if not identity.has_role(actor.user, project, Role.MEMBER):
        raise Forbidden("Uploading sources needs the member role in this project.", "role_required")
    tmp = _incoming()
    try:
        size = storage.receive(readable, tmp, limit=settings.MAX_SOURCE_BYTES)
    except storage.UploadTooLarge:
        storage.remove(tmp)
        raise ServiceError(f"The source archive is larger than {settings.MAX_SOURCE_BYTES // 2**20} MiB; leave data "
                           "and checkpoints out of the source directory.", "source_too_large", status=413) from None
    with open(tmp, "rb") as head:
        if size == 0 or head.read(2) != GZIP_MAGIC:
            storage.remove(tmp)
            raise ServiceError("Send the source directory as a .tar.gz archive.", "source_not_gzip")
    digest = storage.sha256_of(tmp)
    existing = SourceArchive.objects.filter(project=project, sha256=digest).first()
    if existing is not None:
        storage.remove(tmp)
        return existing
    archive = SourceArchive(project=project, created_by=actor.user, sha256=digest, size=size)
    relative = f"sources/{project.pk}/{digest}.tar.gz"
    media(relative).parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, media(relative))
    archive.file.name = relative
    archive.save()
    audit(actor, "source.upload", archive, project=project, after={"sha256": digest, "size": size})
    return archive


def clean_source(project, source):
    """The job's source as stored: a git URL and ref, or an archive of this project."""
    if source is None:
        return None
    if isinstance(source, dict) and source.get("kind") == "archive":
        archive = SourceArchive.objects.filter(pk=source.get("id"), project=project).first() \
            if isinstance(source.get("id"), int) else None
        if archive is None:
            raise ServiceError("No uploaded source archive with this id in the project; upload it first.",
                               "invalid_job", fields={"source": ["Unknown archive."]})
        return {"kind": "archive", "id": archive.pk, "sha256": archive.sha256, "size": archive.size}
    if isinstance(source, dict) and source.get("kind") == "git":
        url, ref = source.get("url"), source.get("ref") or "HEAD"
        if not isinstance(url, str) or not url or url.startswith("-") or not isinstance(ref, str) or ref.startswith("-"):
            raise ServiceError("A git source needs a url and, optionally, a ref (branch, tag or commit).",
                               "invalid_job", fields={"source": ["Invalid git source."]})
        return {"kind": "git", "url": url, "ref": ref}
    raise ServiceError('source is {"kind": "git", "url": …, "ref": …} or {"kind": "archive", "id": …}.',
                       "invalid_job", fields={"source": ["Invalid source."]})


def source_file(job: Job) -> Path:
    if not job.source or job.source.get("kind") != "archive":
        raise ServiceError("This job has no uploaded source archive.", "not_found", status=404)
    archive = SourceArchive.objects.get(pk=job.source["id"])
    return Path(archive.file.path)


# result.json --------------------------------------------------------------------------------------

def output_file_limit(worker_max_files=None) -> tuple[int, str]:
    """(most output files, the setting that decides it): the worker's MMT_WORKER_MAX_OUTPUT_FILES as it
    reported it with its declaration, up to this server's MADO_MAX_OUTPUT_FILES. A declaration without it
    (a site's runner, an older worker: they check their own limit first) gets the server's maximum."""
    maximum = settings.MAX_OUTPUT_FILES
    if worker_max_files is None:
        return maximum, results.SERVER_LIMIT_SETTING
    if isinstance(worker_max_files, bool) or not isinstance(worker_max_files, int) or worker_max_files < 1:
        raise ServiceError(_("max_files is the worker's MMT_WORKER_MAX_OUTPUT_FILES, a whole number of at least 1."),
                           "invalid", fields={"max_files": [_("A whole number of at least 1.")]})
    if worker_max_files <= maximum:
        return worker_max_files, results.WORKER_LIMIT_SETTING
    return maximum, results.SERVER_LIMIT_SETTING


def record_outputs(job: Job, *, result_text, files, manifest_text, token_scopes: frozenset[str],
                   worker_max_files=None) -> list[str]:
    """Validate the result.json declaration against the files the worker saw; store metrics and the
    artifacts to expect. Returns the artifact paths still to upload. Caller holds the job row lock.
    `worker_max_files`: the worker's MMT_WORKER_MAX_OUTPUT_FILES (see output_file_limit)."""
    _require_held(job)
    if not isinstance(result_text, str):
        raise ServiceError("result is the text of result.json.", "invalid", fields={"result": ["Text expected."]})
    if not isinstance(files, list):
        raise ServiceError("files lists the outputs directory: [{path, size, sha256, kind}].", "invalid",
                           fields={"files": ["List expected."]})
    try:
        listing = [results.OutputFile(path=f["path"], size=f["size"], sha256=f.get("sha256", ""),
                                      kind=f.get("kind", "file")) for f in files]
    except (KeyError, TypeError):
        raise ServiceError("Each file is {path, size, sha256, kind}.", "invalid", fields={"files": ["Invalid entry."]}) \
            from None
    max_files, limit_setting = output_file_limit(worker_max_files)
    try:
        parsed = results.parse_result_json(result_text.encode())
        validated = results.validate_result(parsed, listing, manifest_text=manifest_text, max_files=max_files,
                                            limit_setting=limit_setting)
    except results.ResultError as error:
        raise ServiceError(error.message, error.code,
                           fields={"result": [error.location]} if error.location else None) from None
    if (validated.models or validated.datasets) and Scope.REGISTRY_WRITE not in token_scopes:
        raise ServiceError("Declaring models or datasets needs a worker token with registry:write; issue one.",
                           "registry_write_required")
    for section in SECTIONS:
        declared = getattr(validated, section)
        if declared:
            for check, _register in list(_section_handlers[section].values()):
                check(job, declared)
    # Dataset file lists can hold 100 000 entries: the job keeps the counts and digests, not the lists.
    datasets = [{k: v for k, v in d.items() if k != "files"} for d in validated.datasets]
    summary = {"version": validated.version, "models": validated.models, "datasets": datasets,
               "manifest_path": validated.manifest_path}
    if job.result == summary:
        pending = job.artifacts.filter(complete=False).values_list("path", flat=True)
        return list(pending)  # the same declaration resent
    if job.result is not None:
        raise Conflict("This job's outputs were already declared differently.", "outputs_already_recorded")
    Artifact.objects.bulk_create([Artifact(job=job, path=a["path"], size=a["size"], sha256=a["sha256"],
                                           mime_type=a.get("mime_type") or "") for a in validated.artifacts])
    points = Metric.objects.bulk_create([Metric(job=job, name=m["name"], value=m["value"], step=m["step"],
                                                timestamp=(parse_datetime(m["timestamp"]) if m.get("timestamp")
                                                           else None) or timezone.now())
                                         for m in validated.metrics])
    hooks.run_metrics_recorded(job, points)  # tracking: they are also the Job's Run's metrics
    job.result = summary
    job.save(update_fields=["result"])
    return [a["path"] for a in validated.artifacts]


# Artifact uploads -------------------------------------------------------------------------------

def _require_held(job: Job) -> None:
    """An ended job's outputs are final: a worker still holding its old lease writes nothing more."""
    if job.status not in HELD_STATUSES:
        raise Conflict(_("This job already ended (%(status)s).") % {"status": job.status}, "job_ended")


def receive_artifact(job: Job, path: str, readable, content_range: str | None) -> Artifact:
    """Store one declared artifact, whole or in parts (Content-Range: bytes start-end/total)."""
    _require_held(job)
    artifact = Artifact.objects.filter(job=job, path=path).first()
    if artifact is None:
        raise ServiceError(f"{path} is not declared in this job's result.json; declare it first.",
                           "artifact_not_declared", status=404)
    if artifact.complete:
        return artifact
    start = 0
    if content_range:
        match = RANGE.match(content_range.strip())
        if not match or int(match.group(3)) != artifact.size:
            raise ServiceError(f"Content-Range must be 'bytes start-end/{artifact.size}'.", "invalid_range")
        start = int(match.group(1))
        if start != artifact.received_bytes:
            raise Conflict(f"Resume the upload from byte {artifact.received_bytes}.", "range_mismatch",
                           fields={"received_bytes": [str(artifact.received_bytes)]})
    part = media(f"partial/{artifact.pk}")
    with storage.exclusive(part) as locked:
        if not locked:
            raise Conflict(f"Another upload of {path} is in progress; resume after it ends.", "upload_in_progress")
        try:
            received = storage.receive(readable, part, limit=artifact.size, append=start > 0)
        except storage.UploadTooLarge:
            storage.remove(part)
            Artifact.objects.filter(pk=artifact.pk).update(received_bytes=0)
            raise ServiceError(f"{path} is larger than the declared {artifact.size} bytes.", "size_mismatch") from None
        return _finish_artifact(job, artifact, part, received)


def _finish_artifact(job: Job, artifact: Artifact, part: Path, received: int) -> Artifact:
    path = artifact.path
    if received == artifact.size and storage.sha256_of(part) != artifact.sha256:
        storage.remove(part)
        Artifact.objects.filter(pk=artifact.pk).update(received_bytes=0)  # start over from byte 0
        raise ServiceError(f"The bytes of {path} do not match its declared sha256; upload it again.",
                           "sha256_mismatch")
    with transaction.atomic():
        artifact = Artifact.objects.select_for_update().get(pk=artifact.pk)
        artifact.received_bytes = received
        if received < artifact.size:
            artifact.save(update_fields=["received_bytes"])
            return artifact
        relative = f"artifacts/{job.project_id}/{job.pk}/{path}"
        media(relative).parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, media(relative))
        artifact.file.name = relative
        artifact.complete = True
        artifact.save(update_fields=["received_bytes", "file", "complete"])
    return artifact


# Many small artifacts in one request -----------------------------------------------------------
# The body is a sequence of frames, each a header line `{"path": …, "size": N}` and then exactly N
# bytes (worker_agent.core.outputs writes it). A tar stream was the other candidate: its length cannot be
# told before it is written (long names, padding), and the request needs a Content-Length.

BATCH_MAX_FILES = 2000
BATCH_MAX_BYTES = 256 << 20
BATCH_HEADER_MAX = 4096  # one header line: the path (at most 1024 characters, JSON-escaped) and the size
BATCH_COMMIT_EVERY = 200  # verified files are marked complete in groups: one UPDATE each, not one per file


def receive_batch(job: Job, readable, length) -> dict:
    """Store many declared artifacts sent as frames (see above) in one request body of `length` bytes.
    Each file is written aside, checked against its declared size and sha256, then moved into place;
    verified files are marked complete as the stream goes, so a request cut halfway keeps them and the
    declaration resent afterwards lists only the rest. Files already complete are read past. Returns
    {confirmed: [paths], received_bytes}; bad input raises a ServiceError naming the file (what came
    before it stays stored)."""
    _require_held(job)
    try:
        length = int(length)
    except (TypeError, ValueError):
        raise ServiceError(_("Send the batch with a Content-Length."), "length_required", status=411) from None
    if length > BATCH_MAX_BYTES + BATCH_MAX_FILES * BATCH_HEADER_MAX:
        raise ServiceError(_("A batch holds at most %(files)d files and %(mib)d MiB; send the rest in another one.")
                           % {"files": BATCH_MAX_FILES, "mib": BATCH_MAX_BYTES >> 20}, "batch_too_large", status=413)
    declared = {path: (pk, size, digest, complete) for pk, path, size, digest, complete
                in job.artifacts.values_list("pk", "path", "size", "sha256", "complete")}
    prefix = f"artifacts/{job.project_id}/{job.pk}/"
    scratch = media("partial")
    scratch.mkdir(parents=True, exist_ok=True)
    made: set[Path] = set()
    confirmed: list[str] = []
    verified: list[int] = []
    seen: set[int] = set()
    stored = skipped = 0
    try:
        while True:
            line = readable.readline(BATCH_HEADER_MAX)
            if not line:
                break
            if len(confirmed) >= BATCH_MAX_FILES:
                raise ServiceError(_("A batch holds at most %(files)d files; send the rest in another one.")
                                   % {"files": BATCH_MAX_FILES}, "batch_too_large", status=413)
            path, size = _frame_header(line)
            entry = declared.get(path)
            if entry is None:
                raise ServiceError(_("%(path)s is not declared in this job's result.json; declare it first.")
                                   % {"path": path}, "artifact_not_declared")
            pk, declared_size, digest, complete = entry
            if size != declared_size:
                raise ServiceError(_("%(path)s is %(size)d bytes in the batch but declared as %(declared)d.")
                                   % {"path": path, "size": size, "declared": declared_size}, "size_mismatch")
            if complete or pk in seen:
                _skip(readable, size, path)
                skipped += size
            else:
                target = media(prefix + path)
                if target.parent not in made:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    made.add(target.parent)
                _receive_entry(readable, scratch / f"batch-{uuid.uuid4().hex}", target, path, size, digest)
                verified.append(pk)
                seen.add(pk)
                stored += size
                if len(verified) % BATCH_COMMIT_EVERY == 0:
                    _mark_complete(verified[-BATCH_COMMIT_EVERY:], prefix)
            confirmed.append(path)
    finally:
        _mark_complete(verified[len(verified) - len(verified) % BATCH_COMMIT_EVERY:], prefix)
        log.info("job %s: batch of %d file(s): %d stored (%d bytes), %d bytes already stored", job.pk,
                 len(confirmed), len(verified), stored, skipped)
    return {"confirmed": confirmed, "received_bytes": stored}


def _frame_header(line: bytes) -> tuple[str, int]:
    try:
        header = json.loads(line)
        path, size = header["path"], header["size"]
    except (ValueError, TypeError, KeyError):
        raise ServiceError(_('Each file in a batch starts with a line {"path": …, "size": …}; this one does not.'),
                           "invalid_batch") from None
    if (not isinstance(path, str) or text_problem(path) or isinstance(size, bool) or not isinstance(size, int)
            or size < 0):
        # A path that cannot be stored is not echoed back either: it could not be answered as JSON.
        raise ServiceError(_('Each file in a batch starts with a line {"path": …, "size": …}; this one does not.'),
                           "invalid_batch")
    if path.startswith("/") or ".." in path.split("/"):
        raise ServiceError(_("%(path)s is not a path inside the outputs directory.") % {"path": path},
                           "artifact_not_declared")
    return path, size


def _truncated(path: str) -> ServiceError:
    return ServiceError(_("The batch ended in the middle of %(path)s; send the files not confirmed again.")
                        % {"path": path}, "batch_truncated", status=400)


def _skip(readable, size: int, path: str) -> None:
    while size > 0:
        block = readable.read(min(size, storage.CHUNK))
        if not block:
            raise _truncated(path)
        size -= len(block)


def _receive_entry(readable, part: Path, target: Path, path: str, size: int, digest: str) -> None:
    """`size` bytes of the body into `target`, through `part`, if they match `digest`."""
    try:
        kept = storage.keep_if_hash(readable, part, target, digest, size=size)
    except EOFError:
        raise _truncated(path) from None
    if not kept:
        raise ServiceError(_("The bytes of %(path)s do not match its declared sha256; upload it again.")
                           % {"path": path}, "sha256_mismatch")


def _mark_complete(pks: list[int], prefix: str) -> None:
    if pks:
        Artifact.objects.filter(pk__in=pks, complete=False).update(
            complete=True, received_bytes=F("size"), file=Concat(Value(prefix), F("path")))


def upload_progress(job: Job) -> dict | None:
    """{files, total_files, bytes, total_bytes} while a declared job's artifacts arrive; None before the
    declaration and once all are stored. One query."""
    if not job.result:
        return None
    totals = job.artifacts.aggregate(total_files=Count("pk"), files=Count("pk", filter=Q(complete=True)),
                                     total_bytes=Sum("size"), bytes=Sum("received_bytes"))
    if not totals["total_files"] or totals["files"] == totals["total_files"]:
        return None
    return {key: value or 0 for key, value in totals.items()}


def register_declared(job: Job) -> None:
    """The finished job's `datasets` declarations become dataset versions made of its uploaded output
    files, and its `models` declarations model versions (through the handlers registered above). Call
    inside the completion transaction, after every declared artifact arrived."""
    for section in SECTIONS:
        if (job.result or {}).get(section):
            for _check, register in list(_section_handlers[section].values()):
                register(job)


def missing_artifacts(job: Job) -> list[str]:
    return list(job.artifacts.filter(complete=False).values_list("path", flat=True))
