"""worker/jobs/{id}/log-frames: a job's stdout/stderr as the worker read them, in frames of bytes
(jobs.services.read_log_frames), instead of JSON chunks (worker/jobs/{id}/logs, still served for
older workers). docs/logs.md says why: JSON on both sides and a row per 256 KiB capped delivery at
0.06 of a raw `cat` of the same file.

Routed in worker_api/urls.py:
    path("worker/jobs/<int:job_id>/log-frames", logs.JobLogFramesView.as_view(), name="api-worker-job-log-frames"),
"""
from __future__ import annotations

from django.db import transaction
from drf_spectacular.utils import OpenApiParameter, OpenApiTypes, extend_schema
from rest_framework import exceptions
from rest_framework.response import Response

from jobs import services as job_services
from mado.choices import Scope
from worker_api.views import QueryLeaseMixin, WorkerView, lease_query
from workers import services


class JobLogFramesView(QueryLeaseMixin, WorkerView):
    required_scopes = {"POST": Scope.WORKER_EXECUTE}

    @extend_schema(request={"application/octet-stream": OpenApiTypes.BINARY}, responses=OpenApiTypes.OBJECT,
                   parameters=lease_query() + [OpenApiParameter(
                       "replica", str, description="The cluster replica whose logs these are (main1 when absent).")])
    def post(self, request, job_id):
        worker = services.touch(request.auth, request.query_params.get("worker_id"))
        lease_id = request.query_params.get("lease_id")
        if not lease_id:
            raise exceptions.ValidationError({"lease_id": ["Pass ?lease_id= from the claim."]})
        # The whole body is read before the job's row is locked: a slow upload holds no lock.
        frames = job_services.read_log_frames(request._request, request.META.get("CONTENT_LENGTH"))
        with transaction.atomic():
            job = job_services.leased(worker, job_id, lease_id)
            stored = job_services.append_log_frames(job, frames, replica=request.query_params.get("replica"))
        return Response({"stored": stored, "frames": len(frames)})
