"""The GPU board (issue 22): every enabled computer × its registered GPUs, which Job holds each GPU now
(its GpuReservation: link, creator, since when), the GPU's utilisation and memory now (the latest
`system/gpu/<id>/…` metrics of that Job, sent by the worker every 10 s), or free. Server-rendered; the
page polls its table every 10 s with HTMX.

It lives in jobs, not computers: computers sits below jobs (DESIGN §2) and may not read reservations.
A Job of a project the reader cannot view is shown as held, without its name, link or creator.
Three queries whatever the number of computers and GPUs: computers, reservations with their Jobs,
the latest metric points of the holding Jobs (PostgreSQL DISTINCT ON). A computer's details show its own
row (`details_block`, registered in jobs.apps), polled the same way."""
from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from computers import access as computer_access
from jobs.models import GpuReservation, Job, Metric
from mado import access as identity
from mado.validation import BIGINT_MAX, as_int

POLL_SECONDS = 10
NOW_METRICS = ("utilization", "memory")


@dataclass
class GpuCell:
    gpu_id: str
    job: Job | None = None
    visible: bool = False
    since: object = None
    url: str = ""
    utilization: float | None = None
    memory: float | None = None

    @property
    def free(self) -> bool:
        return self.job is None


@dataclass
class ComputerRow:
    computer: object
    gpus: list[GpuCell]


def board(user, computer_id: int | None = None) -> list[ComputerRow]:
    """Every enabled computer `user` sees, or the one `computer_id` (enabled or not: a disabled computer's
    running Jobs still hold GPUs), with registered GPUs."""
    listed = computer_access.listed_to(user)
    listed = listed.filter(pk=computer_id) if computer_id is not None else listed.filter(enabled=True)
    computers = [c for c in listed.order_by("name") if c.gpu_ids]
    reservations = (GpuReservation.objects.filter(target__in=computers)
                    .select_related("job__project", "job__created_by"))
    held = {(r.target_id, str(r.gpu_id)): r for r in reservations}
    names = [f"system/gpu/{gpu_id}/{what}" for (_, gpu_id) in held for what in NOW_METRICS]
    latest = {}
    if held:
        points = (Metric.objects.filter(job_id__in={r.job_id for r in held.values()}, name__in=set(names))
                  .order_by("job_id", "name", "-step", "-id").distinct("job_id", "name")
                  .values_list("job_id", "name", "value"))
        latest = {(job_id, name): value for job_id, name, value in points}
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
                cell.utilization = latest.get((job.pk, f"system/gpu/{gpu_id}/utilization"))
                cell.memory = latest.get((job.pk, f"system/gpu/{gpu_id}/memory"))
            cells.append(cell)
        rows.append(ComputerRow(computer, cells))
    return rows


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
