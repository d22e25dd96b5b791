"""State transitions of jobs: creation, claim, heartbeats, logs, metrics, outputs, completion, stop.

Races are settled in the database: the claim takes queued jobs and then their computer with FOR
UPDATE SKIP LOCKED (a claim never waits on another, so none deadlock), counts the computer's running
jobs under that lock, and the unique constraint on (computer, GPU) is the last word on GPU
exclusivity."""
from __future__ import annotations

import datetime
import math
import re
import shlex
import time
import uuid

from django.db import transaction
from django.db.models import Count, Exists, F, OuterRef, Q, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext as _

from computers import access as computer_access
from computers.choices import Runtime
from computers.models import ComputeGroup, ComputeTarget
from jobs import access, cluster, executors, hooks, inputs, lifecycle, outputs
from jobs.choices import (
    HELD_STATUSES,
    MAIN_REPLICA,
    SITE_ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    ClusterMode,
    EndReason,
    JobStatus,
    Stream,
)
from jobs.lifecycle import event as _event
from jobs.models import UNRESPONSIVE_AFTER, GpuReservation, Job, JobReplica, LogChunk, Metric
from mado import access as identity
from mado import services as identity_services
from mado.choices import Role
from mado.errors import Conflict, Forbidden, ServiceError
from mado.longpoll import notify
from mado.services import SYSTEM, Actor, audit
from mado.validation import BIGINT_MAX, INT32_MAX, INT32_MIN, as_int
from workers import services as worker_services
from workers.models import Worker

JOBS_CHANNEL = "mado_jobs"
CLUSTER_CAPABILITY = "cluster_jobs"  # in a worker's hello: it runs every replica of a cluster job
CLAIM_BATCH = 32
CONTAINER_RUNTIMES = (Runtime.DOCKER, Runtime.APPTAINER, Runtime.SINGULARITY)
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
RESERVED_ENV_PREFIXES = ("MMT_", "MLFLOW_", "CUDA_", "NVIDIA_")
MAX_WALLTIME = 30 * 24 * 3600
MAX_SITE_GPUS = 64  # gpu_count of a site job: what one scheduler node could hold
MAX_LOG_CHUNK = 1024 * 1024
MAX_METRICS_PER_CALL = 1000
# A claimed job that never started goes back to the queue after this long without a heartbeat.
REQUEUE_AFTER = UNRESPONSIVE_AFTER


class ActiveJobsEnded(Exception):
    """A waiting claim's wake-up: jobs that this worker listed as active have ended, so it may claim
    more now. The claim view answers it as 200 with no item and this reason, not as a conflict."""

    reason = "active_jobs_ended"

    def __init__(self, job_ids: list[int]):
        super().__init__(_("Jobs %(jobs)s have ended; claim again with the jobs you still run.")
                         % {"jobs": ", ".join(map(str, job_ids))})
        self.job_ids = job_ids


# Creation ---------------------------------------------------------------------------------------

def create_job(actor: Actor, project, data: dict) -> Job:
    user = actor.user
    if not identity.has_role(user, project, Role.MEMBER):
        raise Forbidden(_("Creating Jobs needs the member role in this project."), "role_required")
    with transaction.atomic():
        values, errors = _clean_job(user, project, data)  # locks the computer row until the job is in
        if errors:
            raise _invalid(errors)
        job_inputs = values.pop("input_datasets")
        job = Job.objects.create(project=project, created_by=user, **values)
        inputs.attach(job, job_inputs)  # datasets' versions (jobs.inputs)
        _event(job, "created", f"Created by {user.username}")
        audit(actor, "job.create", job, project=project,
              after={"computer": job.target.name, "runtime": job.runtime, "gpu_ids": job.gpu_ids,
                     **_cluster_audit(job)})
        hooks.run_after_create(actor, job, data)  # e.g. notify_me (jobs.hooks); refusing rolls the Job back
    notify(JOBS_CHANNEL, topic=str(project.pk))  # only this project's workers may claim it
    executor = executors.executor_for(job.target.kind)
    if executor is not None:
        executor.created(job)
    return job


def _clean_job(user, project, data: dict) -> tuple[dict, dict]:
    errors: dict[str, list[str]] = {}
    values: dict = {}
    on_site = _names_a_site(data)
    values.update(cluster.clean_fields(data, errors, on_site=on_site))
    runtime = data.get("runtime") or Runtime.PYTHON
    if values["cluster_size"] > 1 and values["cluster_mode"] == ClusterMode.MULTI_NODE and not on_site:
        target = cluster.placeholder_target(user, data, runtime, errors) if not errors else None
        if target is None:
            raise _invalid(errors)
        values["compute_group"] = cluster.find_group(data.get("compute_group"))
    else:
        target = _chosen_computer(user, data)
    executor = executors.executor_for(target.kind)
    if executor is not None:
        executor.validate(user, target, values, errors)
    values["target"] = target
    if runtime not in target.runtimes:
        errors["runtime"] = [
            _("%(computer)s supports %(runtimes)s; choose one of those.")
            % {"computer": target.name, "runtimes": ", ".join(target.runtimes)} if target.runtimes else
            _("%(computer)s supports no runtime yet; choose one of those.") % {"computer": target.name}]
    values["runtime"] = runtime
    if values["cluster_size"] > 1 and target.kind != "site" and not errors.keys() & {"cluster_size",
                                                                                     "gpus_per_replica"}:
        # Refused now rather than queued for ever: the reason its page would give (cluster.queued_reason).
        group = values.get("compute_group")
        members = cluster.group_members(group, user, runtime) if group is not None else [target]
        why = cluster.refusal(values["cluster_size"], values["gpus_per_replica"], members, group=group,
                              target=target)
        if why:
            errors["cluster_size"] = [why]
    image = str(data.get("image") or "").strip()
    if runtime in CONTAINER_RUNTIMES and not image:
        errors["image"] = [_("A %(runtime)s Job needs an image.") % {"runtime": runtime}]
    values["image"] = image
    command = data.get("command")
    if isinstance(command, str):
        try:
            command = shlex.split(command)
        except ValueError:
            command = None
    if not isinstance(command, list) or not command or not all(isinstance(a, str) and "\0" not in a for a in command):
        errors["command"] = [_("Give the command as a list of arguments, such as [\"python\", \"train.py\"].")]
    values["command"] = command or []
    # A cluster job's GPUs are picked per replica at claim time (cluster.clean_fields refused gpu_ids).
    # A site's scheduler picks the GPUs itself: a site job asks how many (gpu_count), never which.
    on_site = target.kind == "site"
    values["gpu_ids"] = (_clean_gpu_ids(data, target, errors)
                         if values["cluster_size"] == 1 and not on_site else [])
    if on_site and values["cluster_size"] == 1 and data.get("gpu_ids"):
        errors["gpu_ids"] = [_("%(computer)s is a site: its scheduler picks the GPUs. Give how many with "
                               "gpu_count instead of gpu_ids.") % {"computer": target.name}]
    values["gpu_count"] = _clean_gpu_count(data, target, values["cluster_size"], errors)
    parameters = data.get("parameters") or {}
    if not isinstance(parameters, dict):
        errors["parameters"] = [_("Parameters are a JSON object.")]
    values["parameters"] = parameters if isinstance(parameters, dict) else {}
    env = data.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and ENV_NAME.match(k) and isinstance(v, str)
                                            for k, v in env.items()):
        errors["env"] = [_("env maps variable names (letters, digits, _) to strings.")]
        env = {}
    reserved = [k for k in env if k.startswith(RESERVED_ENV_PREFIXES)]
    if reserved:
        errors["env"] = [_("%(names)s are set by Mado; choose other names.") % {"names": ", ".join(sorted(reserved))}]
    values["env"] = env
    walltime = data.get("walltime_seconds")
    values["walltime_seconds"] = as_int(walltime, low=1, high=MAX_WALLTIME)
    if walltime not in (None, "") and values["walltime_seconds"] is None:
        errors["walltime_seconds"] = [_("The walltime is between 1 second and 30 days.")]
    requirements = str(data.get("requirements") or "")
    if len(requirements) > 64 * 1024:
        errors["requirements"] = [_("Keep requirements under 64 KiB.")]
    bad_lines = [line for line in requirements.splitlines() if line.strip().startswith("-")]
    if bad_lines:
        errors["requirements"] = [_("pip options in requirements are not allowed (lines starting with '-').")]
    values["requirements"] = requirements
    try:
        values["source"] = outputs.clean_source(project, data.get("source"))
    except ServiceError as error:
        errors.update(error.fields)
    values["name"] = str(data.get("name") or "")[:200]
    values["input_datasets"] = inputs.clean(user, project, data.get("input_datasets"), errors)
    target = values.get("target")
    if values["input_datasets"] and target is not None and target.kind == "site":
        # The site runner does not fetch datasets yet: refuse rather than run without them.
        errors["input_datasets"] = [_("%(computer)s is a site: input datasets reach SSH and Local computers only "
                                      "for now. Copy the data to the site's working directory instead.")
                                    % {"computer": target.name}]
    return values, errors


def _clean_gpu_ids(data: dict, target: ComputeTarget, errors: dict) -> list[str]:
    gpu_ids = data.get("gpu_ids") or []
    if not isinstance(gpu_ids, list) or not all(isinstance(g, (str, int)) for g in gpu_ids):
        errors["gpu_ids"] = [_("GPU IDs are a list such as [\"0\", \"1\"].")]
        gpu_ids = []
    gpu_ids = [str(g) for g in gpu_ids]
    unknown = [g for g in gpu_ids if g not in target.gpu_ids]
    if unknown:
        values = {"computer": target.name, "unknown": ", ".join(unknown), "gpus": ", ".join(target.gpu_ids)}
        errors["gpu_ids"] = [_("%(computer)s has no GPU %(unknown)s; it has %(gpus)s.") % values if target.gpu_ids
                             else _("%(computer)s has no GPU %(unknown)s; it has no GPUs.") % values]
    if len(set(gpu_ids)) != len(gpu_ids):
        errors["gpu_ids"] = [_("Each GPU ID once.")]
    return gpu_ids


def _clean_gpu_count(data: dict, target: ComputeTarget, cluster_size: int, errors: dict) -> int | None:
    """How many GPUs a site job asks its scheduler for; None off sites and for cluster jobs, whose
    count is gpus_per_replica (sites.services.shell_values hands that to the job shell instead)."""
    raw = data.get("gpu_count")
    if raw in (None, ""):
        return 0 if target.kind == "site" and cluster_size == 1 else None
    if cluster_size > 1:
        errors["gpu_count"] = [_("A cluster job asks its GPUs per replica: give gpus_per_replica instead of "
                                 "gpu_count.")]
        return None
    if target.kind != "site":
        errors["gpu_count"] = [_("%(computer)s is not a site: choose which of its GPUs to reserve with gpu_ids "
                                 "instead of gpu_count.") % {"computer": target.name}]
        return None
    count = as_int(raw, low=0, high=MAX_SITE_GPUS)
    if count is None:
        errors["gpu_count"] = [_("gpu_count is a whole number of GPUs from 0 to %(max)d, such as 2.")
                               % {"max": MAX_SITE_GPUS}]
    return count or 0


def _names_a_site(data: dict) -> bool:
    """Whether the request names a site computer (its scheduler places cluster replicas itself)."""
    computer_id = as_int(data.get("computer"), low=1, high=BIGINT_MAX)
    return computer_id is not None and ComputeTarget.objects.filter(pk=computer_id, kind="site").exists()


def _chosen_computer(user, data: dict) -> ComputeTarget:
    computer_id = as_int(data.get("computer"), low=1, high=BIGINT_MAX)
    if computer_id is None:
        raise ServiceError(_("Choose the computer to run on (its ID)."), "invalid_job",
                           fields={"computer": [_("Required: the computer's ID.")]})
    # FOR SHARE: an edit of the computer's GPUs or runtimes waits until this job is in, and then sees it.
    target = ComputeTarget.objects.select_for_update(no_key=True).filter(pk=computer_id).first()
    if target is None or not computer_access.can_use(user, target):
        # Same answer for "missing" and "not yours": private computers' names stay private.
        raise ServiceError(_("This computer is not available to you: choose a Public computer, or one you own."),
                           "target_not_available", fields={"computer": [_("Not available.")]})
    if not target.enabled:
        raise ServiceError(_("The computer %(computer)s is disabled; choose another or ask its owner to enable it.")
                           % {"computer": target.name}, "computer_disabled", fields={"computer": [_("Disabled.")]})
    return target


# Claim ------------------------------------------------------------------------------------------

def claim_job(worker: Worker, active_job_ids: list[int]) -> tuple[Job, str | None] | None:
    """One transaction: recover an unacknowledged claim, or take the oldest queued job this worker
    may run whose computers have free slots and free GPUs — for a cluster job, room for every replica
    at once (jobs.cluster). Returns (job, job token plaintext). Raises ActiveJobsEnded as a wake-up
    when jobs in `active_job_ids` have ended meanwhile. `worker` may be a request's worker not read yet
    (workers.services.unread): the claim reads it under its lock."""
    requeue_unstarted()
    with transaction.atomic():
        if not _lock_worker(worker):
            return None  # it said goodbye: hand it nothing
        tried: list[int] = []
        for _round in range(CLAIM_BATCH):
            job = _pick(worker, active_job_ids, tried)
            if job is None or job.held_lost or job.held_listed < len(set(active_job_ids)):
                # What the worker said it runs differs from what it holds (read with the pick, under the
                # worker's lock), or nothing is left to take: recover or wake up first.
                return _recover_unacknowledged(worker, active_job_ids)
            tried.append(job.pk)
            claimed = _claim_cluster(worker, job) if job.is_cluster else _claim_on_its_computer(worker, job)
            if claimed is not None:
                return claimed
    return None


def _lock_worker(worker: Worker) -> bool:
    """Serialise duplicate requests of one worker: a replayed claim sees the first one's result. False
    when it said goodbye before its request came; WorkerStopped when it did so meanwhile."""
    if worker.pk is None:
        worker_services.read_locked(worker)  # the request's first claim: it was read before as it is now
        return not worker_services.stopped_meanwhile(worker, worker.stopped_at)
    stopped = Worker.objects.select_for_update().filter(pk=worker.pk).values_list("stopped_at", flat=True)
    return bool(stopped) and not worker_services.stopped_meanwhile(worker, stopped[0])


def _pick(worker: Worker, active_job_ids: list[int], tried: list[int]) -> Job | None:
    """The oldest claimable job not `tried` that may fit now (cluster.fits_now, a hint), locked with its
    computer FOR UPDATE SKIP LOCKED: a job or computer another claim is busy with is passed over, not
    waited for, so claims on different computers run side by side and never wait on each other in a
    cycle. Along with it in the same statement: what the token, the audit row and the answer need (its
    project, creator and computer; the rows the claim payload reads, jobs.hooks.claim_reads, such as
    tracking's Run; whether it has inputs) and how the worker's held jobs compare with `active_job_ids` (held_lost, held_listed). A
    multi-node job reads its compute group when it is placed: each join costs the planner on every claim."""
    held = Job.objects.filter(worker=worker, status__in=HELD_STATUSES).order_by()
    listed = held.filter(pk__in=active_job_ids).values("worker").annotate(n=Count("pk")).values("n")
    return (_claimable(worker).filter(Q(cluster_size__gt=1) | cluster.fits_now()).exclude(pk__in=tried)
            .select_for_update(skip_locked=True, of=("self", "target"))
            .select_related("created_by", "project", "target", *hooks.claim_reads())
            .annotate(held_lost=Exists(held.filter(status=JobStatus.CLAIMED).exclude(pk__in=active_job_ids)),
                      held_listed=Coalesce(Subquery(listed), 0) if active_job_ids else Value(0),
                      has_inputs=inputs.any_of_job(OuterRef("pk")))
            .first())


def _claim_on_its_computer(worker: Worker, job: Job) -> tuple[Job, str] | None:
    """A job of one replica on its computer, locked by _pick as it is now (enabled, runtimes, GPUs). Its
    slots and free GPUs are read by the claim's write itself, which starts after that lock: no other claim
    can take them meanwhile. The unique constraint on (computer, GPU) stays the last word: a violation
    would abort the whole claim, never hand a GPU out twice."""
    target = job.target
    if not target.enabled or job.runtime not in target.runtimes or not set(job.gpu_ids) <= set(target.gpu_ids):
        return None
    reservations = [GpuReservation(target=target, gpu_id=gpu, job=job) for gpu in job.gpu_ids]
    return _mark_claimed(worker, job, when=cluster.fits_on_locked(job), along=reservations)


def _claim_cluster(worker: Worker, job: Job) -> tuple[Job, str] | None:
    # SKIP LOCKED on every candidate computer too (cluster.Rooms); its own is locked already.
    if cluster.try_claim(job, cluster.Rooms(), _served_ids(worker), worker.target_ids):
        return _mark_claimed(worker, job)
    return None


# Past this many projects with queued jobs, one wake-up for every waiting claim is cheaper than one each.
WAKE_PROJECTS_AT_MOST = 50


def wake_claims(*project_ids: int) -> None:
    """Room was freed (a job ended, went back to the queue, a worker left): wake the claims that may use
    it — those of `project_ids` (a worker waiting with the ended job learns it at once) and of every
    project with queued jobs — not every worker of the server (mado.longpoll topics)."""
    queued = set(Job.objects.filter(status=JobStatus.QUEUED).order_by().values_list("project_id", flat=True)
                 .distinct()[:WAKE_PROJECTS_AT_MOST + 1])
    if len(queued) > WAKE_PROJECTS_AT_MOST:
        notify(JOBS_CHANNEL)
        return
    for project_id in sorted(queued | set(project_ids)):
        notify(JOBS_CHANNEL, topic=str(project_id))


def _served_ids(worker: Worker) -> set[int]:
    return set(computer_access.served_by_worker(worker.account).values_list("pk", flat=True))


def _claimable(worker: Worker):
    """The seeds' rule (001 "Prepare a token", 002 "Permissions"): the worker's token decides which
    jobs — its project's; the computers' visibility decides where they may run — a Public computer
    runs every project's jobs, a Private one those of its owner and of the service accounts the owner
    created, for the job's creator and for the worker's service account alike; `target_ids` narrows."""
    served = computer_access.served_by_worker(worker.account)
    if worker.target_ids:
        served = served.filter(pk__in=worker.target_ids)
    spread = Q(cluster_size__gt=1, cluster_mode=ClusterMode.MULTI_NODE)
    on_its_computer = ~spread & Q(target__enabled=True, target__in=served.values("pk")) & (
        # The creator may still use the computer: its visibility may have changed since the Job was created.
        Q(target__visibility="public") | Q(target__owner=F("created_by"))
        | Q(created_by__service_account__created_by=F("target__owner"))
    )
    # A multi-node job's computers are chosen at claim time among its group's (cluster.candidate_ids
    # checks the creator's right to each).
    in_its_group = spread & Q(compute_group__in=ComputeGroup.objects.filter(
        computers__in=served.values("pk")).values("pk"))
    queued = Job.objects.filter(status=JobStatus.QUEUED, project_id=worker.project_id).exclude(
        released_by=worker, released_at__gt=timezone.now() - RELEASE_BACKOFF)  # it gave them back (release)
    if CLUSTER_CAPABILITY not in (worker.capabilities or []):
        # A worker that cannot start replicas would run main1 alone: cluster jobs wait for one that can.
        queued = queued.filter(cluster_size=1)
    return queued.filter(on_its_computer | in_its_group).order_by("created_at", "id")


def _mark_claimed(worker: Worker, job: Job, *, when=Q(), along=()) -> tuple[Job, str] | None:
    """The claim's writes, in one statement on PostgreSQL (lifecycle.move_if): the move to claimed if
    `when` still holds, with `along`, the job token, the "claimed" event, the audit row and the worker's
    count. None when `when` no longer holds; nothing is written then."""
    now = timezone.now()
    lease_id = uuid.uuid4()
    token, plaintext = identity_services.job_token_row(job_id=job.pk, lease_id=lease_id, project=job.project,
                                                       user=job.created_by)
    rows = [*along, token, lifecycle.event_row(job, "claimed", f"Claimed by worker {worker.worker_id}"),
            identity_services.audit_row(Actor(worker.account), "job.claim", job, project=job.project,
                                        after={"worker": worker.worker_id, "lease_id": str(lease_id)})]
    # The worker's count with this job: in the one statement the other rows still read it as queued.
    counted = (Worker.objects.filter(pk=worker.pk), {"active_jobs": _held_count(but=job.pk) + 1})
    if not lifecycle.move_if(job, JobStatus.CLAIMED, when, at=now, along=rows, also=[counted], worker=worker,
                             lease_id=lease_id, heartbeat_at=now):
        return None
    return job, plaintext


def _recover_unacknowledged(worker: Worker, active_job_ids: list[int]):
    held = dict(Job.objects.filter(worker=worker, status__in=HELD_STATUSES).values_list("pk", "status"))
    foreign = sorted(set(active_job_ids) - held.keys())
    if foreign:
        ended = set(Job.objects.filter(pk__in=foreign, worker=worker, status__in=TERMINAL_STATUSES)
                    .values_list("pk", flat=True))
        unknown = [pk for pk in foreign if pk not in ended]
        if unknown:
            raise Conflict(_("Jobs %(jobs)s are not held by this worker; stop reporting them.")
                           % {"jobs": ", ".join(map(str, unknown))}, "unknown_active_jobs")
        raise ActiveJobsEnded(sorted(ended))
    # The held jobs above answer this in the common case (none lost) without a query of its own.
    if not any(status == JobStatus.CLAIMED and pk not in active_job_ids for pk, status in held.items()):
        return None
    lost = (Job.objects.filter(worker=worker, status=JobStatus.CLAIMED).exclude(pk__in=active_job_ids)
            .select_related("project", "created_by").first())
    # The answer to the first claim was lost, so the worker never saw the token: end it and give a
    # new one under the same lease. Nothing was started, so nothing uses the first one.
    identity_services.revoke_job_tokens(lost.pk)
    _record, plaintext = identity_services.issue_job_token(job_id=lost.pk, lease_id=lost.lease_id,
                                                           project=lost.project, user=lost.created_by)
    return lost, plaintext


def resume(worker: Worker, active_job_ids: list[int]) -> list[tuple[Job, str | None]]:
    """The worker's claimed/running jobs with their leases; a token only for those it does not know."""
    with transaction.atomic():
        Worker.objects.select_for_update().filter(pk=worker.pk).first()
        result = []
        for job in Job.objects.filter(worker=worker, status__in=HELD_STATUSES).select_related("target", "project"):
            token = None
            if job.pk not in active_job_ids:
                _record, token = identity_services.issue_job_token(job_id=job.pk, lease_id=job.lease_id,
                                                                   project=job.project, user=job.created_by)
            result.append((job, token))
    return result


def _count_active(worker: Worker | None) -> None:
    if worker is None:
        return
    # One statement, counted when it runs.
    Worker.objects.filter(pk=worker.pk).update(active_jobs=_held_count())


def _held_count(but: int | None = None):
    """The held jobs of the worker row the expression is evaluated on, but job `but`."""
    held = Job.objects.filter(worker=OuterRef("pk"), status__in=HELD_STATUSES)
    if but is not None:
        held = held.exclude(pk=but)
    return Coalesce(Subquery(held.order_by().values("worker").annotate(n=Count("pk")).values("n")), 0)


_last_requeue = 0.0


def requeue_unstarted(*, force: bool = False) -> list[int]:
    """Jobs claimed by a worker that never started them and whose lease has had no heartbeat for 60 s
    go back to the queue: a worker killed with its long-poll open, or gone before it started the job.
    Reservations, replicas and the job token go in the same transaction. A job that started (running)
    is never requeued, so nothing runs twice: a worker confirms the lease with a `running` heartbeat
    before it starts the process (worker_agent.job_runner). At most once a second per process unless forced."""
    global _last_requeue
    if not force and time.monotonic() - _last_requeue < 1.0:
        return []
    _last_requeue = time.monotonic()
    cutoff = timezone.now() - REQUEUE_AFTER
    stale = Q(status=JobStatus.CLAIMED, heartbeat_at__lt=cutoff, target__kind__in=["ssh", "local"])
    requeued = []
    for pk in Job.objects.filter(stale).values_list("pk", flat=True)[:100]:
        with transaction.atomic():
            # SKIP LOCKED: a heartbeat or completion holding the row wins; the next round looks again.
            job = (Job.objects.select_for_update(skip_locked=True, of=("self",)).select_related("worker")
                   .filter(stale, pk=pk).first())
            if job is None:
                continue
            worker = job.worker
            _requeue(job, f"worker {worker.worker_id if worker else '?'} claimed it but never started it, and sent "
                          f"no heartbeat for {int(REQUEUE_AFTER.total_seconds())} s", "claimed_never_started")
            _count_active(worker)
        requeued.append(pk)
    if requeued:
        wake_claims()
    return requeued


def report_unresponsive() -> list[int]:
    """The periodic runner's Not responding rule: a claimed or running job without a heartbeat for
    UNRESPONSIVE_AFTER is announced once (audit `job.not_responding`, which notifications follow), and
    again only if it sent a heartbeat since and went quiet again. Nothing else changes: its GPUs stay
    reserved (is_unresponsive, mark as lost). Returns the ids announced."""
    now = timezone.now()
    quiet = (Q(status__in=HELD_STATUSES, heartbeat_at__lt=now - UNRESPONSIVE_AFTER)
             & (Q(unresponsive_reported_at__isnull=True) | Q(unresponsive_reported_at__lt=F("heartbeat_at"))))
    announced = []
    for job in Job.objects.filter(quiet).select_related("project", "worker")[:500]:
        with transaction.atomic():
            # Conditional: a second runner, or a heartbeat landing meanwhile, makes this match nothing.
            if not Job.objects.filter(quiet, pk=job.pk).update(unresponsive_reported_at=now):
                continue
            audit(SYSTEM, "job.not_responding", job, project=job.project, after={
                "status": job.status, "heartbeat_at": job.heartbeat_at.isoformat(),
                "worker": job.worker.worker_id if job.worker else None})
        announced.append(job.pk)
    return announced


def _requeue(job: Job, why: str, reason: str, *, actor: Actor = SYSTEM, **fields) -> None:
    """Back to the queue, on a locked CLAIMED job: its reservations, replicas and token go with it.
    `fields`: more columns that change with the move (release: who gave it back)."""
    worker = job.worker
    lifecycle.move(job, JobStatus.QUEUED, worker=None, lease_id=None, claimed_at=None, heartbeat_at=None, **fields)
    GpuReservation.objects.filter(job=job).delete()
    JobReplica.objects.filter(job=job).delete()
    identity_services.revoke_job_tokens(job.pk)
    _event(job, "requeued", f"Back in the queue: {why}")
    audit(actor, "job.requeue", job, project=job.project,
          after={"worker": worker.worker_id if worker else None, "reason": reason,
                 **({"message": why} if actor is not SYSTEM else {})})


MAX_RELEASE_REASON = 450
# A worker that gave a job back does not get it again for this long (another worker may take it at once):
# it waited the computer's gpu_busy_wait_seconds already, and claiming it again at once would only wait the same again.
RELEASE_BACKOFF = datetime.timedelta(minutes=5)


def release(worker: Worker, job_id: int, lease_id, reason) -> Job:
    """worker/jobs/{id}/release: the worker gives back a job it claimed and never started (its GPUs stayed
    in use by a process outside Mado for the computer's gpu_busy_wait_seconds, seed 002). In one transaction the job
    goes back to the queue with its reservations, replicas and token gone, and a timeline line with the
    reason; this worker is not handed it again for RELEASE_BACKOFF. A job whose stop was requested ends
    canceled instead (nothing ran). A started job cannot be given back: it completes."""
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_RELEASE_REASON:
        raise ServiceError(_("reason says why the job is given back, as text of 1 to %(n)s characters.")
                           % {"n": MAX_RELEASE_REASON}, "invalid", fields={"reason": [_("Text.")]})
    reason = _printable(reason.strip())
    with transaction.atomic():
        job = leased(worker, job_id, lease_id)
        if job.is_terminal:
            raise Conflict(_ended(job), "job_ended")
        if job.status != JobStatus.CLAIMED:
            raise Conflict(_("This job has started, so it cannot go back to the queue; complete it instead."),
                           "job_started")
        actor = Actor(worker.account)
        if job.stop_requested_at is not None:
            _finish(job, JobStatus.CANCELED, EndReason.CANCELED)
            audit(actor, "job.complete", job, project=job.project,
                  after={"status": JobStatus.CANCELED, "end_reason": EndReason.CANCELED, "exit_code": None})
        else:
            _requeue(job, f"worker {worker.worker_id} gave it back: {reason}", "released", actor=actor,
                     released_by=worker, released_at=timezone.now())
        _count_active(worker)
    wake_claims(job.project_id)
    return job


def worker_stopping(worker: Worker) -> list[int]:
    """worker/goodbye: a worker that drains before it exits. From now on it takes nothing (until its
    next hello), and the jobs it claimed but never started go back to the queue at once, so another
    worker runs them. Its running jobs stay its own: they run on and are re-attached on its next start.
    Serialised with its claims by the worker's row lock: a claim either handed a job out before (then
    it is released here) or sees the worker stopped."""
    with transaction.atomic():
        Worker.objects.select_for_update().filter(pk=worker.pk).update(stopped_at=timezone.now())
        released = []
        for job in (Job.objects.select_for_update(of=("self",)).select_related("worker", "project")
                    .filter(worker=worker, status=JobStatus.CLAIMED)):
            _requeue(job, f"worker {worker.worker_id} stopped before it started it", "worker_stopped")
            released.append(job.pk)
        _count_active(worker)
    if released:
        wake_claims(worker.project_id)
    return released


def mark_lost(actor: Actor, job: Job) -> Job:
    """A Project admin's decision that a Not responding job's worker is gone for good: the job ends
    failed with worker_lost and its GPUs are released. Never automatic (seed 002: GPUs are not
    released by themselves); its process may still be running on the computer."""
    if not access.can_mark_lost(actor.user, job):
        raise Forbidden(_("Only Project admins can mark a Job as lost."), "project_admin_required")
    with transaction.atomic():
        job = Job.objects.select_for_update(of=("self",)).select_related("worker", "project").get(pk=job.pk)
        if job.is_terminal:
            raise Conflict(_ended(job), "job_ended")
        if not job.is_unresponsive:
            raise Conflict(_("Only a Job that shows No response (no heartbeat for 60 s while claimed or running) can "
                             "be marked as lost; this one is not."), "job_responding")
        worker = job.worker
        _finish(job, JobStatus.FAILED, EndReason.WORKER_LOST,
                error=f"Marked as lost by {actor.user.username}: its worker stopped responding "
                      "(its process may still be running on the computer)")
        audit(actor, "job.mark_lost", job, project=job.project,
              after={"status": JobStatus.FAILED, "end_reason": EndReason.WORKER_LOST,
                     "worker": worker.worker_id if worker else None})
        _count_active(worker)
    wake_claims(job.project_id)
    return job


# Leased calls -----------------------------------------------------------------------------------

def leased(worker: Worker, job_id: int, lease_id) -> Job:
    # Lock only the job row: locking its project or computer too would deadlock with concurrent claims.
    job = Job.objects.select_for_update(of=("self",)).select_related("project", "target").filter(pk=job_id).first()
    if job is None:
        raise ServiceError(_("No such job."), "not_found", status=404)
    if job.worker_id != worker.pk or str(job.lease_id) != str(lease_id):
        raise Conflict(_("This lease is not the job's current lease; stop touching this job."), "invalid_lease")
    return job


MAX_WAITING_REASON = 450


def heartbeat(worker: Worker, job_id: int, *, lease_id, status: str | None = None, waiting: str | None = None) -> Job:
    """`waiting`: why the worker holds a claimed job back (its GPUs busy outside Mado, seed 002): a
    timeline line each time the reason changes."""
    if waiting is not None and (not isinstance(waiting, str) or len(waiting) > MAX_WAITING_REASON):
        raise ServiceError(_("waiting is the reason a claimed job waits, as text of at most %(n)s characters.")
                           % {"n": MAX_WAITING_REASON}, "invalid", fields={"waiting": [_("Text.")]})
    with transaction.atomic():
        job = leased(worker, job_id, lease_id)
        if job.is_terminal:
            raise Conflict(_ended(job), "job_ended")
        if status not in (None, JobStatus.RUNNING):
            raise ServiceError(_("status in a heartbeat is only 'running'."), "invalid", fields={"status": ["running"]})
        lifecycle.heartbeat(job, timezone.now(), running=status == JobStatus.RUNNING)
        if waiting and waiting.strip() and job.status == JobStatus.CLAIMED:
            message = f"Waiting for its GPUs: {_printable(waiting.strip())}"
            last = job.events.filter(kind="waiting").order_by("-id").values_list("message", flat=True).first()
            if last != message:
                lifecycle.event(job, "waiting", message)
    return job


def append_logs(job: Job, chunks, *, streams=(Stream.STDOUT, Stream.STDERR)) -> int:
    """Store ordered chunks; a chunk resent with the same replica, stream and offset is ignored. The
    worker writes stdout/stderr; the job's own code (job token) writes its own `app` stream, so the
    two never collide on an offset. `replica` (default main1) names a cluster job's replica."""
    if not isinstance(chunks, list):
        raise ServiceError(_("chunks is a list of {stream, offset, data}."), "invalid", fields={"chunks": [_("List.")]})
    names = job.replica_names
    rows = {}
    for chunk in chunks:
        offset = as_int(chunk.get("offset"), low=0, high=BIGINT_MAX) if isinstance(chunk, dict) else None
        if (offset is None or chunk.get("stream") not in streams or not isinstance(chunk.get("data"), str)
                or len(chunk["data"].encode()) > MAX_LOG_CHUNK):
            raise ServiceError(_("Each chunk is {stream: %(streams)s, offset: byte offset ≥ 0, data: text ≤ 1 MiB, "
                                 "replica?}.") % {"streams": "|".join(streams)}, "invalid",
                               fields={"chunks": [_("Invalid chunk.")]})
        replica = _log_replica(job, chunk.get("replica"), names)
        rows[(replica, chunk["stream"], offset)] = LogChunk(job=job, replica=replica, stream=chunk["stream"],
                                                            offset=offset, data=chunk["data"])
    return LogChunk.store_new(list(rows.values()))


def _log_replica(job: Job, replica, names=None) -> str:
    names = names if names is not None else job.replica_names
    replica = replica or MAIN_REPLICA
    if replica not in names:
        raise ServiceError(_("replica is one of this job's replicas: %(replicas)s.") % {"replicas": _some(names)},
                           "invalid", fields={"chunks": [_("Unknown replica.")]})
    return replica


# Log frames (worker/jobs/{id}/log-frames, docs/logs.md): the worker's bytes as they are, each frame an
# ASCII header line `<stream> <offset> <length>\n` and then `length` bytes. No JSON on either side.
MAX_LOG_FRAMES_BODY = 32 * 1024 * 1024  # the worker sends ≤ 16 MiB and a last chunk
MAX_LOG_FRAMES = 1024
LOG_FRAME_HEADER_MAX = 64
_LOG_FRAME_HEADER = re.compile(rb"^(stdout|stderr) (0|[1-9][0-9]{0,18}) (0|[1-9][0-9]{0,8})\n$")


def log_text(data: bytes) -> str:
    """A log's bytes as stored text: invalid UTF-8 becomes U+FFFD, as the worker decoded chunks before
    (LogChunk.text), and so does NUL, which PostgreSQL text cannot hold (a JSON chunk with a NUL is
    refused whole; a framed one keeps every other byte)."""
    text = data.decode("utf-8", "replace")
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


def read_log_frames(readable, length) -> list[tuple[str, int, bytes]]:
    """Parse a log-frames body of `length` bytes (the Content-Length) into (stream, offset, bytes); read
    it all before any lock is taken. Refuses a body that is too large, malformed or cut short."""
    try:
        length = int(length)
    except (TypeError, ValueError):
        raise ServiceError(_("Send the log frames with a Content-Length."), "length_required", status=411) from None
    if length > MAX_LOG_FRAMES_BODY:
        raise ServiceError(_("A log-frames body is at most %(mib)d MiB; send the rest in another one.")
                           % {"mib": MAX_LOG_FRAMES_BODY >> 20}, "too_large", status=413)
    frames = []
    left = length
    while left > 0:
        header = readable.readline(min(left, LOG_FRAME_HEADER_MAX))
        match = _LOG_FRAME_HEADER.match(header)
        if match is None or len(frames) >= MAX_LOG_FRAMES:
            raise ServiceError(_("Each log frame is a line `stdout|stderr <offset> <length>` and then that many "
                                 "bytes; at most %(n)d frames a request.") % {"n": MAX_LOG_FRAMES}, "invalid",
                               fields={"frames": [_("Invalid frame.")]})
        left -= len(header)
        size = int(match[3])
        if size > left:
            raise ServiceError(_("A log frame is longer than the rest of the body."), "invalid",
                               fields={"frames": [_("Cut short.")]})
        data = readable.read(size)
        if len(data) != size:
            raise ServiceError(_("The body ended inside a log frame."), "invalid", fields={"frames": [_("Cut short.")]})
        left -= size
        offset = int(match[2])
        if offset > BIGINT_MAX - size:
            raise ServiceError(_("A log frame's offset is out of range."), "invalid",
                               fields={"frames": [_("Offset out of range.")]})
        frames.append((match[1].decode(), offset, data))
    return frames


def append_log_frames(job: Job, frames: list[tuple[str, int, bytes]], *, replica=None) -> int:
    """Store frames from read_log_frames as chunks of the worker's stdout/stderr (one row each, in their
    order, one INSERT); a frame resent at the same replica, stream and offset is ignored."""
    replica = _log_replica(job, replica)
    rows = {}
    for stream, offset, data in frames:
        if data:
            rows.setdefault((stream, offset), LogChunk(job=job, replica=replica, stream=stream, offset=offset,
                                                       data=log_text(data)))
    return LogChunk.store_new(list(rows.values()))


def add_metrics(job: Job, metrics) -> int:
    if not isinstance(metrics, list) or len(metrics) > MAX_METRICS_PER_CALL:
        raise ServiceError(_("metrics is a list of at most %(max)d points.") % {"max": MAX_METRICS_PER_CALL},
                           "invalid", fields={"metrics": [_("Invalid list.")]})
    rows = []
    for point in metrics:
        point = point if isinstance(point, dict) else {}
        name, value = point.get("name"), _finite(point.get("value"))
        step = as_int(point.get("step", 0), low=0, high=2**53 - 1)
        when = _timestamp(point.get("timestamp"))
        if not isinstance(name, str) or not name or len(name) > 200 or value is None or step is None or when is None:
            raise ServiceError(_("Each metric is {name, value: a finite number, step: an integer 0 … 2^53-1, "
                                 "timestamp?: an ISO 8601 time}."), "invalid_metric",
                               fields={"metrics": [_("Invalid point.")]})
        rows.append(Metric(job=job, name=name, value=value, step=step, timestamp=when))
    Metric.objects.bulk_create(rows)
    hooks.run_metrics_recorded(job, rows)  # tracking: they are also the Job's Run's metrics
    return len(rows)


def clean_completion(status: str, exit_code=None, end_reason: str | None = None) -> int | None:
    """Validate a completion (a worker's, or a site runner's finish); returns the exit code."""
    if status not in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.CANCELED):
        raise ServiceError(_("status is finished, failed or canceled."), "invalid", fields={"status": [_("Invalid.")]})
    if exit_code is not None:
        exit_code = as_int(exit_code, low=INT32_MIN, high=INT32_MAX)
        if exit_code is None:
            raise ServiceError(_("exit_code is an integer."), "invalid", fields={"exit_code": [_("Integer.")]})
    if status == JobStatus.FINISHED and exit_code not in (None, 0):
        raise ServiceError(_("A job that exited with a non-zero code is failed, not finished."),
                           "inconsistent_completion", fields={"status": [_("failed expected.")]})
    if end_reason is not None and end_reason not in EndReason.values:
        raise ServiceError(_("end_reason is one of %(reasons)s.") % {"reasons": ", ".join(EndReason.values)}, "invalid",
                           fields={"end_reason": [_("Unknown.")]})
    return exit_code


def clean_replica(job: Job, replica, status: str, end_reason: str | None) -> str:
    """The replica whose end ended a cluster job (docs/cluster-jobs.md, "End"); "" when not given."""
    if replica in (None, ""):
        if end_reason == EndReason.REPLICA_FAILED:
            raise ServiceError(_("end_reason replica_failed needs replica: the name of the replica that failed."),
                               "invalid", fields={"replica": [_("Required with replica_failed.")]})
        return ""
    if replica not in job.replica_names:
        raise ServiceError(_("replica is one of this job's replicas: %(replicas)s.")
                           % {"replicas": ", ".join(job.replica_names[:8])}, "invalid",
                           fields={"replica": [_("Unknown replica.")]})
    if end_reason == EndReason.REPLICA_FAILED and status != JobStatus.FAILED:
        raise ServiceError(_("A job that ends because a replica failed is failed."), "inconsistent_completion",
                           fields={"status": [_("failed expected.")]})
    return replica


def finish_completed(job: Job, status: str, *, exit_code=None, error: str = "", end_reason: str | None = None,
                     replica: str = "") -> str:
    """End a locked, running job as its executor reported; returns the end reason."""
    if replica:
        job.end_replica = replica
        if error and replica not in error:
            error = f"{replica}: {error}"
    missing = outputs.missing_artifacts(job) if status == JobStatus.FINISHED else []
    if missing:
        shown = ", ".join(missing[:5]) + (" …" if len(missing) > 5 else "")
        raise Conflict(_("Upload the declared artifacts first: %(paths)s.") % {"paths": shown}, "artifacts_incomplete")
    reason = end_reason or (EndReason.CANCELED if status == JobStatus.CANCELED else EndReason.EXIT_CODE)
    _finish(job, status, reason, exit_code=exit_code, error=error)
    if status == JobStatus.FINISHED:
        outputs.register_declared(job)  # result.json `datasets` and `models` become versions
    return reason


def complete(worker: Worker, job_id: int, *, lease_id, status: str, exit_code=None, error: str = "",
             end_reason: str | None = None, replica: str | None = None) -> Job:
    exit_code = clean_completion(status, exit_code, end_reason)
    with transaction.atomic():
        job = leased(worker, job_id, lease_id)
        if job.is_terminal:
            if job.status == status:
                return job  # the same completion resent
            raise Conflict(_("This job already ended as %(status)s.") % {"status": job.status}, "job_already_completed")
        replica = clean_replica(job, replica, status, end_reason)
        reason = finish_completed(job, status, exit_code=exit_code, error=error, end_reason=end_reason,
                                  replica=replica)
        audit(Actor(worker.account), "job.complete", job, project=job.project,
              after={"status": status, "end_reason": reason, "exit_code": exit_code,
                     **({"replica": replica} if replica else {})})
        _count_active(worker)
    wake_claims(job.project_id)
    return job


def _finish(job: Job, status: str, reason: str, *, exit_code=None, error: str = "") -> None:
    """End the job: its GPUs and its token go in the same transaction."""
    lifecycle.move(job, status, end_reason=reason, exit_code=int(exit_code) if exit_code is not None else None,
                   error=_printable(str(error or ""))[:1000], end_replica=job.end_replica)
    GpuReservation.objects.filter(job=job).delete()
    identity_services.revoke_job_tokens(job.pk)
    hooks.run_after_end(job)  # e.g. tracking ends the Job's Run (jobs.hooks)
    label = {JobStatus.FINISHED: "Finished", JobStatus.FAILED: "Failed", JobStatus.CANCELED: "Canceled"}[status]
    detail = f" (exit code {job.exit_code})" if job.exit_code is not None else ""
    _event(job, status, f"{label}{detail}" + (f": {job.error}" if job.error else ""))


# Stop -------------------------------------------------------------------------------------------

def request_stop(actor: Actor, job: Job) -> Job:
    if not access.can_stop(actor.user, job):
        raise Forbidden(_("Only the Job's creator and Project admins can stop it."), "stop_forbidden")
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job.pk)
        if job.is_terminal:
            raise Conflict(_ended(job), "job_ended")
        if job.stop_requested_at is None:
            job.stop_requested_at = timezone.now()
            job.stop_requested_by = actor.user
            job.save(update_fields=["stop_requested_at", "stop_requested_by"])
            _event(job, "stop_requested", f"Stop requested by {actor.user.username}")
            audit(actor, "job.stop_request", job, project=job.project, after={"status_then": job.status})
        if job.status in (JobStatus.QUEUED, JobStatus.WAITING_MANUAL):
            # Nobody runs it yet: it ends at once.
            _finish(job, JobStatus.CANCELED, EndReason.CANCELED)
            audit(actor, "job.complete", job, project=job.project,
                  after={"status": JobStatus.CANCELED, "end_reason": EndReason.CANCELED, "exit_code": None})
        elif job.status in SITE_ACTIVE_STATUSES and executors.executor_for(job.target.kind) is not None:
            executors.executor_for(job.target.kind).stop(actor, job)
    wake_claims(job.project_id)
    return job


# helpers ----------------------------------------------------------------------------------------

def _cluster_audit(job: Job) -> dict:
    if not job.is_cluster:
        return {}
    return {"cluster_size": job.cluster_size, "cluster_mode": job.cluster_mode,
            "gpus_per_replica": job.gpus_per_replica,
            **({"compute_group": job.compute_group.name} if job.compute_group else {})}


def _ended(job: Job) -> str:
    return _("This job already ended (%(status)s).") % {"status": job.status}


def _some(names: list[str]) -> str:
    """The first eight names, and … when there are more."""
    return ", ".join(names[:8]) + (" …" if len(names) > 8 else "")


def _invalid(errors: dict) -> ServiceError:
    summary = " ".join(m for messages in errors.values() for m in messages)
    return ServiceError(summary, "invalid_job", fields=errors)


def _finite(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _timestamp(value):
    """An ISO 8601 time (now when absent), or None when it is not one."""
    if value is None:
        return timezone.now()
    try:
        parsed = parse_datetime(value) if isinstance(value, str) else None
        if parsed is None:
            return None
        if timezone.is_naive(parsed):
            parsed = timezone.make_aware(parsed, datetime.timezone.utc)
        # In UTC, as stored: 9999-12-31T23:59:59-23:59 lies past year 9999, which no datetime holds.
        return parsed.astimezone(datetime.timezone.utc)
    except (ValueError, OverflowError):
        return None


def _printable(text: str) -> str:
    # Line breaks and tabs stay: a scheduler's or runner's error is read line by line.
    return "".join(ch for ch in text if ch in "\n\t" or ch.isprintable())




