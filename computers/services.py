"""State changes of computers, connection checks and directory reads. Each runs in one transaction
and writes an AuditEvent where a person changed something."""
from __future__ import annotations

import json
import re
import time
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from computers import kinds, locks
from computers.choices import (
    CHECK_ITEM_KEYS,
    RESOLUTIONS,
    CheckStatus,
    CpuArch,
    DatasetTransfer,
    EntryKind,
    ItemStatus,
    Kind,
    ReadError,
    ReadStatus,
    Runtime,
    Visibility,
)
from computers.models import (
    CONNECTION_FIELDS,
    GPU_BUSY_WAIT_DEFAULT_SECONDS,
    GPU_BUSY_WAIT_MAX_SECONDS,
    ComputeTarget,
    ConnectionCheck,
    DirectoryRead,
    GpuReading,
)
from mado.errors import Conflict, Forbidden, ServiceError
from mado.longpoll import notify
from mado.services import SYSTEM, Actor, audit
from mado.validation import NAME_PATTERN, as_int, int_field, text_problem
from workers import services as worker_services

GPU_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")
CHECK_CLAIM_TIMEOUT = timedelta(minutes=5)
CHECK_RESULT_TIMEOUT = timedelta(minutes=5)
READ_CLAIM_TIMEOUT = timedelta(seconds=60)
READ_RETENTION = timedelta(minutes=10)
MAX_READ_ENTRIES = 5000
CHECKS_CHANNEL = "mado_checks"
READS_CHANNEL = "mado_reads"
_last_expiry = 0.0
EDITABLE_FIELDS = ["name", "visibility", "enabled", *CONNECTION_FIELDS, "working_dir", "python_path", "cpu_arch",
                   "runtimes", "gpu_ids", "concurrency", "dataset_transfer", "dataset_cache_limit_gib",
                   "gpu_busy_wait_seconds"]
# The locked fields by the names the Edit dialog gives them.
LOCKED_LABELS = {
    "kind": gettext_lazy("Type"), "host": gettext_lazy("Host"), "port": gettext_lazy("Port"),
    "ssh_user": gettext_lazy("SSH user"), "ssh_key_path": gettext_lazy("SSH key path"),
    "known_hosts_path": gettext_lazy("known_hosts path"), "runtimes": gettext_lazy("Supported runtimes"),
    "gpu_ids": gettext_lazy("GPU IDs"), "dataset_transfer": gettext_lazy("Dataset transfer"),
    "dataset_cache_limit_gib": gettext_lazy("Dataset cache limit (GiB)"),
}
SECRET_PATTERNS = [re.compile(r"(?:mmtj?|mado_mtj)_[A-Za-z0-9_-]{16,}"), re.compile(r"PRIVATE KEY"),
                   re.compile(r"ssh-(ed25519|rsa|dss) AAAA")]


# Computers --------------------------------------------------------------------------------------

def register_computer(actor: Actor, data: dict) -> ComputeTarget:
    """Step 1 of Add computer, or a whole computer through the API. Disabled unless asked otherwise
    with a working directory and a Python path."""
    kind = data.get("kind") or Kind.SSH
    if kind == Kind.SITE:
        raise ServiceError(_("Sites are added with the site form (Type Site under Add computer) or POST /api/sites."),
                           "kind_reserved", fields={"kind": [_("Use the site form or POST /api/sites.")]})
    from computers import access

    if actor.user is not None and not access.can_add(actor.user, kind):
        raise Forbidden(_("Only global administrators can add SSH and Local computers."), "global_admin_required")
    values = _clean({"kind": kind, **data}, target=None)
    try:
        with transaction.atomic():
            target = ComputeTarget.objects.create(owner=actor.user, **values)
            audit(actor, "computer.create", target, after=_snapshot(target))
    except IntegrityError:
        # Two admins adding the same name at once: the case-insensitive unique index decides.
        raise ServiceError(
            _("A computer named %(name)s already exists; choose another name.") % {"name": values["name"]},
            "invalid_computer", fields={"name": [_("Already taken.")]}) from None
    if target.enabled:
        notify("mado_jobs")
    return target


def update_computer(actor: Actor, target: ComputeTarget, changes: dict) -> ComputeTarget:
    from computers import access

    handlers = kinds.handlers_for(target.kind)
    if handlers is not None:  # a kind of a higher app (a site): its own fields and rules
        return handlers.update(actor, target, changes)
    if actor.user is not None and not access.can_manage(actor.user, target):
        raise Forbidden(_("Only the computer's owner and global administrators can change it."), "not_owner")
    unknown = sorted(set(changes) - set(EDITABLE_FIELDS))
    if unknown:
        raise ServiceError(_("These fields cannot be changed: %(fields)s.") % {"fields": ", ".join(unknown)},
                           "read_only_fields", fields={name: [_("Read only.")] for name in unknown})
    if set(changes) == {"enabled"}:
        return _set_enabled(actor, target, changes["enabled"])
    with transaction.atomic():
        target = ComputeTarget.objects.select_for_update().get(pk=target.pk)
        values = _clean({**_snapshot(target), **changes}, target=target)
        changed = {k: v for k, v in values.items() if getattr(target, k) != v}
        if not changed:
            return target
        jobs = locks.active_jobs(target)
        held = locks.locked_changes(target, changed, jobs)
        if held:
            raise Conflict(
                _("Jobs %(jobs)s are queued or running on this computer, so %(fields)s cannot change now; save "
                  "after the Jobs end.") % {"jobs": locks.describe_jobs(jobs),
                                            "fields": ", ".join(str(LOCKED_LABELS.get(f, f)) for f in held)},
                "computer_in_use", fields={name: [_("Locked while Jobs use this computer.")] for name in held})
        before = {k: _jsonable(getattr(target, k)) for k in changed}
        for field, value in changed.items():
            setattr(target, field, value)
        target.save()
        _audit_changes(actor, target, before, changed)
    if changed.get("enabled"):
        notify("mado_jobs")
    return target


def set_enabled(actor: Actor, target: ComputeTarget, enabled: bool) -> ComputeTarget:
    """Enable/Disable in the list: always allowed, even while Jobs run (disabling only stops new ones)."""
    return update_computer(actor, target, {"enabled": enabled})


def _set_enabled(actor: Actor, target: ComputeTarget, enabled) -> ComputeTarget:
    """Only the enable rule applies: a Local computer can be disabled outside development mode too."""
    if not isinstance(enabled, bool):
        raise ServiceError(_("enabled is true or false."), "invalid_computer",
                           fields={"enabled": [_("true or false")]})
    with transaction.atomic():
        target = ComputeTarget.objects.select_for_update().get(pk=target.pk)
        if target.enabled == enabled:
            return target
        missing = [f for f in ("working_dir", "python_path") if not getattr(target, f)] if enabled else []
        if missing:
            raise ServiceError(_("Enter the working directory and the Python executable path before enabling."),
                               "invalid_computer",
                               fields={f: [_("Required to enable the computer.")] for f in missing})
        target.enabled = enabled
        target.save(update_fields=["enabled", "updated_at"])
        _audit_changes(actor, target, {"enabled": not enabled}, {"enabled": enabled})
    if enabled:
        notify("mado_jobs")
    return target


def apply_suggested_settings(actor: Actor, target: ComputeTarget, *, gpu_ids=None, runtimes=None) -> ComputeTarget:
    changes = {}
    if gpu_ids is not None:
        changes["gpu_ids"] = gpu_ids
    if runtimes is not None:
        changes["runtimes"] = runtimes
    return update_computer(actor, target, changes)


def _audit_changes(actor: Actor, target: ComputeTarget, before: dict, changed: dict) -> None:
    """One audit row per kind of change: enabling, visibility and the other settings each have theirs."""
    if "enabled" in changed:
        audit(actor, "computer.enable" if changed["enabled"] else "computer.disable", target,
              before={"enabled": before["enabled"]}, after={"enabled": changed["enabled"]})
    if "visibility" in changed:
        audit(actor, "computer.visibility_change", target,
              before={"visibility": before["visibility"]}, after={"visibility": changed["visibility"]})
    rest = {k: v for k, v in changed.items() if k not in ("enabled", "visibility")}
    if rest:
        audit(actor, "computer.update", target, before={k: before[k] for k in rest},
              after={k: _jsonable(v) for k, v in rest.items()})


def clean_name_and_visibility(data: dict, errors: dict, *, current: ComputeTarget | None) -> dict:
    """The fields every kind of computer shares (SSH, Local and sites): a unique name, a visibility."""
    name = str(data.get("name") or "").strip()
    if not NAME_PATTERN.match(name):
        errors["name"] = [_("Use 1–64 letters, digits, '.', '_' or '-', starting with a letter or digit.")]
    elif ComputeTarget.objects.filter(name__iexact=name).exclude(pk=current.pk if current else None).exists():
        errors["name"] = [_("A computer named %(name)s already exists; choose another name.") % {"name": name}]
    visibility = data.get("visibility") or Visibility.PRIVATE
    if visibility not in Visibility.values:
        errors["visibility"] = [_("Visibility must be public or private.")]
    return {"name": name, "visibility": visibility}


def _clean(data: dict, *, target: ComputeTarget | None) -> dict:
    """Validate the editable fields; every problem is collected so the form shows all of them."""
    errors: dict[str, list[str]] = {}
    out: dict = {}
    kind = data.get("kind", Kind.SSH)
    if kind not in (Kind.SSH, Kind.LOCAL):
        errors["kind"] = [_("Type must be SSH or Local.")]
    elif kind == Kind.LOCAL and not settings.DEV_MODE:
        errors["kind"] = [_("Local computers exist only in development mode (MADO_DEV_MODE=true).")]
    out["kind"] = kind

    out.update(clean_name_and_visibility(data, errors, current=target))

    if kind == Kind.SSH:
        out["host"] = str(data.get("host") or "").strip()
        if not out["host"] or any(c.isspace() for c in out["host"]) or len(out["host"]) > 255:
            errors["host"] = [_("Enter the SSH host name or address.")]
        out["port"] = int_field(data.get("port", 22), 1, 65535, "port", errors,
                              _("Port must be between 1 and 65535."))
        out["ssh_user"] = str(data.get("ssh_user") or "").strip()
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$", out["ssh_user"]):
            errors["ssh_user"] = [_("Enter the SSH user to connect as.")]
        for field, message in (("ssh_key_path", _("Enter the absolute SSH key path on the worker machine.")),
                               ("known_hosts_path", _("Enter the absolute known_hosts path on the worker machine."))):
            out[field] = str(data.get(field) or "").strip()
            if not out[field].startswith("/"):
                errors[field] = [message]
    else:
        out.update(host="", port=22, ssh_user="", ssh_key_path="", known_hosts_path="")

    for field, message in (("working_dir", _("The working directory must be an absolute path on the computer.")),
                           ("python_path", _("The Python executable path must be an absolute path on the computer."))):
        out[field] = str(data.get(field) or "").strip()
        if out[field] and (not out[field].startswith("/") or "\n" in out[field]):
            errors[field] = [message]

    out["cpu_arch"] = data.get("cpu_arch") or CpuArch.AMD64
    if out["cpu_arch"] not in CpuArch.values:
        errors["cpu_arch"] = [_("CPU architecture must be amd64 or arm64.")]

    runtimes = data.get("runtimes") or []
    if not isinstance(runtimes, list) or not all(isinstance(r, str) for r in runtimes) \
            or not set(runtimes) <= set(Runtime.values):
        errors["runtimes"] = [_("Runtimes must be chosen from %(runtimes)s.") % {"runtimes": ", ".join(Runtime.values)}]
        runtimes = []
    out["runtimes"] = [r for r in Runtime.values if r in runtimes]

    gpu_ids = data.get("gpu_ids") or []
    if isinstance(gpu_ids, str):
        gpu_ids = gpu_ids.split()
    if isinstance(gpu_ids, list) and all(isinstance(g, (str, int)) and not isinstance(g, bool) for g in gpu_ids):
        gpu_ids = [str(g).strip() for g in gpu_ids if str(g).strip()]
    else:
        gpu_ids = None
    if gpu_ids is None or not all(GPU_ID_PATTERN.match(g) for g in gpu_ids) or len(set(gpu_ids)) != len(gpu_ids):
        errors["gpu_ids"] = [_("GPU IDs are numbers or GPU UUIDs, one per line, each once.")]
        gpu_ids = []
    out["gpu_ids"] = gpu_ids

    default_concurrency = max(1, len(gpu_ids))
    raw = data.get("concurrency")
    out["concurrency"] = int_field(default_concurrency if raw in (None, "") else raw, 1, 128, "concurrency", errors,
                                 _("Concurrent jobs must be between 1 and 128."))
    out["dataset_transfer"] = data.get("dataset_transfer") or DatasetTransfer.RELAY
    if out["dataset_transfer"] not in DatasetTransfer.values:
        errors["dataset_transfer"] = [_("Dataset transfer must be relay or direct.")]
    out["dataset_cache_limit_gib"] = int_field(data.get("dataset_cache_limit_gib", 100), 1, 1_000_000,
                                             "dataset_cache_limit_gib", errors,
                                             _("The dataset cache limit is from 1 to 1,000,000 GiB."))
    raw = data.get("gpu_busy_wait_seconds")
    out["gpu_busy_wait_seconds"] = int_field(
        GPU_BUSY_WAIT_DEFAULT_SECONDS if raw in (None, "") else raw, 0, GPU_BUSY_WAIT_MAX_SECONDS,
        "gpu_busy_wait_seconds", errors,
        _("The wait for GPUs busy outside Mado is from 0 (no check) to %(max)s seconds (a day).")
        % {"max": f"{GPU_BUSY_WAIT_MAX_SECONDS:,}"})
    out["enabled"] = data.get("enabled", False)
    if not isinstance(out["enabled"], bool):
        errors["enabled"] = [_("enabled is true or false.")]
        out["enabled"] = False
    if out["enabled"]:
        missing = [f for f in ("working_dir", "python_path") if not out[f]]
        for field in missing:
            errors.setdefault(field, []).append(_("Required to enable the computer."))
    if errors:
        summary = " ".join(message for messages in errors.values() for message in messages)
        raise ServiceError(summary, "invalid_computer", fields=errors)
    return out


def _snapshot(target: ComputeTarget) -> dict:
    return {field: _jsonable(getattr(target, field)) for field in ["kind", *EDITABLE_FIELDS]}


def _jsonable(value):
    return list(value) if isinstance(value, (list, tuple)) else value


# Connection checks ------------------------------------------------------------------------------

def request_check(actor: Actor, target: ComputeTarget, worker=None) -> ConnectionCheck:
    from computers import access

    if actor.user is not None and not access.can_manage(actor.user, target):
        raise Forbidden(_("Only the computer's owner and global administrators can run connection checks."),
                        "not_owner")
    if worker is not None and actor.user is not None and not access.can_choose_worker(actor.user):
        raise Forbidden(_("Only global administrators can choose the worker for a check."), "global_admin_required")
    expire_stale(force=True)
    # The worker row, never its name: a worker of another service account saying the same name is
    # another worker and never receives this computer's connection (issue 13).
    named = worker if worker is not None else target.last_check_worker
    if named is None and not access.workers_for_unnamed_check(target):
        # Nobody would claim it: say so now rather than after the 5 minutes of CHECK_CLAIM_TIMEOUT.
        raise Conflict(
            _("No online worker handles %(name)s, so nobody would pick up this check: a check that names no worker "
              "goes only to a worker whose MMT_WORKER_TARGET_IDS includes %(id)s. Start one with --target-ids "
              "%(id)s (see Worker settings in the computer's details), or have a global administrator choose an "
              "online worker in Worker for this connection under Edit computer and press Check again.")
            % {"name": target.name, "id": target.pk}, "no_worker_for_check")
    try:
        with transaction.atomic():
            check = ConnectionCheck.objects.create(target=target, requested_by=actor.user, requested_worker=named)
            if worker is not None:
                ComputeTarget.objects.filter(pk=target.pk).update(last_check_worker=worker)
            audit(actor, "computer.check.request", target,
                  after={"check": check.pk, "worker": named.worker_id if named else None})
    except IntegrityError:
        raise Conflict(_("A connection check of this computer is already waiting or running; wait for its result."),
                       "target_check_in_progress") from None
    notify(CHECKS_CHANNEL)
    return check


def expire_stale(*, force: bool = False) -> None:
    """Checks nobody claimed within 5 minutes, or claimed without a result for 5 minutes, end as expired;
    reads older than 10 minutes are forgotten. Runs at most once a second per process: long-polls call
    it on every round, and the deadlines are minutes long."""
    global _last_expiry
    if not force and time.monotonic() - _last_expiry < 1.0:
        return
    _last_expiry = time.monotonic()
    now = timezone.now()
    # Workers' checks: a site's launcher checks (sites.SiteCheck) have their own, shorter deadline.
    expired = list(ConnectionCheck.objects.filter(
        Q(status=CheckStatus.QUEUED, created_at__lt=now - CHECK_CLAIM_TIMEOUT)
        | Q(status=CheckStatus.CLAIMED, claimed_at__lt=now - CHECK_RESULT_TIMEOUT)).select_related("target"))
    for check in expired:
        if check.expire(now):
            audit(SYSTEM, "computer.check.finish", check.target,
                  after={"check": check.pk, "status": "expired", "failure_reason": check.failure_reason})
    DirectoryRead.objects.filter(status=ReadStatus.QUEUED, created_at__lt=now - READ_CLAIM_TIMEOUT).update(
        status=ReadStatus.FAILED, error=ReadError.NOT_CLAIMED, finished_at=now)
    DirectoryRead.objects.filter(created_at__lt=now - READ_RETENTION).delete()


def claim_check(worker) -> ConnectionCheck | None:
    """Hand the oldest check this worker may take to it. A resent claim returns the check it holds,
    with the same lease, so a lost answer never makes a second claim."""
    expire_stale()
    with transaction.atomic():
        # Serialise one worker's duplicate claims: the second sees the check the first took.
        current = type(worker).objects.select_for_update().filter(pk=worker.pk).first()
        if current is None or worker_services.stopped_meanwhile(worker, current.stopped_at):
            return None  # a stopping worker takes nothing new
        held = ConnectionCheck.objects.filter(status=CheckStatus.CLAIMED, claimed_by=worker).select_related("target")
        if (check := held.first()) is not None:
            return check
        eligible = ConnectionCheck.objects.filter(status=CheckStatus.QUEUED, requested_worker=worker)
        if worker.target_ids:
            # Unnamed checks: only computers in the worker's target ids that it may serve at all.
            from computers.access import unnamed_checks_served_by

            eligible = eligible | ConnectionCheck.objects.filter(
                status=CheckStatus.QUEUED, requested_worker__isnull=True,
                target__in=unnamed_checks_served_by(worker))
        # SKIP LOCKED: two workers polling at once never wait on, or both take, the same row.
        check = (ConnectionCheck.objects.filter(pk__in=eligible.values("pk")).order_by("created_at", "id")
                 .select_for_update(skip_locked=True, of=("self",)).first())
        if check is None:
            return None
        check.status = CheckStatus.CLAIMED
        check.claimed_by = worker
        check.claimed_at = timezone.now()
        check.lease_id = uuid.uuid4()
        check.save(update_fields=["status", "claimed_by", "claimed_at", "lease_id"])
    return ConnectionCheck.objects.select_related("target").get(pk=check.pk)


def complete_check(worker, check_id: int, *, lease_id, status: str, result) -> ConnectionCheck:
    if status not in (CheckStatus.SUCCEEDED, CheckStatus.FAILED):
        raise ServiceError("status must be succeeded or failed.", "invalid", fields={"status": ["Invalid."]})
    expire_stale(force=True)
    with transaction.atomic():
        check = (ConnectionCheck.objects.select_for_update(of=("self",)).select_related("target")
                 .filter(pk=check_id).first())
        if check is None or check.claimed_by_id != worker.pk:
            raise ServiceError("No check with this id is held by this worker.", "not_found", status=404)
        if str(check.lease_id) != str(lease_id):
            raise Conflict("This lease is not the check's current lease; drop the check.", "invalid_lease")
        if not check.finish(status, lambda: _clean_result(result, check.target)):
            return check  # the same result resent
        audit(Actor(user=worker.token.user), "computer.check.finish", check.target,
              after={"check": check.pk, "status": status, "worker": worker.worker_id})
    return check


def _clean_result(result, target: ComputeTarget) -> dict:
    if not isinstance(result, dict):
        raise ServiceError("result must be an object with items, machine, pythons, workdirs, gpus and runtimes.",
                           "invalid_result", fields={"result": ["Object expected."]})
    text = json.dumps(result)
    secrets = [p for p in (target.ssh_key_path, target.known_hosts_path) if p and p in text]
    if secrets or any(pattern.search(text) for pattern in SECRET_PATTERNS):
        raise ServiceError("The result contains a key path, a token or key material; nothing was stored. "
                           "Update the worker: results must be sanitised.", "target_check_secret_in_result")
    if len(text) > 256 * 1024:
        raise ServiceError("The result is larger than 256 KiB.", "invalid_result")
    items = []
    for raw in _list_of_dicts(result, "items", 32):
        if raw.get("key") not in CHECK_ITEM_KEYS or raw.get("status") not in ItemStatus.values:
            raise ServiceError(f"Each item needs a key from {', '.join(CHECK_ITEM_KEYS)} and a status from "
                               f"{', '.join(ItemStatus.values)}.", "invalid_result", fields={"items": ["Invalid item."]})
        code = raw.get("code") if isinstance(raw.get("code"), str) else ""
        items.append({"key": raw["key"], "status": raw["status"], "code": code,
                      "detail": _sanitise(str(raw.get("detail") or "")),
                      "resolution": str(RESOLUTIONS.get(code, "")) if raw["status"] == ItemStatus.FAILED else ""})
    machine = result.get("machine") or {}
    if not isinstance(machine, dict) or any(not isinstance(machine[k], str) for k in ("arch", "home")
                                            if machine.get(k) is not None):
        raise ServiceError("machine is an object {arch: text, cores, memory_bytes, home: text}.", "invalid_result",
                           fields={"machine": ["Object expected."]})
    arch = _text(machine.get("arch"), 32)
    return {
        "items": items,
        "machine": {"arch": {"x86_64": "amd64", "aarch64": "arm64"}.get(arch, arch),
                    "cores": as_int(machine.get("cores"), low=1, high=1_000_000),
                    "memory_bytes": as_int(machine.get("memory_bytes"), low=0, high=2**62),
                    "home": _path(machine.get("home"))},
        "pythons": [{"path": _path(p.get("path")), "version": _text(p.get("version"), 32)}
                    for p in _list_of_dicts(result, "pythons", 64) if _path(p.get("path"))],
        "workdirs": [{"path": _path(w.get("path")), "writable": w.get("writable") is True,
                      "free_bytes": as_int(w.get("free_bytes"), low=0, high=2**62)}
                     for w in _list_of_dicts(result, "workdirs", 128) if _path(w.get("path"))],
        "gpus": [{"index": as_int(g.get("index"), low=0, high=1024), "uuid": _text(g.get("uuid"), 64),
                  "name": _text(g.get("name"), 128), "memory_mib": as_int(g.get("memory_mib"), low=0, high=2**40)}
                 for g in _list_of_dicts(result, "gpus", 64)],
        "runtimes": [r for r in result.get("runtimes", []) if isinstance(r, str) and r in Runtime.values]
        if isinstance(result.get("runtimes", []), list) else [],
    }


def _list_of_dicts(result: dict, key: str, limit: int) -> list[dict]:
    value = result.get(key, [])
    if not isinstance(value, list) or len(value) > limit or not all(isinstance(v, dict) for v in value):
        raise ServiceError(f"{key} is a list of at most {limit} objects.", "invalid_result",
                           fields={key: ["List of objects expected."]})
    return value


def _text(value, limit: int) -> str:
    return _sanitise(value)[:limit] if isinstance(value, str) else ""


def _path(value) -> str:
    return value if isinstance(value, str) and value.startswith("/") and len(value) <= 1024 \
        and value.isprintable() else ""


def _sanitise(text: str) -> str:
    return "".join(ch for ch in text if ch.isprintable())[:200]


# GPU readings of the worker's GPU watch (issue 22, docs/gpus.md "The GPU watch") --------------------------

MAX_READING_GPUS = 64
MAX_OUTSIDE_PROCESSES = 32
MAX_PROCESS_USER = 64
MAX_PID = 2**31 - 1
MAX_MIB = float(2**40)


def served_for_gpu_watch(worker):
    """The computers whose GPUs `worker` watches and may report: the SSH and Local computers it serves
    (computers.access.served_by_worker, the same rule as its jobs), narrowed by its target ids when it
    has some, enabled, with registered GPUs (jobs.services._claimable narrows the same way)."""
    from computers import access

    served = access.served_by_worker(worker.account).filter(enabled=True).exclude(gpu_ids=[])
    if worker.target_ids:
        served = served.filter(pk__in=worker.target_ids)
    return served.order_by("pk")


def record_gpu_readings(worker, computer_id: int, gpus) -> tuple[int, list[str]]:
    """Store what the worker's GPU watch read on a computer it serves: one GpuReading per registered GPU,
    updated in place (one statement: INSERT … ON CONFLICT DO UPDATE). GPU IDs the computer does not
    register (changed since the worker's last hello) are left out and returned. A computer this worker
    does not serve is a 404, so a worker learns nothing of others' computers."""
    target = served_for_gpu_watch(worker).filter(pk=computer_id).first()
    if target is None:
        raise ServiceError("No enabled computer with registered GPUs and this id that this worker serves (its "
                           "service account may use it, within its MMT_WORKER_TARGET_IDS).", "not_found", status=404)
    readings = _clean_readings(gpus)
    registered = {str(g) for g in target.gpu_ids or []}
    ignored = [r["gpu_id"] for r in readings if r["gpu_id"] not in registered]
    now = timezone.now()
    rows = [GpuReading(target=target, worker=worker, seen_at=now, **r) for r in readings if r["gpu_id"] in registered]
    if rows:
        GpuReading.objects.bulk_create(
            rows, update_conflicts=True, unique_fields=["target", "gpu_id"],
            update_fields=["utilization", "memory_used", "memory_total", "outside", "seen_at", "worker"])
    return len(rows), ignored


def _clean_readings(gpus) -> list[dict]:
    """The body's `gpus`, checked whole before anything is stored: each problem named by its place
    (`gpus[2].outside[0].user`), all of them in one 422."""
    if not isinstance(gpus, list) or len(gpus) > MAX_READING_GPUS:
        raise ServiceError(f"gpus is a list of at most {MAX_READING_GPUS} objects {{id, utilization, "
                           "memory_used_mib, memory_total_mib, outside}.", "invalid_gpu_readings",
                           fields={"gpus": [f"A list of at most {MAX_READING_GPUS} objects."]})
    errors: dict[str, list[str]] = {}
    cleaned, seen = [], set()
    for number, raw in enumerate(gpus):
        at = f"gpus[{number}]"
        if not isinstance(raw, dict):
            errors[at] = ["An object {id, utilization, memory_used_mib, memory_total_mib, outside}."]
            continue
        gpu_id = raw.get("id")
        if not isinstance(gpu_id, str) or not GPU_ID_PATTERN.match(gpu_id):
            errors[f"{at}.id"] = ["The GPU ID as registered: an index such as 0 or a UUID such as GPU-…"]
        elif gpu_id in seen:
            errors[f"{at}.id"] = [f"GPU {gpu_id} is in the list twice."]
        seen.add(gpu_id if isinstance(gpu_id, str) else None)
        values = {}
        for key, field, high, meaning in (("utilization", "utilization", 100.0, "percent from 0 to 100"),
                                          ("memory_used_mib", "memory_used", MAX_MIB, "MiB, 0 or more"),
                                          ("memory_total_mib", "memory_total", MAX_MIB, "MiB, 0 or more")):
            value = raw.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 <= value <= high):
                errors[f"{at}.{key}"] = [f"A number ({meaning}), or null where the GPU cannot say."]
                value = None
            values[field] = None if value is None else float(value)
        outside = raw.get("outside", [])
        processes = []
        if not isinstance(outside, list) or len(outside) > MAX_OUTSIDE_PROCESSES:
            errors[f"{at}.outside"] = [f"A list of at most {MAX_OUTSIDE_PROCESSES} processes {{pid, user}}."]
            outside = []
        for index, process in enumerate(outside):
            where = f"{at}.outside[{index}]"
            if not isinstance(process, dict):
                errors[where] = ["An object {pid, user}."]
                continue
            pid = as_int(process.get("pid"), low=1, high=MAX_PID)
            if pid is None or not isinstance(process.get("pid"), int):
                errors[f"{where}.pid"] = [f"A process id, a whole number from 1 to {MAX_PID}."]
            user = process.get("user")
            if not isinstance(user, str) or not 0 < len(user) <= MAX_PROCESS_USER or text_problem(user) \
                    or not user.isprintable():
                errors[f"{where}.user"] = [f"The process's user: printable text of 1 to {MAX_PROCESS_USER} "
                                           "characters."]
            processes.append({"pid": pid, "user": user})
        cleaned.append({"gpu_id": gpu_id, "outside": processes, **values})
    if errors:
        summary = "; ".join(f"{name}: {' '.join(messages)}" for name, messages in list(errors.items())[:5])
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        raise ServiceError(f"Fix these GPU readings: {summary}{more}", "invalid_gpu_readings", fields=errors)
    return cleaned


# Directory reads --------------------------------------------------------------------------------

def request_read(actor: Actor, target: ComputeTarget, worker, path: str) -> DirectoryRead:
    from computers import access

    if actor.user is not None and not access.can_choose_worker(actor.user):
        raise Forbidden(_("Only global administrators can read directories through a worker."),
                        "global_admin_required")
    if not isinstance(path, str) or not path.startswith("/") or len(path) > 1024 or "\0" in path or "\n" in path:
        raise ServiceError(_("Type an absolute path, such as /data/."), "invalid_path",
                           fields={"path": [_("Absolute path.")]})
    if worker is None or not worker.is_online:
        raise ServiceError(_("Choose an online worker in Worker for this connection."), "worker_offline",
                           fields={"worker_id": [_("Not online.")]})
    expire_stale(force=True)
    read = DirectoryRead.objects.create(target=target, connection=target.connection(), path=path,
                                        requested_by=actor.user, requested_worker=worker)
    notify(READS_CHANNEL)
    return read


def claim_read(worker) -> DirectoryRead | None:
    stopped = type(worker).objects.filter(pk=worker.pk).values_list("stopped_at", flat=True).first()
    if worker_services.stopped_meanwhile(worker, stopped):
        return None  # a stopping worker reads nothing new
    with transaction.atomic():
        held = DirectoryRead.objects.filter(status=ReadStatus.CLAIMED, requested_worker=worker).first()
        if held is not None:
            return held
        read = (DirectoryRead.objects.filter(status=ReadStatus.QUEUED, requested_worker=worker)
                .order_by("created_at", "id").select_for_update(skip_locked=True).first())
        if read is None:
            return None
        read.status = ReadStatus.CLAIMED
        read.claimed_at = timezone.now()
        read.lease_id = uuid.uuid4()
        read.save(update_fields=["status", "claimed_at", "lease_id"])
    return read


def complete_read(worker, read_id: int, *, lease_id, entries, error) -> DirectoryRead:
    if error not in (None, "", *[e for e in ReadError.values if e != ReadError.NOT_CLAIMED]):
        raise ServiceError("error must be not_found, permission_denied, connect_failed or not_a_directory.",
                           "invalid", fields={"error": ["Unknown error."]})
    clean_entries = _clean_entries(entries or [])
    with transaction.atomic():
        read = DirectoryRead.objects.select_for_update().filter(pk=read_id, requested_worker=worker).first()
        if read is None:
            raise ServiceError("No read with this id is asked of this worker (reads are kept 10 minutes).",
                               "not_found", status=404)
        if str(read.lease_id) != str(lease_id):
            raise Conflict("This lease is not the read's current lease; drop the read.", "invalid_lease")
        if read.status in (ReadStatus.DONE, ReadStatus.FAILED):
            return read
        read.status = ReadStatus.FAILED if error else ReadStatus.DONE
        read.error = error or ""
        read.entries = [] if error else clean_entries
        read.finished_at = timezone.now()
        read.save(update_fields=["status", "error", "entries", "finished_at"])
    return read


def _clean_entries(entries) -> list[dict]:
    if not isinstance(entries, list) or len(entries) > MAX_READ_ENTRIES:
        raise ServiceError(f"entries must be a list of at most {MAX_READ_ENTRIES} names.", "invalid",
                           fields={"entries": ["Too many or not a list."]})
    clean = []
    for entry in entries:
        name = entry.get("name") if isinstance(entry, dict) else None
        kind = entry.get("kind") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name or "/" in name or "\0" in name or name in (".", "..") \
                or kind not in EntryKind.values or set(entry) - {"name", "kind"}:
            raise ServiceError("Each entry is {name, kind} with kind dir, file, exec or symlink — names only.",
                               "invalid", fields={"entries": ["Invalid entry."]})
        clean.append({"name": name, "kind": kind})
    return sorted(clean, key=lambda e: (e["kind"] != "dir", e["name"]))
