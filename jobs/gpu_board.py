"""The GPU board (issue 22): every enabled computer × its registered GPUs, which Job holds each GPU now
(its GpuReservation: link, creator, since when), the GPU's utilisation and memory now (the latest
`system/gpu/<id>/…` metrics of that Job, sent by the worker every 10 s), or free. Server-rendered; the
page polls its table every 10 s with HTMX.

A GPU is also shown **busy outside the app** (docs/gpus.md "The GPU board"), from what the worker last
said about the Job that holds it, never from older news:
- a claimed Job waiting for it: its latest `waiting` event since its claim names each GPU with the pid and
  user of the process outside Mado (the worker's sentence, worker_agent.gpu_remote.busy_clauses, read back
  with OUTSIDE), while the worker still beats for it (heartbeat within STALE_SECONDS); gone once it starts;
- a running Job sharing it: its latest `system/…gpu/<id>/outside_processes` point (how many processes
  outside Mado its probe saw there) is above 0 and at most STALE_SECONDS old (three samples).
A GPU that no Job holds shows Free, with what the worker's GPU watch last read of the whole computer
(computers.GpuReading, every MMT_WORKER_GPU_WATCH_SECONDS, 30 s by default) while that reading is at most
READING_FRESH_SECONDS old: its utilisation and memory now, and busy outside the app with each process's pid
and user (seed 002: reservations do not stop people using a GPU over SSH). A held GPU takes the reading's
utilisation and memory where its Job's metrics have none, and its processes outside Mado where the Job's
own news says nothing (not for Docker Jobs: their processes run as root in a container, and a login user
who cannot read their environment would see the Job's own processes as outside).

It lives in jobs, not computers: computers sits below jobs (DESIGN §2) and may not read reservations.
A Job of a project the reader cannot view is shown as held, without its name, link or creator (whether
its GPU is busy outside the app is shown: it says nothing about the Job).
The same few queries whatever the number of computers, GPUs and Jobs: computers, their fresh readings,
reservations with their Jobs, the holding cluster Jobs' replicas (whose metrics are named system/<replica>/…),
the latest metric points of the holding Jobs and the latest `waiting` event of the claimed ones (PostgreSQL
DISTINCT ON), the projects the reader sees. A computer's details show its own row (`details_block`, registered in
jobs.apps), polled the same way."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from computers import access as computer_access
from computers.choices import Runtime
from computers.models import GpuReading
from jobs.choices import JobStatus
from jobs.models import GpuReservation, Job, JobEvent, JobReplica, Metric
from mado import access as identity
from mado.validation import BIGINT_MAX, as_int

POLL_SECONDS = 10
NOW_METRICS = ("utilization", "memory", "outside_processes")
# Three of the worker's 10-second samples, or two of its 5-second heartbeats and then some: older news of
# a process outside Mado is not shown (the worker may be gone, the process too).
STALE_SECONDS = 30
# Three of the GPU watch's 30-second samples: an older reading is not shown (the worker, or its way to the
# computer, may be gone).
READING_FRESH_SECONDS = 90
# One clause of the worker's waiting reason (worker_agent.gpu_remote.busy_clauses): "GPU 1 is in use by a
# process outside Mado (pid 4242, user alice)", on a replica "GPU 1 of sub1 on node-b is in use by …".
OUTSIDE = re.compile(r"GPU (?P<gpu>\S+?)(?: of (?P<replica>\S+) on .+?)? is in use by a process outside Mado "
                     r"\(pid (?P<pid>\d+), user (?P<user>[^)]*)\)")


@dataclass
class Outsider:
    pid: int
    user: str


@dataclass
class GpuCell:
    gpu_id: str
    job: Job | None = None
    visible: bool = False
    since: object = None
    url: str = ""
    utilization: float | None = None
    memory: float | None = None
    memory_total: float | None = None  # from the GPU watch's reading
    outsiders: list[Outsider] = field(default_factory=list)  # named by a waiting Job's reason or the GPU watch
    outside_processes: int = 0  # counted by a running Job's probe (no names)
    waits: bool = False  # the outsiders are named by the holding Job's waiting reason

    @property
    def free(self) -> bool:
        return self.job is None

    @property
    def busy_outside(self) -> bool:
        return bool(self.outsiders or self.outside_processes)


@dataclass
class ComputerRow:
    computer: object
    gpus: list[GpuCell]


def board(user, computer_id: int | None = None) -> list[ComputerRow]:
    """Every enabled computer whose details `user` sees, or the one `computer_id` (enabled or not: a
    disabled computer's running Jobs still hold GPUs), with registered GPUs."""
    listed = computer_access.detailed_to(user).select_related("owner")
    listed = listed.filter(pk=computer_id) if computer_id is not None else listed.filter(enabled=True)
    computers = [c for c in listed.order_by("name") if c.gpu_ids]
    reservations = (GpuReservation.objects.filter(target__in=computers)
                    .select_related("job__project", "job__created_by"))
    held = {(r.target_id, str(r.gpu_id)): r for r in reservations}
    now = timezone.now()
    readings = {(r.target_id, r.gpu_id): r for r in GpuReading.objects.filter(
        target__in=computers, seen_at__gte=now - timedelta(seconds=READING_FRESH_SECONDS))}
    prefixes = _metric_prefixes(held)
    latest, waiting = {}, {}
    if held:
        names = {f"{prefixes[key]}gpu/{key[1]}/{what}" for key in held for what in NOW_METRICS}
        points = (Metric.objects.filter(job_id__in={r.job_id for r in held.values()}, name__in=names)
                  .order_by("job_id", "name", "-step", "-id").distinct("job_id", "name")
                  .values_list("job_id", "name", "value", "timestamp"))
        latest = {(job_id, name): (value, at) for job_id, name, value, at in points}
        waiting = _waiting_reasons([r.job for r in held.values()], now)
    visible = set(identity.projects_visible_to(user).values_list("pk", flat=True))
    rows = []
    for computer in computers:
        cells = []
        for gpu_id in (str(g) for g in computer.gpu_ids):
            cell = GpuCell(gpu_id)
            reservation = held.get((computer.pk, gpu_id))
            if reservation is not None:
                job = reservation.job
                cell.job, cell.since = job, reservation.created_at
                cell.visible = job.project_id in visible
                if cell.visible:
                    cell.url = reverse("job-detail", args=[job.project.slug, job.pk])
                prefix = f"{prefixes[(computer.pk, gpu_id)]}gpu/{gpu_id}/"
                cell.utilization = (latest.get((job.pk, f"{prefix}utilization")) or (None,))[0]
                cell.memory = (latest.get((job.pk, f"{prefix}memory")) or (None,))[0]
                replica = prefixes[(computer.pk, gpu_id)].removeprefix("system/").rstrip("/") or None
                cell.outsiders = [o for (g, r, o) in waiting.get(job.pk, []) if g == gpu_id and r == replica]
                cell.waits = bool(cell.outsiders)
                count, at = latest.get((job.pk, f"{prefix}outside_processes")) or (0, None)
                if job.status == JobStatus.RUNNING and count > 0 and at >= now - timedelta(seconds=STALE_SECONDS):
                    cell.outside_processes = int(count)
            _add_reading(cell, readings.get((computer.pk, gpu_id)))
            cells.append(cell)
        rows.append(ComputerRow(computer, cells))
    return rows


def _add_reading(cell: GpuCell, reading: GpuReading | None) -> None:
    """The GPU watch's fresh reading: a free GPU's figures and processes outside Mado; a held GPU's where
    its Job said nothing (see the module's docstring for Docker Jobs)."""
    if reading is None:
        return
    if cell.utilization is None:
        cell.utilization = reading.utilization
    if cell.memory is None:
        cell.memory = reading.memory_used
    cell.memory_total = reading.memory_total
    if cell.busy_outside or (cell.job is not None and cell.job.runtime == Runtime.DOCKER):
        return
    cell.outsiders = [Outsider(int(p["pid"]), str(p["user"])) for p in reading.outside or []
                      if isinstance(p, dict) and "pid" in p]


def _metric_prefixes(held: dict) -> dict[tuple[int, str], str]:
    """(computer, GPU) → where the holding Job's metrics of it are named: `system/`, or `system/<replica>/`
    for the replica of a cluster Job that runs on that computer with that GPU (one query)."""
    prefixes = {key: "system/" for key in held}
    cluster = {r.job_id for r in held.values() if r.job.is_cluster}
    if cluster:
        for replica in JobReplica.objects.filter(job_id__in=cluster).only("job_id", "target_id", "name", "gpu_ids"):
            for gpu_id in replica.gpu_ids or []:
                key = (replica.target_id, str(gpu_id))
                if key in held and held[key].job_id == replica.job_id:
                    prefixes[key] = f"system/{replica.name}/"
    return prefixes


def _waiting_reasons(jobs: list[Job], now) -> dict[int, list[tuple[str, str | None, Outsider]]]:
    """Job → (GPU ID, replica or None, the process outside Mado) from the latest `waiting` event of each
    claimed Job since its claim, while its worker still beats for it (one query)."""
    fresh = now - timedelta(seconds=STALE_SECONDS)
    claimed = {job.pk: job for job in jobs if job.status == JobStatus.CLAIMED and job.claimed_at is not None
               and job.heartbeat_at is not None and job.heartbeat_at >= fresh}
    if not claimed:
        return {}
    events = (JobEvent.objects.filter(job_id__in=claimed, kind="waiting")
              .order_by("job_id", "-at", "-id").distinct("job_id").values_list("job_id", "at", "message"))
    found: dict[int, list[tuple[str, str | None, Outsider]]] = {}
    for job_id, at, message in events:
        if at < claimed[job_id].claimed_at:  # a reason from an earlier claim (the Job was given back since)
            continue
        found[job_id] = [(m["gpu"], m["replica"], Outsider(int(m["pid"]), m["user"]))
                         for m in OUTSIDE.finditer(message)]
    return found


def context(user, computer_id: int | None = None) -> dict:
    url = reverse("gpu-board") + "?fragment=board" + (f"&computer={computer_id}" if computer_id is not None else "")
    return {"rows": board(user, computer_id), "poll_seconds": POLL_SECONDS, "poll_url": url,
            "one_computer": computer_id is not None}


def details_block(request, target) -> dict | None:
    """The block on a computer's details (computers.page_blocks): this computer's row of the board."""
    if not target.gpu_ids:
        return None
    return context(request.user, target.pk)


@login_required
@require_GET
def gpu_board(request):
    computer_id = as_int(request.GET.get("computer"), low=1, high=BIGINT_MAX)
    if request.htmx and request.GET.get("fragment") == "board":
        return render(request, "computers/partials/_gpu_board.html", context(request.user, computer_id))
    return render(request, "computers/gpu_board.html", context(request.user))
