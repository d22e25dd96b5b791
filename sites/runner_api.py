"""The runner API (docs/sites-protocol.md): the runner on a site's compute node reports its Job with
the Job's job token, and only that Job. Every call names the runner (`runner_id`); a second runner of
the same Job is refused with 409 runner_conflict. A cluster job has one runner per replica: each
starts with its `replica`, and a second runner of the same replica is the conflict; a cluster job's
start answer adds `replica_wait_seconds` and its heartbeat answer `replicas_running` (the subs not
ended yet), which main1's runner waits on before its finish ends the Job. Thin views over
sites.submissions."""
from __future__ import annotations

from django.http import FileResponse
from drf_spectacular.utils import OpenApiTypes, extend_schema
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import outputs
from mado.api.views import json_object
from mado.choices import Scope
from sites import serializers as body
from sites import submissions
from sites.models import SiteSettings


class RunnerView(APIView):
    """Only the Job's own job token: people, service accounts and other Jobs' tokens are 403."""

    allow_job_token = True
    required_scopes = {"GET": Scope.READ, "POST": Scope.READ, "PUT": Scope.READ}

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        principal = request.auth
        if principal is None or not principal.is_job:
            raise exceptions.PermissionDenied("Runner endpoints take the Job's job token from its spec directory.",
                                              code="job_token_required")
        if principal.token.job_id != kwargs.get("job_id"):
            raise exceptions.PermissionDenied("A job token reaches only its own Job.", code="job_token_forbidden")


class RunnerStartView(RunnerView):
    @extend_schema(operation_id="runner_start", request=body.RunnerStartSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request, job_id):
        job = submissions.runner_start(job_id, json_object(request))
        site = SiteSettings.objects.get(target_id=job.target_id)
        answer = {"job": submissions.runner_job_payload(job, None, site),
                  "status": job.status,
                  "heartbeat_seconds": submissions.HEARTBEAT_SECONDS,
                  "log_interval_seconds": submissions.LOG_INTERVAL_SECONDS}
        if job.is_cluster:
            answer["replica_wait_seconds"] = submissions.REPLICA_WAIT_SECONDS
        return Response(answer)


class RunnerHeartbeatView(RunnerView):
    @extend_schema(operation_id="runner_heartbeat", request=body.RunnerHeartbeatSerializer,
                   responses=OpenApiTypes.OBJECT)
    def post(self, request, job_id):
        job = submissions.runner_heartbeat(job_id, json_object(request))
        answer = {"cancel_requested": job.stop_requested_at is not None, "status": job.status}
        if job.is_cluster:
            # main1's runner, its code ended, waits for these before its finish ends the Job.
            answer["replicas_running"] = submissions.replicas_running(job)
        return Response(answer)


class RunnerLogsView(RunnerView):
    @extend_schema(operation_id="runner_logs", request=body.RunnerLogsSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request, job_id):
        return Response({"stored": submissions.runner_logs(job_id, json_object(request))})


class RunnerMetricsView(RunnerView):
    @extend_schema(operation_id="runner_metrics", request=body.RunnerMetricsSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request, job_id):
        return Response({"stored": submissions.runner_metrics(job_id, json_object(request))})


class RunnerOutputsView(RunnerView):
    @extend_schema(operation_id="runner_outputs", request=body.RunnerOutputsSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request, job_id):
        return Response({"upload": submissions.runner_outputs(job_id, json_object(request))})


class RunnerFinishView(RunnerView):
    @extend_schema(operation_id="runner_finish", request=body.RunnerFinishSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request, job_id):
        job = submissions.runner_finish(job_id, json_object(request))
        return Response({"id": job.pk, "status": job.status, "end_reason": job.end_reason})


class RunnerArtifactView(RunnerView):
    """The bytes are the body; runner_id travels in the query string."""

    parser_classes: list = []

    @extend_schema(operation_id="runner_artifact_upload", request={"application/octet-stream": OpenApiTypes.BINARY},
                   responses=OpenApiTypes.OBJECT)
    def put(self, request, job_id, path):
        job = submissions.runner_job(job_id, request.query_params.get("runner_id"), uploading=True)
        artifact = outputs.receive_artifact(job, path, request._request, request.headers.get("Content-Range"))
        return Response({"path": artifact.path, "received_bytes": artifact.received_bytes,
                         "complete": artifact.complete})


class RunnerArtifactBatchView(RunnerView):
    """Many small declared artifacts in one body of frames (jobs.outputs.receive_batch), as the worker
    sends them; runner_id travels in the query string."""

    parser_classes: list = []

    @extend_schema(operation_id="runner_artifacts_batch", request={"application/octet-stream": OpenApiTypes.BINARY},
                   responses=OpenApiTypes.OBJECT)
    def put(self, request, job_id):
        job = submissions.runner_job(job_id, request.query_params.get("runner_id"), uploading=True)
        return Response(outputs.receive_batch(job, request._request, request.META.get("CONTENT_LENGTH")))


class RunnerSourceView(RunnerView):
    @extend_schema(operation_id="runner_source", responses={(200, "application/gzip"): OpenApiTypes.BINARY})
    def get(self, request, job_id):
        job = submissions.runner_job(job_id, request.query_params.get("runner_id"))
        return FileResponse(open(outputs.source_file(job), "rb"), content_type="application/gzip")
