"""JSON shapes of computers, checks and reads. Which fields a caller gets is decided by computers.access."""
from __future__ import annotations

from rest_framework import serializers

from computers import access
from computers.choices import CHECK_ITEM_LABELS, CheckFailure, CheckStatus, ReadError
from computers.models import CONNECTION_FIELDS, CheckBase, ComputeTarget, DirectoryRead

PUBLIC_FIELDS = ["id", "name", "kind", "visibility", "enabled"]
# ssh_user: who Jobs run as (issue 14, finding 6) — on a Public SSH computer every project's Jobs run as
# this one account, so the people who use it may know its name. Host, port and key paths stay hidden.
USER_FIELDS = ["cpu_arch", "runtimes", "gpu_ids", "concurrency", "dataset_transfer", "dataset_cache_limit_gib",
               "gpu_busy_wait_seconds", "ssh_user"]
MANAGER_FIELDS = [*CONNECTION_FIELDS, "working_dir", "python_path"]


def computer_body(user, target: ComputeTarget, *, usable: bool | None = None) -> dict:
    manager = access.can_manage(user, target)
    if usable is None:
        usable = manager or access.can_use(user, target)
    body = {field: getattr(target, field) for field in PUBLIC_FIELDS}
    body["owner"] = target.owner.username
    body["state"] = "enabled" if target.enabled else "disabled"
    body["usable"] = usable
    body["manageable"] = manager
    if usable or manager:
        body.update({field: getattr(target, field) for field in USER_FIELDS})
    if manager:
        body.update({field: getattr(target, field) for field in MANAGER_FIELDS})
        body["last_check_worker"] = target.last_check_worker.worker_id if target.last_check_worker else None
        body["last_check_worker_id"] = target.last_check_worker_id  # the row: names can be shared
    return body


def check_body(check: CheckBase) -> dict:
    # A site's check (kinds.checks_of) has no worker: its worker fields are null.
    requested, claimed = getattr(check, "requested_worker", None), getattr(check, "claimed_by", None)
    result = check.result or None
    if result:
        result = {**result, "items": [{**item, "label": str(CHECK_ITEM_LABELS.get(item["key"], item["key"]))}
                                      for item in result.get("items", [])]}
    return {
        "id": check.pk,
        "computer": check.target_id,
        "status": check.status,
        "status_text": str(CheckStatus(check.status).label),
        "failure_reason": check.failure_reason or None,
        "failure_text": str(CheckFailure(check.failure_reason).label) if check.failure_reason else None,
        "requested_worker": requested.worker_id if requested else None,
        "claimed_by": claimed.worker_id if claimed else None,
        "requested_worker_id": requested.pk if requested else None,
        "claimed_by_id": claimed.pk if claimed else None,
        "created_at": check.created_at,
        "claimed_at": check.claimed_at,
        "finished_at": check.finished_at,
        "result": result,
    }


def read_body(read: DirectoryRead) -> dict:
    return {
        "id": read.pk,
        "computer": read.target_id,
        "path": read.path,
        "status": read.status,
        "entries": read.entries,
        "error": read.error or None,
        "error_text": str(ReadError(read.error).label) if read.error else None,
        "worker": read.requested_worker.worker_id,
        "requested_worker_id": read.requested_worker_id,
    }


class ComputerInputSerializer(serializers.Serializer):
    """Documentation of the accepted fields; validation lives in computers.services so the API and the
    pages give the same messages."""

    name = serializers.CharField(required=False)
    kind = serializers.ChoiceField(choices=["ssh", "local"], required=False)
    visibility = serializers.ChoiceField(choices=["private", "public"], required=False)
    enabled = serializers.BooleanField(required=False)
    host = serializers.CharField(required=False)
    port = serializers.IntegerField(required=False, min_value=1, max_value=65535)
    ssh_user = serializers.CharField(required=False)
    ssh_key_path = serializers.CharField(required=False)
    known_hosts_path = serializers.CharField(required=False)
    working_dir = serializers.CharField(required=False)
    python_path = serializers.CharField(required=False)
    cpu_arch = serializers.ChoiceField(choices=["amd64", "arm64"], required=False)
    runtimes = serializers.ListField(child=serializers.CharField(), required=False)
    gpu_ids = serializers.ListField(child=serializers.CharField(), required=False)
    concurrency = serializers.IntegerField(required=False, min_value=1, max_value=128)
    dataset_transfer = serializers.ChoiceField(choices=["relay", "direct"], required=False)
    dataset_cache_limit_gib = serializers.IntegerField(required=False, min_value=1)
    gpu_busy_wait_seconds = serializers.IntegerField(
        required=False, min_value=0, max_value=86400,
        help_text="How long a job waits for its GPUs to be free of processes outside Mado before the worker "
                  "gives the claim back; 0 turns the check off. Default 600 (10 minutes).")


class CheckRequestSerializer(serializers.Serializer):
    worker = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=2**63 - 1,
                                      help_text="The worker's id (GET /api/workers); global administrators only.")
    worker_id = serializers.CharField(required=False, allow_null=True, allow_blank=True, max_length=64,
                                      help_text="A worker's name; refused when two online workers share it.")


class ReadRequestSerializer(serializers.Serializer):
    path = serializers.CharField(max_length=1024)
    worker = serializers.IntegerField(required=False, min_value=1, max_value=2**63 - 1,
                                      help_text="The worker's id (GET /api/workers).")
    worker_id = serializers.CharField(required=False, max_length=64,
                                      help_text="A worker's name; refused when two online workers share it.")

    def validate(self, attrs):
        if attrs.get("worker") is None and not attrs.get("worker_id"):
            raise serializers.ValidationError({"worker": ["Name the worker that reads: its id (worker)."]})
        return attrs
