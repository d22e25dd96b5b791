"""The datasets API (/api/projects/{p}/datasets/…): viewers read; members write, with `registry:write`
on API tokens. File bytes go up as one tar of many files (PUT …/archive) or with PUT in resumable parts,
and come down as one tar (GET|POST …/archive) or with GET and Range."""
from __future__ import annotations

import json
import re
from pathlib import Path

from django.db.models import Count, Q
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from drf_spectacular.utils import OpenApiTypes, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from datasets import access, archive, services
from datasets.choices import VersionStatus
from datasets.models import DatasetVersion
from mado.api.views import json_object, project_for
from mado.choices import Role, Scope
from mado.errors import Conflict, ServiceError
from mado.exceptions import error_body
from mado.permissions import JobTokenForbidden
from mado.services import Actor

WRITE = {"GET": Scope.READ, "POST": Scope.REGISTRY_WRITE, "PUT": Scope.REGISTRY_WRITE}
VERSION_PAGE = 200
BYTE_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
STREAM_CHUNK = 1024 * 1024


# Request bodies, for the OpenAPI schema. Validation stays in datasets.services and datasets.manifest.

class DatasetCreateSerializer(serializers.Serializer):
    name = serializers.RegexField(services.NAME_PATTERN.pattern, max_length=100,
                                  help_text="Letters, digits, '.', '_' or '-'; unique in the project, ignoring case.")
    description = serializers.CharField(required=False, allow_blank=True, max_length=services.MAX_DESCRIPTION)


class ManifestEntrySerializer(serializers.Serializer):
    path = serializers.CharField(max_length=1024, help_text="A relative path with '/' between directories.")
    sha256 = serializers.RegexField(r"^[0-9a-fA-F]{64}$", help_text="The file's SHA-256, 64 hex digits.")
    size = serializers.IntegerField(min_value=0, help_text="The file's size in bytes.")


class VersionCreateSerializer(serializers.Serializer):
    manifest = ManifestEntrySerializer(many=True, allow_empty=False)


def dataset_body(dataset, version_count: int | None = None) -> dict:
    latest = dataset.versions.filter(status=VersionStatus.COMPLETE).order_by("-number").first()
    return {"id": dataset.pk, "name": dataset.name, "description": dataset.description,
            "created_by": dataset.created_by.username, "created_at": dataset.created_at.isoformat(),
            "version_count": version_count if version_count is not None
            else dataset.versions.filter(status=VersionStatus.COMPLETE).count(),
            "latest_version": version_body(latest) if latest else None}


def version_body(version: DatasetVersion, upload: list[dict] | None = None) -> dict:
    body = {"id": version.pk, "dataset": {"id": version.dataset_id, "name": version.dataset.name},
            "number": version.number, "status": version.status, "digest": version.digest,
            "file_count": version.file_count, "total_size": version.total_size, "uri": version.uri or None,
            "schema": version.schema, "metadata": version.metadata, "created_by": version.created_by.username,
            "created_at": version.created_at.isoformat(),
            "completed_at": version.completed_at.isoformat() if version.completed_at else None,
            "job": version.job_id}
    if upload is not None:
        body["upload"] = upload
    return body


def _writable(request, project_key: str):
    project = project_for(request, project_key, Role.MEMBER)
    access.require_write(request.user, project)
    return project


def _version(request, project_key, dataset_key, pk, *, write=False) -> DatasetVersion:
    project = _writable(request, project_key) if write else project_for(request, project_key)
    return access.version_for(access.dataset_for(request.user, project, dataset_key), pk)


class DatasetListView(APIView):
    required_scopes = WRITE

    @extend_schema(operation_id="datasets_list", responses=OpenApiTypes.OBJECT)
    def get(self, request, project):
        project = project_for(request, project)
        datasets = access.visible_in(request.user, project).select_related("created_by").annotate(
            complete_versions=Count("versions", filter=Q(versions__status=VersionStatus.COMPLETE)))
        return Response({"items": [dataset_body(d, d.complete_versions) for d in datasets], "next": None})

    @extend_schema(operation_id="datasets_create", request=DatasetCreateSerializer, responses={201: OpenApiTypes.OBJECT})
    def post(self, request, project):
        project = _writable(request, project)
        dataset = services.create_dataset(Actor.from_request(request), project, json_object(request))
        return Response(dataset_body(dataset, 0), status=201)


class DatasetView(APIView):
    @extend_schema(operation_id="datasets_retrieve", responses=OpenApiTypes.OBJECT)
    def get(self, request, project, dataset):
        project = project_for(request, project)
        return Response(dataset_body(access.dataset_for(request.user, project, dataset)))


class VersionListView(APIView):
    """POST {"manifest": [{path, sha256, size}, …]} creates a version (201), or answers an existing
    one (200): the caller's unfinished upload of the same files, or the latest version when it
    already holds them. `upload` lists the files whose bytes the server still needs."""

    required_scopes = WRITE

    @extend_schema(operation_id="dataset_versions_list", responses=OpenApiTypes.OBJECT)
    def get(self, request, project, dataset):
        project = project_for(request, project)
        dataset = access.dataset_for(request.user, project, dataset)
        versions = dataset.versions.select_related("dataset", "created_by").order_by("-id")[:VERSION_PAGE]
        return Response({"items": [version_body(v) for v in versions], "next": None})

    @extend_schema(operation_id="dataset_versions_create", request=VersionCreateSerializer,
                   responses={201: OpenApiTypes.OBJECT, 200: OpenApiTypes.OBJECT})
    def post(self, request, project, dataset):
        project = _writable(request, project)
        dataset = access.dataset_for(request.user, project, dataset)
        version, created = services.create_version(Actor.from_request(request), dataset,
                                                   json_object(request).get("manifest"))
        upload = services.pending_uploads(version) if not version.is_complete else []
        return Response(version_body(version, upload), status=201 if created else 200)


class VersionView(APIView):
    @extend_schema(operation_id="dataset_version_retrieve", responses=OpenApiTypes.OBJECT)
    def get(self, request, project, dataset, version):
        return Response(version_body(_version(request, project, dataset, version)))


class VersionManifestView(APIView):
    @extend_schema(operation_id="dataset_version_manifest", responses=OpenApiTypes.OBJECT)
    def get(self, request, project, dataset, version):
        version = _version(request, project, dataset, version)
        return Response({"digest": version.digest, "items": version.manifest()})


class VersionCompleteView(APIView):
    required_scopes = WRITE

    @extend_schema(operation_id="dataset_version_complete", request=None, responses=OpenApiTypes.OBJECT)
    def post(self, request, project, dataset, version):
        version = _version(request, project, dataset, version, write=True)
        return Response(version_body(services.complete_version(Actor.from_request(request), version)))


class VersionFileView(APIView):
    """PUT a file's bytes (Content-Range: bytes start-end/size for a part); GET them (Range allowed)."""

    required_scopes = WRITE
    parser_classes: list = []

    @extend_schema(operation_id="dataset_file_upload", request={"application/octet-stream": OpenApiTypes.BINARY},
                   responses=OpenApiTypes.OBJECT)
    def put(self, request, project, dataset, version, path):
        version = _version(request, project, dataset, version, write=True)
        stored = services.receive_file(version, path, request._request, request.headers.get("Content-Range"))
        return Response({"path": path, "sha256": stored.sha256, "size": stored.size,
                         "received_bytes": stored.received_bytes, "complete": stored.complete})

    @extend_schema(operation_id="dataset_file_download", responses={(200, "application/octet-stream"): OpenApiTypes.BINARY})
    def get(self, request, project, dataset, version, path):
        version = _version(request, project, dataset, version)
        if not version.is_complete:
            raise Conflict("This version is still uploading; read its files once it is complete.",
                           "version_incomplete")
        entry = services.entry_for(version, path)
        return ranged_file(request, services.media(entry.file.file.name), entry.size, entry.sha256)


class VersionArchiveView(APIView):
    """GET [?files=a&files=b]: a complete version, or the files named, as one uncompressed tar
    (datasets.archive); POST {"files": [...]} for more names than a URL holds. Viewers and job tokens
    of the project read it (direct transfer: the computer downloads with the job token; seed 001: a job
    token reads within its project). PUT: an uncompressed tar of files of an uploading version
    (services.receive_archive), for members with `registry:write`; never a job token."""

    required_scopes = {"GET": Scope.READ, "POST": Scope.READ, "PUT": Scope.REGISTRY_WRITE}
    # The POST is a read (a list of names too long for a URL); PUT refuses job tokens itself.
    allow_job_token = True
    parser_classes: list = []

    # The body is an uncompressed tar (the CLI labels it application/x-tar); the content type is not
    # checked, and the schema says octet-stream like the file PUT, for clients that know no tar type.
    @extend_schema(operation_id="dataset_version_archive_upload",
                   request={"application/octet-stream": OpenApiTypes.BINARY}, responses=OpenApiTypes.OBJECT)
    def put(self, request, project, dataset, version):
        if getattr(request.auth, "is_job", False):
            raise JobTokenForbidden()
        version = _version(request, project, dataset, version, write=True)
        try:
            answer = services.receive_archive(version, request._request, request.META.get("CONTENT_LENGTH"))
        except ServiceError:
            _drain(request._request)
            raise
        return Response(answer)

    @extend_schema(operation_id="dataset_version_archive",
                   responses={(200, "application/x-tar"): OpenApiTypes.BINARY})
    def get(self, request, project, dataset, version):
        return archive.response_for(_version(request, project, dataset, version), files_parameter(request))

    @extend_schema(operation_id="dataset_version_archive_part", request=OpenApiTypes.OBJECT,
                   responses={(200, "application/x-tar"): OpenApiTypes.BINARY})
    def post(self, request, project, dataset, version):
        return archive.response_for(_version(request, project, dataset, version), files_parameter(request))


def _drain(readable) -> None:
    """Read the rest of a refused body: a client still sending gets the refusal (which names the file)
    only if the server takes its body to the end; a server that closes instead leaves it a broken pipe."""
    try:
        while readable.read(STREAM_CHUNK):
            pass
    except OSError:
        pass  # the client is gone


def files_parameter(request) -> list[str] | None:
    """`files` of an archive request: repeated in the query of a GET, a JSON list in a POST body
    ({"files": [...]}); None asks for the whole version."""
    if request.method == "POST":
        try:
            body = json.loads(request._request.body or b"null")
        except (ValueError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict) or "files" not in body:
            raise ServiceError('Send {"files": [paths of the manifest]} as the JSON body.', "invalid_files",
                               fields={"files": ["Required."]})
        return archive.clean_files(body["files"])
    raw = request.query_params.getlist("files")
    return archive.clean_files(raw) if raw else None


def ranged_file(request, location, size: int, sha256: str) -> HttpResponse:
    """The file, or the one byte range asked for (206). Several ranges in one request are answered
    with the whole file, as RFC 9110 allows; an unsatisfiable range is 416."""
    start, end, status = 0, size - 1, 200
    match = BYTE_RANGE.match(request.headers.get("Range", "").strip())
    if match and (match.group(1) or match.group(2)):
        if match.group(1):
            start = int(match.group(1))
            end = min(int(match.group(2)), size - 1) if match.group(2) else size - 1
        else:
            start = max(size - int(match.group(2)), 0)
        if start >= size or start > end:
            response = JsonResponse(error_body(f"The range starts beyond the file's {size} bytes; ask for bytes "
                                               f"0-{max(size - 1, 0)}.", "range_not_satisfiable"), status=416)
            response["Content-Range"] = f"bytes */{size}"
            return response
        status = 206
    length = max(end - start + 1, 0)
    if not Path(location).is_file():
        # The row says complete but the bytes are gone from storage: nothing a retry could fix.
        return JsonResponse(error_body("The server no longer holds this file's bytes; upload the version again.",
                                       "file_missing"), status=404)
    response = StreamingHttpResponse(_read(location, start, length), status=status,
                                     content_type="application/octet-stream")
    response["Content-Length"] = str(length)
    response["Accept-Ranges"] = "bytes"
    response["ETag"] = f'"{sha256}"'
    if status == 206:
        response["Content-Range"] = f"bytes {start}-{end}/{size}"
    return response


def _read(location, start: int, length: int):
    with open(location, "rb") as handle:
        handle.seek(start)
        while length > 0:
            block = handle.read(min(length, STREAM_CHUNK))
            if not block:
                return
            length -= len(block)
            yield block
