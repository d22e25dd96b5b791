"""Cluster jobs (docs/cluster-jobs.md): their fields at creation, where their replicas go at claim
time, and why a queued one waits.

Placement runs inside the claim transaction on computers locked FOR UPDATE SKIP LOCKED: a computer
that another claim is busy with is simply not available to this one, so claims never wait on each
other and never deadlock, and what a locked computer has free cannot change under us (read after the
lock: by Room.of, or for a job of one replica by the claim's write itself, fits_on_locked). Every replica's
GPU reservations and replica rows are written in one savepoint: all of them, or none."""
from __future__ import annotations

from dataclasses import dataclass, field

from django.db import IntegrityError, connection, transaction
from django.db.models import BooleanField, Count, Exists, F, OuterRef, Q, Subquery
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from computers import access as computer_access
from computers.groups import GROUP_KINDS
from computers.models import ComputeGroup, ComputeTarget
from jobs.choices import HELD_STATUSES, MAX_CLUSTER_SIZE, ClusterMode
from jobs.models import GpuReservation, Job, JobReplica
from mado.validation import BIGINT_MAX, as_int

MAX_GPUS_PER_REPLICA = 64


# Creation ---------------------------------------------------------------------------------------

def given(data: dict, name: str) -> bool:
    return data.get(name) not in (None, "")


def clean_fields(data: dict, errors: dict, *, on_site: bool = False) -> dict:
    """cluster_size, cluster_mode and gpus_per_replica; the computer or group is checked by the caller.
    On a site (`on_site`) the scheduler gives each replica its own node: the mode is multi-node, and the
    site itself is the computer (no compute group)."""
    size = as_int(data["cluster_size"], low=1, high=MAX_CLUSTER_SIZE) if given(data, "cluster_size") else 1
    if size is None:
        errors["cluster_size"] = [_("The cluster size is a whole number from 1 to %(max)d.")
                                  % {"max": MAX_CLUSTER_SIZE}]
        size = 1
    mode = data.get("cluster_mode") or ClusterMode.SINGLE_NODE
    if mode not in ClusterMode.values:
        errors["cluster_mode"] = [_("The cluster mode is single-node or multi-node.")]
        mode = ClusterMode.SINGLE_NODE
    values = {"cluster_size": size, "cluster_mode": mode, "gpus_per_replica": 0}
    per_replica = data.get("gpus_per_replica")
    if size == 1:
        if given(data, "compute_group"):
            errors["compute_group"] = [_("A compute group places cluster jobs (cluster size 2 or more); "
                                         "for one replica choose a computer.")]
        if given(data, "gpus_per_replica") and as_int(per_replica, low=0, high=0) is None:
            errors["gpus_per_replica"] = [_("GPUs per replica are for cluster jobs; for one replica give the "
                                            "GPU IDs to use (gpu_ids).")]
        return values
    if data.get("gpu_ids"):
        errors["gpu_ids"] = [_("A cluster job does not name GPU IDs: give gpus_per_replica and the server picks "
                               "a separate set for each replica.")]
    if given(data, "gpus_per_replica"):
        values["gpus_per_replica"] = as_int(per_replica, low=0, high=MAX_GPUS_PER_REPLICA)
        if values["gpus_per_replica"] is None:
            errors["gpus_per_replica"] = [_("GPUs per replica is a whole number from 0 to %(max)d.")
                                          % {"max": MAX_GPUS_PER_REPLICA}]
            values["gpus_per_replica"] = 0
    if on_site:
        # The scheduler puts each replica on a node of its own, whatever the form's default mode said.
        if given(data, "compute_group"):
            errors["compute_group"] = [_("A site places the replicas itself: leave the compute group out.")]
        values["cluster_mode"] = ClusterMode.MULTI_NODE
        return values
    multi = mode == ClusterMode.MULTI_NODE
    if multi and not given(data, "compute_group"):
        errors["compute_group"] = [_("A multi-node cluster job runs on a compute group: choose one.")]
    if multi and given(data, "computer"):
        errors["computer"] = [_("A multi-node cluster job runs on a compute group, not on one computer: "
                                "leave the computer out.")]
    if not multi and given(data, "compute_group"):
        errors["compute_group"] = [_("A single-node cluster job runs on one computer: choose the computer, "
                                     "or make it multi-node.")]
    return values


def find_group(value) -> ComputeGroup | None:
    """A compute group by id or by name (case-insensitive)."""
    pk = as_int(value, low=1, high=BIGINT_MAX)
    if pk is not None:
        return ComputeGroup.objects.filter(pk=pk).first()
    if isinstance(value, str):
        return ComputeGroup.objects.filter(name__iexact=value.strip()).first()
    return None


def group_members(group: ComputeGroup, user, runtime: str | None = None):
    """The group's computers a multi-node job of this user may run on."""
    members = group.computers.filter(enabled=True, kind__in=GROUP_KINDS).filter(
        pk__in=computer_access.usable_by(user).values("pk"))
    if runtime is not None:
        members = [c for c in members.order_by("name", "pk") if runtime in c.runtimes]
    return members


def placeholder_target(user, data: dict, runtime: str, errors: dict) -> ComputeTarget | None:
    """A multi-node job's computer until it is claimed: a member of its group (locked FOR SHARE like
    a chosen computer, so its runtimes cannot change while the job goes in)."""
    group = find_group(data.get("compute_group"))
    if group is None:
        errors["compute_group"] = [_("No such compute group: give its id or name (Settings → Computers → "
                                     "Compute groups).")]
        return None
    members = group_members(group, user, runtime)
    if not members:
        errors["compute_group"] = [_("No enabled computer of the compute group %(group)s that you may use "
                                     "supports %(runtime)s; choose another group or runtime.")
                                   % {"group": group.name, "runtime": runtime}]
        return None
    return ComputeTarget.objects.select_for_update(no_key=True).filter(pk=members[0].pk).first()


# Claim ------------------------------------------------------------------------------------------

def slots_used(target_id: int) -> int:
    """Concurrent-job slots in use: one per held ordinary job, one per held replica of a cluster job
    (one query: a claim reads it on every computer it looks at)."""
    return ComputeTarget.objects.filter(pk=target_id).values_list(_used(), flat=True).first() or 0


def _used():
    """slots_used of the computer row the expression is evaluated on."""
    ordinary = (Job.objects.filter(target_id=OuterRef("pk"), status__in=HELD_STATUSES, cluster_size__lte=1)
                .order_by().values("target_id").annotate(n=Count("id")).values("n"))
    replicas = (JobReplica.objects.filter(target_id=OuterRef("pk"), job__status__in=HELD_STATUSES)
                .order_by().values("target_id").annotate(n=Count("id")).values("n"))
    return Coalesce(Subquery(ordinary), 0) + Coalesce(Subquery(replicas), 0)


def slots_used_on(target_ids) -> dict[int, int]:
    """slots_used for many computers in two queries (a page of waiting reasons); absent means 0."""
    used: dict[int, int] = {}
    ordinary = (Job.objects.filter(target_id__in=target_ids, status__in=HELD_STATUSES, cluster_size__lte=1)
                .order_by().values_list("target_id").annotate(n=Count("id")))
    replicas = (JobReplica.objects.filter(target_id__in=target_ids, job__status__in=HELD_STATUSES)
                .order_by().values_list("target_id").annotate(n=Count("id")))
    for target_id, n in [*ordinary, *replicas]:
        used[target_id] = used.get(target_id, 0) + n
    return used


# A GPU of the job's own list reserved on its computer (gpu_ids is a JSON list of strings).
_GPU_TAKEN = {
    "postgresql": "EXISTS (SELECT 1 FROM jobs_gpureservation r WHERE r.target_id = jobs_job.target_id "
                  "AND jobs_job.gpu_ids ? r.gpu_id)",
    "sqlite": "EXISTS (SELECT 1 FROM jobs_gpureservation r, json_each(jobs_job.gpu_ids) g "
              "WHERE r.target_id = jobs_job.target_id AND g.value = r.gpu_id)",
}


def fits_now() -> Q:
    """Jobs of one replica whose computer has a free slot and whose GPUs are all free, as the claim's
    query sees them: it passes over the jobs that wait without a query per job. Only a hint, read before
    the computer is locked: the claim checks again on the locked computer (Room). The full computers are
    found once per query among the few that hold jobs, not once per queued job."""
    holding = (Q(pk__in=Job.objects.filter(status__in=HELD_STATUSES).values("target_id"))
               | Q(pk__in=JobReplica.objects.filter(job__status__in=HELD_STATUSES).values("target_id")))
    full = ComputeTarget.objects.filter(holding).alias(used=_used()).filter(used__gte=F("concurrency"))
    taken = RawSQL(_GPU_TAKEN[connection.vendor], (), output_field=BooleanField())
    return Q(cluster_size__lte=1) & ~Q(target__in=full.values("pk")) & ~Q(taken)


def fits_on_locked(job: Job) -> Q:
    """A job of one replica fits on its computer now: a free slot, and none of its GPUs reserved. The
    claim locks the computer first, then filters its own write with this (lifecycle.move_if), so what it
    reads is what the computer has once the lock is held: no other claim can take it meanwhile."""
    free = ComputeTarget.objects.filter(pk=job.target_id).alias(used=_used()).filter(used__lt=F("concurrency"))
    fits = Q(target__in=free.values("pk"))
    if job.gpu_ids:
        fits &= ~Q(Exists(GpuReservation.objects.filter(target_id=job.target_id, gpu_id__in=job.gpu_ids)))
    return fits


@dataclass
class Room:
    """What a computer has free now."""
    target: ComputeTarget
    slots: int
    free_gpus: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, target: ComputeTarget) -> Room:
        reserved = set(GpuReservation.objects.filter(target=target).values_list("gpu_id", flat=True))
        return cls(target, target.concurrency - slots_used(target.pk),
                   [g for g in target.gpu_ids if g not in reserved])

    def holds(self, gpus_per_replica: int) -> int:
        """How many replicas of this size fit now."""
        by_gpus = len(self.free_gpus) // gpus_per_replica if gpus_per_replica else self.slots
        return max(0, min(self.slots, by_gpus))


class Rooms:
    """The computers one claim has looked at, each locked once FOR UPDATE SKIP LOCKED (None: another
    claim holds it, so it is not available to this one)."""

    def __init__(self):
        self._rooms: dict[int, Room | None] = {}

    def get(self, target_id: int) -> Room | None:
        if target_id not in self._rooms:
            target = ComputeTarget.objects.select_for_update(skip_locked=True).filter(pk=target_id).first()
            self._rooms[target_id] = Room.of(target) if target is not None else None
        return self._rooms[target_id]


def candidate_ids(job: Job, served_ids: set[int], worker_target_ids) -> list[int]:
    """The computers a cluster job may use with this worker: single-node its own; multi-node the
    members of its group this worker serves and the creator may use."""
    if not job.is_multi_node:
        return [job.target_id]
    if job.compute_group_id is None:
        return []
    members = group_members(job.compute_group, job.created_by, job.runtime)
    return [c.pk for c in members if c.pk in served_ids and (not worker_target_ids or c.pk in worker_target_ids)]


def place(job: Job, rooms: list[Room]) -> list[tuple[Room, list[str]]] | None:
    """One (room, GPU IDs) per replica in index order, or None when they do not all fit now.
    All on one computer when one can hold them all (the tightest fit, as the peer packs to avoid the
    network); otherwise the computers with most room first."""
    size, per = job.cluster_size, job.gpus_per_replica
    usable = [r for r in rooms if r.target.enabled and job.runtime in r.target.runtimes and r.holds(per) > 0]
    whole = [r for r in usable if r.holds(per) >= size]
    if whole:
        chosen = [(min(whole, key=lambda r: (r.holds(per), r.target.name)), size)]
    elif job.is_multi_node:
        chosen, left = [], size
        for room in sorted(usable, key=lambda r: (-r.holds(per), r.target.name)):
            take = min(left, room.holds(per))
            chosen.append((room, take))
            left -= take
            if not left:
                break
        if left:
            return None
    else:
        return None
    placement = []
    for room, count in chosen:
        for number in range(count):
            placement.append((room, room.free_gpus[number * per:(number + 1) * per]))
    return placement


def reserve(job: Job, placement: list[tuple[Room, list[str]]]) -> bool:
    """Every replica's GPUs and replica row, in one savepoint: all or nothing. The unique constraint
    on (computer, GPU) stays the last word."""
    names = job.replica_names
    try:
        with transaction.atomic():
            GpuReservation.objects.bulk_create(
                [GpuReservation(target=room.target, gpu_id=gpu, job=job) for room, gpus in placement for gpu in gpus])
            JobReplica.objects.bulk_create(
                [JobReplica(job=job, index=index, name=names[index], target=room.target, gpu_ids=gpus)
                 for index, (room, gpus) in enumerate(placement)])
    except IntegrityError:
        return False
    main = placement[0][0].target
    if job.target_id != main.pk:
        job.target = main  # a multi-node job's computer is main1's from now on
        job.save(update_fields=["target"])
    return True


def try_claim(job: Job, rooms: Rooms, served_ids: set[int], worker_target_ids) -> bool:
    found = [rooms.get(pk) for pk in candidate_ids(job, served_ids, worker_target_ids)]
    placement = place(job, [room for room in found if room is not None])
    return placement is not None and reserve(job, placement)


# Why a queued cluster job waits, and why one is refused ------------------------------------------

def _needs(size: int, per: int) -> str:
    return ngettext("Needs %(size)d replicas × %(per)d GPU", "Needs %(size)d replicas × %(per)d GPUs", per) % {
        "size": size, "per": per}


def _where(group: ComputeGroup | None, target: ComputeTarget) -> str:
    return _("the computers of %(group)s") % {"group": group.name} if group is not None else target.name


def most_replicas(members, per: int) -> int:
    """How many replicas of this size the computers could hold if nothing else ran (multi-node adds
    them up; single-node has one computer)."""
    return sum(Room(c, c.concurrency, list(c.gpu_ids)).holds(per) for c in members)


def refusal(size: int, per: int, members, *, group: ComputeGroup | None = None,
            target: ComputeTarget | None = None) -> str | None:
    """Why a new cluster job could never start on these computers (what queued_reason would later
    say), or None when they could hold all its replicas at once. `members`: the one computer of a
    single-node job, or the group's computers its creator may use for its runtime."""
    most = most_replicas(members, per)
    if most >= size:
        return None
    values = {"needs": _needs(size, per), "where": _where(group, target), "most": most}
    if group is not None:
        return _("%(needs)s; %(where)s can hold at most %(most)d (by GPUs and concurrent jobs), so it cannot "
                 "start. Ask for fewer replicas or GPUs, or choose another compute group.") % values
    return _("%(needs)s; %(where)s can hold at most %(most)d (by GPUs and concurrent jobs), so it cannot start. "
             "Ask for fewer replicas or GPUs, or choose another computer.") % values


def queued_reason(job: Job) -> str | None:
    """A sentence for a queued cluster job, like the peer's PENDING; read without locks."""
    if not job.is_cluster or job.status != "queued":
        return None
    if job.target.kind == "site":
        return None  # the site's scheduler places the replicas: there is nothing to count here
    size, per = job.cluster_size, job.gpus_per_replica
    group = None
    if job.is_multi_node:
        group = job.compute_group
        if group is None:
            return _("Its compute group was deleted: stop it and create it again on another group.")
        members = group_members(group, job.created_by, job.runtime)
        if not members:
            return _("No enabled computer of %(group)s that its creator may use supports %(runtime)s.") % {
                "group": group.name, "runtime": job.runtime}
    else:
        if not job.target.enabled:
            return _("%(computer)s is disabled: it starts once its owner enables it again.") % {
                "computer": job.target.name}
        members = [job.target]
    values = {"needs": _needs(size, per), "where": _where(group, job.target), "size": size}
    # Created when they could (creation refuses the rest), the computers may have shrunk since.
    values["most"] = most_replicas(members, per)
    if values["most"] < size:
        return _("%(needs)s; %(where)s can hold at most %(most)d (by GPUs and concurrent jobs), so it cannot "
                 "start. Stop it and ask for fewer replicas or GPUs.") % values
    values["now"] = sum(Room.of(c).holds(per) for c in members)
    if values["now"] < size:
        return _("%(needs)s; there is room for %(now)d now on %(where)s. It starts when all %(size)d fit at "
                 "once.") % values
    if job.is_multi_node:
        return _("%(needs)s; waiting for a worker that serves them to claim it.") % values
    return _("%(needs)s; waiting for a worker that serves %(where)s to claim it.") % values
