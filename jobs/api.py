"""The jobs API for people and for job tokens."""
from __future__ import annotations

from django.http import FileResponse
from django.utils.translation import gettext as _
from drf_spectacular.utils import OpenApiParameter, OpenApiTypes, extend_schema
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import access, executors, inputs, outputs, services, waiting
from jobs.choices import Stream
from jobs.models import Job
from jobs.serializers import (
    JobCreateSerializer,
    JobLogsSerializer,
    JobMetricsSerializer,
    artifact_body,
    job_body,
    log_body,
    metric_body,
)
from mado import access as identity
from mado.api.views import json_object, project_for
from mado.choices import Role, Scope
from mado.services import Actor
from mado.validation import BIGINT_MAX, as_int

LOG_PAGE = 500
JOB_PAGE = 200




def _job(request, pk: int):
    principal = request.auth
    if principal is not None and principal.is_job and pk != principal.token.job_id \
            and not Job.objects.filter(pk=pk, project_id=principal.project.pk).exists():
        # A job's code reaching outside its project is refused outright (issue 5's job-token matrix).
        raise exceptions.PermissionDenied(_("A job token works only within its own project."),
                                         code="job_token_forbidden")
    job = access.job_for(request.user, pk)
    if principal is not None and principal.project.pk != job.project_id:
        raise exceptions.NotFound(_("No job with this id in your token's project."))
    return job


def _own_job_token(request, job) -> None:
    """Job tokens write only to their own job."""
    principal = request.auth
    if principal is None or not principal.is_job:
        raise exceptions.PermissionDenied(_("Only the job's own job token records into a running job."),
                                          code="job_token_required")
    if principal.token.job_id != job.pk:
        raise exceptions.PermissionDenied(_("A job token may only write to its own job."), code="job_token_forbidden")
    if job.is_terminal:
        raise exceptions.AuthenticationFailed(_("This job token no longer works: its job has ended."))


class ProjectJobsView(APIView):
    required_scopes = {"GET": Scope.READ, "POST": Scope.JOBS_WRITE}

    @extend_schema(operation_id="project_jobs_list", responses=OpenApiTypes.OBJECT, parameters=[
        OpenApiParameter("status", str, description="Only jobs in this status (queued, running, finished, …)."),
        OpenApiParameter("before", int, description="Only jobs with a smaller id: the previous page's next.")])
    def get(self, request, project):
        project = project_for(request, project)
        jobs = (access.visible_in(request.user, project).select_related("project", "target", "created_by", "worker")
                .prefetch_related(*inputs.prefetch_lookups()))
        status = request.query_params.get("status")
        if status:
            jobs = jobs.filter(status=status)
        is_admin = identity.has_role(request.user, project, Role.ADMIN)
        before = as_int(request.query_params.get("before", BIGINT_MAX), low=1, high=BIGINT_MAX)
        if before is None:
            raise exceptions.ValidationError({"before": [_("before is the id of the oldest job you have.")]})
        page = list(jobs.filter(pk__lt=before).order_by("-id")[:JOB_PAGE])
        reasons = waiting.reasons(page)  # why queued jobs wait, in a bounded number of queries
        return Response({"items": [job_body(request.user, job, is_project_admin=is_admin, waiting_reasons=reasons)
                                   for job in page],
                         "next": page[-1].pk if len(page) == JOB_PAGE else None})

    @extend_schema(request=JobCreateSerializer, responses={201: OpenApiTypes.OBJECT})
    def post(self, request, project):
        project = project_for(request, project, Role.MEMBER)
        job = services.create_job(Actor.from_request(request), project, json_object(request))
        return Response(job_body(request.user, job), status=201)


class JobView(APIView):
    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request, pk):
        job = _job(request, pk)
        body = job_body(request.user, job)
        executor = executors.executor_for(job.target.kind if job.target_id else None)
        # site Jobs: scheduler id, job shell version; else null
        body["submission"] = executor.summary(job, request.user) if executor else None
        return Response(body)


class JobStopView(APIView):
    required_scopes = {"POST": Scope.JOBS_WRITE}

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def post(self, request, pk):
        job = services.request_stop(Actor.from_request(request), _job(request, pk))
        return Response(job_body(request.user, job))


class JobLostView(APIView):
    """Mark as lost: a Not responding job whose worker is gone for good ends failed (worker_lost)."""

    required_scopes = {"POST": Scope.JOBS_WRITE}

    @extend_schema(request=None, responses=OpenApiTypes.OBJECT)
    def post(self, request, pk):
        job = services.mark_lost(Actor.from_request(request), _job(request, pk))
        return Response(job_body(request.user, job))


class JobLogsView(APIView):
    required_scopes = {"GET": Scope.READ, "POST": Scope.READ}
    allow_job_token = True

    @extend_schema(parameters=[OpenApiParameter("after", int, description="The last chunk id you have."),
                               OpenApiParameter("replica", str, description="Only this replica's chunks "
                                                                            "(main1, sub1, …); all when absent.")],
                   responses=OpenApiTypes.OBJECT)
    def get(self, request, pk):
        job = _job(request, pk)
        after = as_int(request.query_params.get("after", "0"), low=0, high=BIGINT_MAX)
        if after is None:
            raise exceptions.ValidationError({"after": [_("after is the id of the last chunk you have.")]})
        chunks = job.log_chunks.filter(id__gt=after)
        replica = request.query_params.get("replica")
        if replica:
            if replica not in job.replica_names:
                names = ", ".join(job.replica_names[:8]) + (" …" if job.cluster_size > 8 else "")
                raise exceptions.ValidationError({"replica": [
                    _("This job's replicas are %(replicas)s; choose one of those.") % {"replicas": names}]})
            chunks = chunks.filter(replica=replica)
        chunks = list(chunks.order_by("id")[:LOG_PAGE])
        return Response({"items": [log_body(c) for c in chunks], "next": chunks[-1].pk if chunks else after,
                         "status": job.status})

    @extend_schema(request=JobLogsSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request, pk):
        job = _job(request, pk)
        _own_job_token(request, job)
        stored = services.append_logs(job, json_object(request).get("chunks"), streams=(Stream.APP,))
        return Response({"stored": stored})


class JobMetricsView(APIView):
    required_scopes = {"GET": Scope.READ, "POST": Scope.READ}
    allow_job_token = True

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request, pk):
        job = _job(request, pk)
        return Response({"items": [metric_body(m) for m in job.metrics.all()[:10000]], "next": None})

    @extend_schema(request=JobMetricsSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request, pk):
        job = _job(request, pk)
        _own_job_token(request, job)
        return Response({"stored": services.add_metrics(job, json_object(request).get("metrics"))})


class JobArtifactsView(APIView):
    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request, pk):
        job = _job(request, pk)
        return Response({"items": [artifact_body(a) for a in job.artifacts.all()], "next": None})


class JobArtifactDownloadView(APIView):
    @extend_schema(operation_id="jobs_artifact_download",
                   responses={(200, "application/octet-stream"): OpenApiTypes.BINARY})
    def get(self, request, pk, path):
        job = _job(request, pk)
        artifact = job.artifacts.filter(path=path, complete=True).first()
        if artifact is None:
            raise exceptions.NotFound(_("No uploaded artifact %(path)s in this job.") % {"path": path})
        return FileResponse(artifact.file.open("rb"), as_attachment=True, filename=path.rsplit("/", 1)[-1],
                            content_type=artifact.mime_type or "application/octet-stream")


class SourceUploadView(APIView):
    """PUT the source directory as a .tar.gz body; the answer's id goes into a job's source."""

    required_scopes = {"PUT": Scope.JOBS_WRITE}
    parser_classes: list = []

    @extend_schema(request={"application/gzip": OpenApiTypes.BINARY}, responses={201: OpenApiTypes.OBJECT})
    def put(self, request, project):
        project = project_for(request, project, Role.MEMBER)
        archive = outputs.store_source(Actor.from_request(request), project, request._request)
        return Response({"id": archive.pk, "sha256": archive.sha256, "size": archive.size}, status=201)
