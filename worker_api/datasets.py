"""The dataset endpoints of workers: the serving worker reads a job's input versions (relay transfer)
and reports the computer's dataset cache, all under the job's lease."""
from __future__ import annotations

from django.db import transaction
from drf_spectacular.utils import OpenApiTypes, extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from datasets import archive, services
from datasets.api import files_parameter, ranged_file
from datasets.models import DatasetVersion
from jobs import services as job_services
from jobs.choices import HELD_STATUSES
from mado.choices import Scope
from mado.errors import Conflict, ServiceError
from mado.validation import BIGINT_MAX, INT32_MAX
from worker_api.views import LeasedBodySerializer, LeasedJobView, QueryLeaseMixin, WorkerView, lease_query


class CacheUsageSerializer(serializers.Serializer):
    used_bytes = serializers.IntegerField(min_value=0, max_value=BIGINT_MAX)
    limit_bytes = serializers.IntegerField(min_value=0, max_value=BIGINT_MAX)
    complete_count = serializers.IntegerField(min_value=0, max_value=INT32_MAX)
    pinned_count = serializers.IntegerField(min_value=0, max_value=INT32_MAX)


class CacheReportSerializer(LeasedBodySerializer):
    usage = CacheUsageSerializer()


def _leased_input(view, request, job_id: int, version_pk: int) -> DatasetVersion:
    job = view.query_leased(request, job_id)
    if job.status not in HELD_STATUSES:
        raise Conflict(f"Job {job.pk} already ended ({job.status}); its inputs are no longer needed.", "job_ended")
    return services.job_input(job, version_pk)


class WorkerInputManifestView(QueryLeaseMixin, WorkerView):
    """GET ?worker_id=&lease_id=: the manifest of an input version of a job this worker holds."""

    required_scopes = {"GET": Scope.WORKER_EXECUTE}

    @extend_schema(operation_id="worker_job_dataset_manifest", responses=OpenApiTypes.OBJECT,
                   parameters=lease_query())
    def get(self, request, job_id, version):
        version = _leased_input(self, request, job_id, version)
        return Response({"digest": version.digest, "items": version.manifest()})


class WorkerInputFileView(QueryLeaseMixin, WorkerView):
    """GET ?worker_id=&lease_id=: one file of an input version (Range allowed), for the worker that
    holds the job; its token may belong to another project than the job's."""

    required_scopes = {"GET": Scope.WORKER_EXECUTE}

    @extend_schema(operation_id="worker_job_dataset_file", parameters=lease_query(),
                   responses={(200, "application/octet-stream"): OpenApiTypes.BINARY})
    def get(self, request, job_id, version, path):
        version = _leased_input(self, request, job_id, version)
        entry = services.entry_for(version, path)
        return ranged_file(request, services.media(entry.file.file.name), entry.size, entry.sha256)


class WorkerInputArchiveView(QueryLeaseMixin, WorkerView):
    """GET ?worker_id=&lease_id=[&files=…]: an input version as one uncompressed tar (datasets.archive),
    the whole version or the files named; POST {"files": [...]} with the same query names more files
    than a URL holds (the part of a version that a cache lacks)."""

    required_scopes = {"GET": Scope.WORKER_EXECUTE, "POST": Scope.WORKER_EXECUTE}

    @extend_schema(operation_id="worker_job_dataset_archive", parameters=lease_query(),
                   responses={(200, "application/x-tar"): OpenApiTypes.BINARY})
    def get(self, request, job_id, version):
        version = _leased_input(self, request, job_id, version)
        return archive.response_for(version, files_parameter(request))

    @extend_schema(operation_id="worker_job_dataset_archive_part", parameters=lease_query(),
                   request=OpenApiTypes.OBJECT, responses={(200, "application/x-tar"): OpenApiTypes.BINARY})
    def post(self, request, job_id, version):
        version = _leased_input(self, request, job_id, version)
        return archive.response_for(version, files_parameter(request))


class WorkerCacheUsageView(LeasedJobView):
    """POST {worker_id, lease_id, usage}: the computer's dataset cache as found after the inputs of
    this job were ensured (shown on the computer's details page)."""

    @extend_schema(operation_id="worker_job_dataset_cache", request=CacheReportSerializer,
                   responses=OpenApiTypes.OBJECT)
    def post(self, request, job_id):
        body = self.leased_body()
        with transaction.atomic():
            job = job_services.leased(self.worker(), job_id, body["lease_id"])
            _check_cache_counts(body.get("usage"))
            services.record_cache_usage(job, body.get("worker_id"), body.get("usage"))
        return Response({"recorded": True})


def _check_cache_counts(usage) -> None:
    """The report's version and pinned counts are 32-bit columns: a larger count is refused here, where
    the database would otherwise fail (found by tests/test_fuzz_schema.py)."""
    counts = [usage.get(k) for k in ("complete_count", "pinned_count")] if isinstance(usage, dict) else []
    if any(isinstance(count, int) and count > INT32_MAX for count in counts):
        raise ServiceError(f"usage counts complete_count and pinned_count are whole numbers from 0 to {INT32_MAX}.",
                           "invalid_usage", fields={"usage": ["Count out of range."]})
