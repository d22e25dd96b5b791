"""The worker-facing API (scope worker:execute) and the presence lists for people."""
from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.http import FileResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiTypes, extend_schema
from rest_framework import exceptions, serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from computers import services as computer_services
from computers.choices import CHECK_ITEM_KEYS, CheckStatus, EntryKind, ItemStatus, ReadError
from jobs import outputs
from jobs import services as job_services
from jobs.choices import EndReason, JobStatus
from jobs.serializers import LogChunkSerializer, MetricPointSerializer, worker_computer, worker_job_payload
from mado.api.views import json_object
from mado.choices import Scope
from mado.longpoll import notify, wait_for
from mado.validation import BIGINT_MAX, INT32_MAX, INT32_MIN, NAME_PATTERN
from workers import services
from workers.models import Worker

NO_STORE = {"Cache-Control": "no-store"}  # claim and resume answers carry job tokens
GPU_WATCH = "gpu_watch"  # the capability of a worker that reads its computers' GPUs (worker_agent.gpu_watch)


# Request bodies, for the OpenAPI schema (docs/worker-protocol.md). Validation stays in the services.

class WorkerBodySerializer(serializers.Serializer):
    worker_id = serializers.RegexField(NAME_PATTERN.pattern, max_length=64,
                                       help_text="The worker's name, as in its hello.")


class HelloSerializer(WorkerBodySerializer):
    version = serializers.CharField(max_length=64)
    hostname = serializers.CharField(max_length=255)
    parallel_jobs = serializers.IntegerField(required=False, default=2, min_value=1, max_value=256)
    target_ids = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=BIGINT_MAX),
                                       required=False, allow_null=True, max_length=1000,
                                       help_text="The computers it serves; null for every computer it may.")
    capabilities = serializers.ListField(child=serializers.CharField(max_length=64), required=False,
                                         max_length=32)
    ssh_key_candidates = serializers.ListField(child=serializers.CharField(max_length=1024), required=False,
                                               max_length=services.MAX_CANDIDATES,
                                               help_text="Absolute paths only, never contents.")
    known_hosts_candidates = serializers.ListField(child=serializers.CharField(max_length=1024), required=False,
                                                   max_length=services.MAX_CANDIDATES,
                                                   help_text="Absolute paths only, never contents.")


class WaitBodySerializer(WorkerBodySerializer):
    wait = serializers.FloatField(required=False, default=0, min_value=0, max_value=30,
                                  help_text="Seconds to hold the request until something arrives (long-poll).")


class ClaimSerializer(WaitBodySerializer):
    active_job_ids = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=BIGINT_MAX),
                                           required=False, help_text="The job ids this worker runs now.")


class ResumeSerializer(WorkerBodySerializer):
    active_job_ids = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=BIGINT_MAX),
                                           required=False, help_text="The job ids this worker runs now.")


class LeasedBodySerializer(WorkerBodySerializer):
    lease_id = serializers.UUIDField(help_text="The lease from the claim.")


class CheckItemSerializer(serializers.Serializer):
    key = serializers.ChoiceField(choices=CHECK_ITEM_KEYS)
    status = serializers.ChoiceField(choices=ItemStatus.choices)
    code = serializers.CharField(required=False, allow_null=True)
    detail = serializers.CharField(required=False, allow_blank=True)


class CheckResultSerializer(serializers.Serializer):
    items = CheckItemSerializer(many=True, max_length=32)
    machine = serializers.DictField(required=False, help_text="{arch, cores, memory_bytes, home}")
    pythons = serializers.ListField(child=serializers.DictField(), required=False, max_length=64,
                                    help_text="[{path, version}]")
    workdirs = serializers.ListField(child=serializers.DictField(), required=False, max_length=128,
                                     help_text="[{path, writable, free_bytes}]")
    gpus = serializers.ListField(child=serializers.DictField(), required=False, max_length=64,
                                 help_text="[{index, uuid, name, memory_mib}]")
    runtimes = serializers.ListField(child=serializers.CharField(), required=False)


class CheckCompleteSerializer(LeasedBodySerializer):
    status = serializers.ChoiceField(choices=[CheckStatus.SUCCEEDED, CheckStatus.FAILED])
    result = CheckResultSerializer()


class ReadEntrySerializer(serializers.Serializer):
    name = serializers.CharField()
    kind = serializers.ChoiceField(choices=EntryKind.choices)


class ReadCompleteSerializer(LeasedBodySerializer):
    entries = ReadEntrySerializer(many=True, required=False, max_length=computer_services.MAX_READ_ENTRIES)
    error = serializers.ChoiceField(choices=[e for e in ReadError.values if e != ReadError.NOT_CLAIMED],
                                    required=False, allow_null=True, allow_blank=True)


class JobHeartbeatSerializer(LeasedBodySerializer):
    status = serializers.ChoiceField(choices=[JobStatus.RUNNING], required=False, allow_null=True,
                                     help_text="running, once the job started.")
    waiting = serializers.CharField(required=False, allow_blank=True, max_length=450,
                                    help_text="Why a claimed job waits before it starts (its GPUs are in use by a "
                                              "process outside Mado); shown on the job's timeline.")


class JobReleaseSerializer(LeasedBodySerializer):
    reason = serializers.CharField(max_length=job_services.MAX_RELEASE_REASON,
                                   help_text="Why the worker gives the claimed job back (its GPUs stayed in use by a "
                                             "process outside Mado); shown on the job's timeline.")


class WorkerLogsSerializer(LeasedBodySerializer):
    chunks = LogChunkSerializer(many=True)


class WorkerMetricsSerializer(LeasedBodySerializer):
    metrics = serializers.ListField(child=MetricPointSerializer(), max_length=job_services.MAX_METRICS_PER_CALL)


class JobCompleteSerializer(LeasedBodySerializer):
    status = serializers.ChoiceField(choices=[JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED])
    exit_code = serializers.IntegerField(required=False, allow_null=True, min_value=INT32_MIN, max_value=INT32_MAX)
    error = serializers.CharField(required=False, allow_blank=True)
    end_reason = serializers.ChoiceField(choices=EndReason.choices, required=False, allow_null=True)
    replica = serializers.CharField(required=False, allow_null=True, allow_blank=True,
                                    help_text="A cluster job: the replica whose end ended it.")


class OutputFileSerializer(serializers.Serializer):
    path = serializers.CharField()
    size = serializers.IntegerField(min_value=0)
    sha256 = serializers.CharField(required=False, allow_blank=True)
    kind = serializers.CharField(required=False, default="file")


class OutputsSerializer(LeasedBodySerializer):
    result = serializers.CharField(allow_blank=True, trim_whitespace=False, help_text="The text of result.json.")
    files = OutputFileSerializer(many=True, help_text="The outputs directory as the worker saw it.")
    manifest = serializers.CharField(required=False, allow_null=True, trim_whitespace=False)
    max_files = serializers.IntegerField(
        min_value=1, required=False,
        help_text="The worker's MMT_WORKER_MAX_OUTPUT_FILES; the server applies it up to MADO_MAX_OUTPUT_FILES.")


class OutsideProcessSerializer(serializers.Serializer):
    pid = serializers.IntegerField(min_value=1, max_value=computer_services.MAX_PID)
    user = serializers.CharField(max_length=computer_services.MAX_PROCESS_USER,
                                 help_text="The process's owner on the computer (printable).")


class GpuReadingSerializer(serializers.Serializer):
    id = serializers.CharField(max_length=64, help_text="The GPU ID as registered on the computer.")
    utilization = serializers.FloatField(min_value=0, max_value=100, allow_null=True, required=False,
                                         help_text="Percent; null where the GPU cannot say.")
    memory_used_mib = serializers.FloatField(min_value=0, allow_null=True, required=False)
    memory_total_mib = serializers.FloatField(min_value=0, allow_null=True, required=False)
    outside = OutsideProcessSerializer(many=True, required=False, max_length=computer_services.MAX_OUTSIDE_PROCESSES,
                                       help_text="Processes on the GPU that belong to no Mado job.")


class GpuReadingsSerializer(WorkerBodySerializer):
    gpus = GpuReadingSerializer(many=True, max_length=computer_services.MAX_READING_GPUS)


def lease_query() -> list[OpenApiParameter]:
    return [OpenApiParameter("worker_id", str, required=True, description="The worker's name."),
            OpenApiParameter("lease_id", OpenApiTypes.UUID, required=True, description="The lease from the claim.")]


class WorkerView(APIView):
    """Base of the worker endpoints: a worker:execute token, never a browser session."""

    required_scopes = {"POST": Scope.WORKER_EXECUTE}

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        if request.auth is None or request.auth.is_job:
            raise exceptions.PermissionDenied("Worker endpoints take a service-account token with worker:execute.",
                                              code="worker_token_required")

    def body(self) -> dict:
        return json_object(self.request)

    def worker(self) -> Worker:
        worker = services.touch(self.request.auth, self.body().get("worker_id"))
        # Its service account is the token's user, loaded by the authentication with its service account.
        worker.account = self.request.auth.token.user
        return worker

    def wait_seconds(self) -> float:
        wait = self.body().get("wait", 0)
        if not isinstance(wait, (int, float)) or isinstance(wait, bool) or not 0 <= wait <= 30:
            raise exceptions.ValidationError({"wait": ["wait is a number of seconds from 0 to 30."]})
        return float(wait)

    def claim_answer(self, claim, channel: str, item_json) -> Response:
        """A claim's answer: what `claim` takes within the request's wait, as `item_json` shows it."""
        try:
            item = wait_for(claim, self.wait_seconds(), channel)
        except services.WorkerStopped as stopped:
            return Response({"item": None, "reason": stopped.reason})
        return Response({"item": None if item is None else item_json(item)})


class HelloView(WorkerView):
    @extend_schema(request=HelloSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request):
        worker = services.hello(request.auth, self.body())
        answer = {"worker_id": worker.worker_id, "online": True, "server_time": worker.last_seen_at,
                  "hello_interval_seconds": 60}
        if GPU_WATCH in (worker.capabilities or []):
            # The computers whose GPUs it reads every MMT_WORKER_GPU_WATCH_SECONDS (docs/gpus.md "The GPU
            # watch"); with each hello, so a computer added, disabled or changed is followed within a minute.
            worker.account = request.auth.token.user
            answer["gpu_watch"] = [dict(worker_computer(target), gpu_ids=[str(g) for g in target.gpu_ids])
                                   for target in computer_services.served_for_gpu_watch(worker)]
        return Response(answer)


class GoodbyeView(WorkerView):
    """A worker draining before it exits (SIGTERM): it is offline at once and takes nothing more; the
    jobs it claimed but never started go back to the queue. The next hello brings it back."""

    @extend_schema(request=WorkerBodySerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request):
        worker = self.worker()
        released = job_services.worker_stopping(worker)
        # Its long-polls still open end now (WorkerStopped), freeing their threads: wake them.
        notify(job_services.JOBS_CHANNEL, topic=str(worker.project_id))
        notify(computer_services.CHECKS_CHANNEL)
        notify(computer_services.READS_CHANNEL)
        return Response({"worker_id": self.body().get("worker_id"), "online": False, "released_job_ids": released})


class GpuReadingsView(WorkerView):
    """What the worker's GPU watch read on a computer it serves (docs/gpus.md "The GPU watch"): each
    registered GPU's utilisation and memory now and the processes outside Mado on it, for the GPU board."""

    @extend_schema(request=GpuReadingsSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request, computer_id):
        worker = self.worker()
        stored, ignored = computer_services.record_gpu_readings(worker, computer_id, self.body().get("gpus"))
        return Response({"stored": stored, "ignored": ignored})


def _check_item(check) -> dict:
    target = check.target
    return {
        "id": check.pk,
        "lease_id": str(check.lease_id),
        "api_url": settings.PUBLIC_URL,
        "computer": {"id": target.pk, "name": target.name, **target.connection(),
                     "working_dir": target.working_dir, "python_path": target.python_path,
                     "gpu_ids": target.gpu_ids, "runtimes": target.runtimes},
    }


class CheckClaimView(WorkerView):
    @extend_schema(request=WaitBodySerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request):
        worker = self.worker()
        return self.claim_answer(lambda: computer_services.claim_check(worker), computer_services.CHECKS_CHANNEL,
                                 _check_item)


class CheckCompleteView(WorkerView):
    @extend_schema(request=CheckCompleteSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request, check_id):
        body = self.body()
        check = computer_services.complete_check(self.worker(), check_id, lease_id=body.get("lease_id"),
                                                 status=body.get("status"), result=body.get("result"))
        return Response({"id": check.pk, "status": check.status})


class ReadClaimView(WorkerView):
    @extend_schema(request=WaitBodySerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request):
        worker = self.worker()
        return self.claim_answer(lambda: computer_services.claim_read(worker), computer_services.READS_CHANNEL,
                                 lambda read: {"id": read.pk, "lease_id": str(read.lease_id), "path": read.path,
                                               "connection": read.connection})


class ReadCompleteView(WorkerView):
    @extend_schema(request=ReadCompleteSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request, read_id):
        body = self.body()
        read = computer_services.complete_read(self.worker(), read_id, lease_id=body.get("lease_id"),
                                               entries=body.get("entries"), error=body.get("error"))
        return Response({"id": read.pk, "status": read.status})


# Jobs ---------------------------------------------------------------------------------------------

def _active_ids(body: dict) -> list[int]:
    ids = body.get("active_job_ids", [])
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise exceptions.ValidationError({"active_job_ids": ["A list of the job ids this worker runs now."]})
    return ids


class JobClaimView(WorkerView):
    """Never retried by the worker after a network error: it calls resume instead."""

    @extend_schema(request=ClaimSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request):
        # Read by its first claim, under the claim's lock: one query for presence and lock (issue 19).
        worker = services.unread(request.auth, self.body().get("worker_id"))
        active = _active_ids(self.body())
        try:
            claimed = wait_for(lambda: job_services.claim_job(worker, active), self.wait_seconds(),
                               job_services.JOBS_CHANNEL, topic=str(worker.project_id))
        except job_services.ActiveJobsEnded as wake:
            # A wake-up, not a conflict: the worker has room again and claims at once.
            return Response({"item": None, "reason": wake.reason, "ended_job_ids": wake.job_ids},
                            headers=NO_STORE)
        except services.WorkerStopped as stopped:
            return Response({"item": None, "reason": stopped.reason}, headers=NO_STORE)
        if claimed is None:
            return Response({"item": None}, headers=NO_STORE)
        job, token = claimed
        return Response({"item": worker_job_payload(job, token)}, headers=NO_STORE)


class JobResumeView(WorkerView):
    @extend_schema(request=ResumeSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request):
        worker = self.worker()
        held = job_services.resume(worker, _active_ids(self.body()))
        return Response({"items": [worker_job_payload(job, token) for job, token in held]}, headers=NO_STORE)


class LeasedJobView(WorkerView):
    def leased_body(self) -> dict:
        body = self.body()
        if not body.get("lease_id"):
            raise exceptions.ValidationError({"lease_id": ["The lease id from the claim is required."]})
        return body


class JobHeartbeatView(LeasedJobView):
    @extend_schema(request=JobHeartbeatSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request, job_id):
        body = self.leased_body()
        job = job_services.heartbeat(self.worker(), job_id, lease_id=body["lease_id"], status=body.get("status"),
                                     waiting=body.get("waiting"))
        return Response({"cancel_requested": job.stop_requested_at is not None, "status": job.status})


class JobReleaseView(LeasedJobView):
    """A claimed job the worker will not start (its GPUs stayed busy outside Mado): back to the queue,
    not handed to this worker again for a while (jobs.services.release)."""

    @extend_schema(request=JobReleaseSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request, job_id):
        body = self.leased_body()
        job = job_services.release(self.worker(), job_id, body["lease_id"], body.get("reason"))
        return Response({"id": job.pk, "status": job.status})


class JobLogsView(LeasedJobView):
    @extend_schema(request=WorkerLogsSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request, job_id):
        body = self.leased_body()
        with transaction.atomic():
            job = job_services.leased(self.worker(), job_id, body["lease_id"])
            stored = job_services.append_logs(job, body.get("chunks"))
        return Response({"stored": stored})


class JobMetricsView(LeasedJobView):
    @extend_schema(request=WorkerMetricsSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request, job_id):
        body = self.leased_body()
        with transaction.atomic():
            job = job_services.leased(self.worker(), job_id, body["lease_id"])
            stored = job_services.add_metrics(job, body.get("metrics"))
        return Response({"stored": stored})


class JobCompleteView(LeasedJobView):
    @extend_schema(request=JobCompleteSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request, job_id):
        body = self.leased_body()
        job = job_services.complete(self.worker(), job_id, lease_id=body["lease_id"], status=body.get("status"),
                                    exit_code=body.get("exit_code"), error=body.get("error") or "",
                                    end_reason=body.get("end_reason"), replica=body.get("replica"))
        return Response({"id": job.pk, "status": job.status, "end_reason": job.end_reason})


class JobOutputsView(LeasedJobView):
    """The result.json declaration and the outputs directory listing; answers what to upload."""

    @extend_schema(request=OutputsSerializer, responses=OpenApiTypes.OBJECT)
    def post(self, request, job_id):
        body = self.leased_body()
        with transaction.atomic():
            job = job_services.leased(self.worker(), job_id, body["lease_id"])
            upload = outputs.record_outputs(job, result_text=body.get("result"), files=body.get("files"),
                                            manifest_text=body.get("manifest"), token_scopes=request.auth.scopes,
                                            worker_max_files=body.get("max_files"))
        return Response({"upload": upload})


class QueryLeaseMixin:
    """Binary endpoints carry worker_id and lease_id in the query string; the body is the bytes."""

    parser_classes: list = []

    def query_leased(self, request, job_id):
        worker = services.touch(request.auth, request.query_params.get("worker_id"))
        lease_id = request.query_params.get("lease_id")
        if not lease_id:
            raise exceptions.ValidationError({"lease_id": ["Pass ?lease_id= from the claim."]})
        with transaction.atomic():
            return job_services.leased(worker, job_id, lease_id)


class JobArtifactUploadView(QueryLeaseMixin, WorkerView):
    required_scopes = {"PUT": Scope.WORKER_EXECUTE}

    @extend_schema(request={"application/octet-stream": OpenApiTypes.BINARY}, responses=OpenApiTypes.OBJECT,
                   parameters=lease_query())
    def put(self, request, job_id, path):
        job = self.query_leased(request, job_id)
        artifact = outputs.receive_artifact(job, path, request._request, request.headers.get("Content-Range"))
        return Response({"path": artifact.path, "received_bytes": artifact.received_bytes,
                         "complete": artifact.complete})


class JobArtifactBatchView(QueryLeaseMixin, WorkerView):
    """Many small declared artifacts in one body of frames (jobs.outputs.receive_batch); answers which
    files it confirmed."""
    required_scopes = {"PUT": Scope.WORKER_EXECUTE}

    @extend_schema(request={"application/octet-stream": OpenApiTypes.BINARY}, responses=OpenApiTypes.OBJECT,
                   parameters=lease_query())
    def put(self, request, job_id):
        job = self.query_leased(request, job_id)
        return Response(outputs.receive_batch(job, request._request, request.META.get("CONTENT_LENGTH")))


class JobSourceView(QueryLeaseMixin, WorkerView):
    required_scopes = {"GET": Scope.WORKER_EXECUTE}

    @extend_schema(responses={(200, "application/gzip"): OpenApiTypes.BINARY}, parameters=lease_query())
    def get(self, request, job_id):
        job = self.query_leased(request, job_id)
        return FileResponse(open(outputs.source_file(job), "rb"), content_type="application/gzip")
