"""JSON shapes of jobs for people, for workers, and of their logs and metrics; and the request bodies
of the jobs API, for the OpenAPI schema."""
from __future__ import annotations

from django.conf import settings
from rest_framework import serializers

from computers.choices import Runtime
from jobs import access, cluster, hooks, inputs, waiting
from jobs.choices import MAX_CLUSTER_SIZE, ClusterMode, Stream
from jobs.models import Job
from jobs.services import MAX_METRICS_PER_CALL, MAX_SITE_GPUS, MAX_WALLTIME
from mado.validation import BIGINT_MAX


def job_body(user, job: Job, *, is_project_admin: bool | None = None, waiting_reasons: dict | None = None) -> dict:
    """Lists pass `is_project_admin` and `waiting_reasons` (jobs.waiting.reasons of the page), each worked
    out once for the page. A list that passes no `waiting_reasons` gets no "waiting_reason" rather than
    spend queries on every row; one Job (is_project_admin not given) always has it."""
    body = {
        "id": job.pk,
        "project": job.project.slug,
        "name": job.display_name,
        "created_by": job.created_by.username,
        "computer": {"id": job.target_id, "name": job.target.name},
        "runtime": job.runtime,
        "image": job.image,
        "command": job.command,
        "source": job.source,
        "requirements": job.requirements,
        "parameters": job.parameters,
        "env": job.env,
        "gpu_ids": job.gpu_ids,
        "gpu_count": job.gpu_count,  # sites only: how many GPUs the scheduler gives; null elsewhere
        "input_datasets": inputs.summary(job),
        "walltime_seconds": job.walltime_seconds,
        **cluster_body(job),
        "status": job.status,
        "end_reason": job.end_reason or None,
        "exit_code": job.exit_code,
        "error": job.error or None,
        "worker": job.worker.worker_id if job.worker else None,
        "unresponsive": job.is_unresponsive,
        "stop_requested_at": job.stop_requested_at,
        "can_stop": access.stop_refusal(user, job, is_project_admin=is_project_admin) is None,
        "created_at": job.created_at,
        "claimed_at": job.claimed_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "heartbeat_at": job.heartbeat_at,
    }
    # Why a queued job is not running yet (jobs.waiting), in words; null when nothing holds it back.
    if waiting_reasons is not None:
        body["waiting_reason"] = waiting_reasons.get(job.pk)
    elif is_project_admin is None:
        body["waiting_reason"] = waiting.reason(job)
    return body


def worker_job_payload(job: Job, token: str | None) -> dict:
    """What a worker needs to run the job. The token appears only in claim/resume answers."""
    target = job.target
    return {
        "id": job.pk,
        "lease_id": str(job.lease_id),
        "job_token": token,
        "status": job.status,
        "project": job.project.slug,
        "project_id": job.project_id,
        "run_name": job.display_name,
        "runtime": job.runtime,
        "image": job.image,
        "command": job.command,
        "source": _worker_source(job),
        "requirements": job.requirements,
        "parameters": job.parameters,
        "env": job.env,
        "gpu_ids": job.gpu_ids,
        "walltime_seconds": job.walltime_seconds,
        "cancel_requested": job.stop_requested_at is not None,
        # A claim knows whether the job has inputs from its pick (jobs.services._pick): none, no query.
        "input_datasets": inputs.claim_payload(job) if getattr(job, "has_inputs", True) else [],
        "api_url": settings.PUBLIC_URL,
        "computer": worker_computer(target),
        **worker_cluster(job),
        **hooks.claim_payload(job),  # tracking: run_id, experiment_id (jobs.hooks)
    }


def worker_computer(target) -> dict:
    return {"id": target.pk, "name": target.name, **target.connection(), "working_dir": target.working_dir,
            "python_path": target.python_path, "runtimes": target.runtimes,
            "dataset_transfer": target.dataset_transfer, "dataset_cache_limit_gib": target.dataset_cache_limit_gib,
            "gpu_busy_wait_seconds": target.gpu_busy_wait_seconds}


def worker_cluster(job: Job) -> dict:
    """docs/cluster-jobs.md "Claim payload": every replica with its computer's connection fields.
    For a cluster job the item's own computer and gpu_ids are main1's."""
    if not job.is_cluster:
        return {"cluster_size": 1, "cluster_mode": job.cluster_mode, "replicas": None}
    replicas = list(job.replicas.select_related("target"))
    return {"cluster_size": job.cluster_size, "cluster_mode": job.cluster_mode,
            "gpus_per_replica": job.gpus_per_replica,
            "gpu_ids": replicas[0].gpu_ids if replicas else [],
            "replicas": [{"index": r.index, "name": r.name, "role": r.role, "gpu_ids": r.gpu_ids,
                          "computer": worker_computer(r.target)} for r in replicas]}


def cluster_body(job: Job) -> dict:
    """The cluster fields of the job body for people (docs/cluster-jobs.md "The job body")."""
    replicas = list(job.replicas.select_related("target")) if job.is_cluster else []
    group = job.compute_group if job.compute_group_id else None
    return {
        "cluster_size": job.cluster_size,
        "cluster_mode": job.cluster_mode,
        "gpus_per_replica": job.gpus_per_replica,
        "compute_group": {"id": group.pk, "name": group.name} if group else None,
        "queued_reason": cluster.queued_reason(job),
        "end_replica": job.end_replica or None,
        "replicas": [{"index": r.index, "name": r.name, "role": r.role,
                      "computer": {"id": r.target_id, "name": r.target.name}, "gpu_ids": r.gpu_ids}
                     for r in replicas],
    }


def log_body(chunk) -> dict:
    return {"id": chunk.pk, "replica": chunk.replica, "stream": chunk.stream, "offset": chunk.offset,
            "data": chunk.data,
            "created_at": chunk.created_at}


def metric_body(metric) -> dict:
    return {"name": metric.name, "value": metric.value, "step": metric.step, "timestamp": metric.timestamp}


def _worker_source(job: Job):
    if job.source and job.source.get("kind") == "archive":
        return {**job.source, "download": f"/api/worker/jobs/{job.pk}/source"}
    return job.source


def artifact_body(artifact) -> dict:
    return {"path": artifact.path, "size": artifact.size, "sha256": artifact.sha256, "mime_type": artifact.mime_type,
            "complete": artifact.complete,
            "download": f"/api/jobs/{artifact.job_id}/artifacts/{artifact.path}" if artifact.complete else None}


# Request bodies, for the OpenAPI schema (issue 14: every endpoint with its real request body). The
# validation itself stays in jobs.services, so the API and the pages give the same messages.


class JobSourceSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["git", "archive"])
    url = serializers.CharField(required=False, help_text="git: the repository URL.")
    ref = serializers.CharField(required=False, help_text="git: a branch, tag or commit (default HEAD).")
    id = serializers.IntegerField(required=False, min_value=1, max_value=BIGINT_MAX,
                                  help_text="archive: the id PUT /api/projects/{project}/sources answered.")


class JobCreateSerializer(serializers.Serializer):
    name = serializers.CharField(required=False, allow_blank=True, max_length=200)
    computer = serializers.IntegerField(required=False, min_value=1, max_value=BIGINT_MAX,
                                        help_text="The computer's id; a multi-node cluster job names a "
                                                  "compute_group instead.")
    compute_group = serializers.CharField(required=False, help_text="A compute group's id or name (multi-node).")
    runtime = serializers.ChoiceField(choices=Runtime.choices, required=False, default=Runtime.PYTHON)
    image = serializers.CharField(required=False, allow_blank=True, help_text="docker, apptainer, singularity.")
    command = serializers.ListField(child=serializers.CharField(), min_length=1,
                                    help_text="The argv, such as [\"python\", \"train.py\"]; a string is split "
                                              "like a shell line.")
    source = JobSourceSerializer(required=False, allow_null=True)
    requirements = serializers.CharField(required=False, allow_blank=True, max_length=64 * 1024)
    gpu_ids = serializers.ListField(child=serializers.CharField(), required=False,
                                    help_text="SSH and Local computers: which of the computer's GPUs.")
    gpu_count = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_SITE_GPUS,
                                         help_text="Sites only: how many GPUs the scheduler gives.")
    parameters = serializers.DictField(required=False, help_text="Any JSON object.")
    env = serializers.DictField(child=serializers.CharField(), required=False,
                                help_text="Variable names (letters, digits, _) to strings; not MMT_, MLFLOW_, "
                                          "CUDA_ or NVIDIA_ ones.")
    walltime_seconds = serializers.IntegerField(required=False, allow_null=True, min_value=1,
                                                max_value=MAX_WALLTIME)
    cluster_size = serializers.IntegerField(required=False, min_value=1, max_value=MAX_CLUSTER_SIZE)
    cluster_mode = serializers.ChoiceField(choices=ClusterMode.choices, required=False)
    gpus_per_replica = serializers.IntegerField(required=False, min_value=0, max_value=cluster.MAX_GPUS_PER_REPLICA)
    # Its maxItems is the installed inputs provider's (jobs.inputs), known only once the apps are ready.
    input_datasets = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=BIGINT_MAX),
                                           required=False, help_text="Complete dataset version ids the job reads.")
    notify_me = serializers.BooleanField(required=False,
                                         help_text="E-mail the creator when the job finishes or fails.")
    # Read by tracking through jobs.hooks, which checks it (400 naming run_kind); jobs may not import its choices.
    run_kind = serializers.CharField(required=False,
                                     help_text="The kind of the job's Run: training, fine-tuning, inference, "
                                               "evaluation, preprocessing or other (the default).")

    def get_fields(self):
        fields = super().get_fields()
        fields["input_datasets"] = serializers.ListField(
            child=serializers.IntegerField(min_value=1, max_value=BIGINT_MAX), required=False,
            max_length=inputs.max_count(), help_text=fields["input_datasets"].help_text)
        return fields


class LogChunkSerializer(serializers.Serializer):
    stream = serializers.ChoiceField(choices=Stream.choices,
                                     help_text="Workers write stdout and stderr; a job token writes app.")
    offset = serializers.IntegerField(min_value=0, max_value=BIGINT_MAX,
                                      help_text="The byte offset of data in its stream; a chunk resent with the "
                                                "same offset is stored once.")
    data = serializers.CharField(allow_blank=True, trim_whitespace=False, help_text="Text, at most 1 MiB.")
    replica = serializers.CharField(required=False, help_text="A cluster job's replica (default main1).")


class JobLogsSerializer(serializers.Serializer):
    chunks = LogChunkSerializer(many=True)


class MetricPointSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    value = serializers.FloatField(help_text="A finite number.")
    step = serializers.IntegerField(required=False, default=0, min_value=0, max_value=2**53 - 1)
    timestamp = serializers.DateTimeField(required=False, help_text="ISO 8601; the time it arrives when absent.")


class JobMetricsSerializer(serializers.Serializer):
    metrics = serializers.ListField(child=MetricPointSerializer(), max_length=MAX_METRICS_PER_CALL)
