"""Why a queued Job waits (issue 13): one sentence in the reader's language for a queued Job on an
SSH or Local computer, or None when nothing holds it back (a worker will claim it shortly).

The checks follow the claim's own rule (jobs.services.claim_job) in the order a person fixes them:
the computer is disabled; no online worker of the Job's Project that runs Jobs serves the computer
(computers.access.served_by_worker); such workers are online but their target IDs leave it out; the
computer already runs its concurrent-job limit (jobs.cluster.slots_used); the Job's GPUs are held by
other Jobs. Cluster Jobs are explained by jobs.cluster.queued_reason; site Jobs by their site (None).

`reasons` answers for a whole page with a bounded number of queries, however many Jobs it has: the
online workers once, the computers they serve once per service account, the slots in use and the
GPU reservations once each. Each is read only when some Job gets that far. Cluster Jobs are the
exception: queued_reason reads their computers one Job at a time."""
from __future__ import annotations

from functools import cached_property

from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from computers import access as computer_access
from computers.choices import Kind, Visibility
from jobs import cluster
from jobs.choices import JobStatus
from jobs.models import GpuReservation, Job
from workers.models import Worker

JOBS_CAPABILITY = "jobs"  # in a worker's hello: it runs Jobs (not only checks and directory reads)
WORKER_KINDS = (Kind.SSH, Kind.LOCAL)


def reason(job: Job) -> str | None:
    """The sentence for one Job (its page, its API body)."""
    return reasons([job]).get(job.pk)


def reasons(jobs) -> dict[int, str | None]:
    """{job id: sentence or None} for the queued Jobs among `jobs` (their targets loaded with
    select_related, as the Jobs list does); other Jobs are left out."""
    waiting = [job for job in jobs if job.status == JobStatus.QUEUED and job.target.kind in WORKER_KINDS]
    page = _Page(waiting)
    return {job.pk: cluster.queued_reason(job) if job.is_cluster else page.reason(job) for job in waiting}


class _Page:
    """What the checks read, each loaded at most once for all the Jobs asked about."""

    def __init__(self, jobs: list[Job]):
        self.jobs = [job for job in jobs if not job.is_cluster]
        self.target_ids = {job.target_id for job in self.jobs}

    @cached_property
    def workers(self) -> list[Worker]:
        """Online workers of the Jobs' Projects that run Jobs."""
        online = (Worker.objects.online().filter(project_id__in={job.project_id for job in self.jobs})
                  .select_related("account__service_account").order_by("worker_id", "pk"))
        return [worker for worker in online if JOBS_CAPABILITY in (worker.capabilities or [])]

    @cached_property
    def served(self) -> dict[int, set[int]]:
        """{service account's user id: ids of this page's computers it may serve}: one query per account."""
        served = {}
        for worker in self.workers:
            if worker.account_id not in served:
                served[worker.account_id] = set(computer_access.served_by_worker(worker.account)
                                                .filter(pk__in=self.target_ids).values_list("pk", flat=True))
        return served

    @cached_property
    def slots(self) -> dict[int, int]:
        return cluster.slots_used_on(self.target_ids)

    @cached_property
    def holders(self) -> dict[tuple[int, str], int]:
        """{(computer id, GPU id): id of the Job holding it} for the computers whose Jobs ask for GPUs."""
        targets = {job.target_id for job in self.jobs if job.gpu_ids}
        rows = GpuReservation.objects.filter(target_id__in=targets).values_list("target_id", "gpu_id", "job_id")
        return {(target_id, gpu_id): job_id for target_id, gpu_id, job_id in rows}

    def reason(self, job: Job) -> str | None:
        target = job.target
        if not target.enabled:
            return _("%(computer)s is disabled: it starts once its owner enables it again.") % {
                "computer": target.name}
        serving = [w for w in self.workers
                   if w.project_id == job.project_id and target.pk in self.served.get(w.account_id, ())]
        if not serving:
            return _no_worker(target)
        if not any(not w.target_ids or target.pk in w.target_ids for w in serving):
            return _targets_exclude(target, serving)
        used = self.slots.get(target.pk, 0)
        if used >= target.concurrency:
            return ngettext("%(computer)s already runs %(used)d of %(limit)d concurrent job: it starts when "
                            "one ends.",
                            "%(computer)s already runs %(used)d of %(limit)d concurrent jobs: it starts when "
                            "one of them ends.",
                            target.concurrency) % {"computer": target.name, "used": used, "limit": target.concurrency}
        held = {gpu: self.holders[(target.pk, gpu)] for gpu in job.gpu_ids if (target.pk, gpu) in self.holders}
        held = {gpu: holder for gpu, holder in held.items() if holder != job.pk}
        if held:
            holders = sorted(set(held.values()))
            return ngettext("GPU %(gpus)s held by job %(jobs)s: it starts when that job ends.",
                            "GPU %(gpus)s held by jobs %(jobs)s: it starts when they end.",
                            len(holders)) % {"gpus": ", ".join(held), "jobs": ", ".join(map(str, holders))}
        return None


def _no_worker(target) -> str:
    values = {"computer": target.name, "id": target.pk}
    if target.visibility == Visibility.PRIVATE:
        return _("No online worker of this Project runs Jobs on %(computer)s: start a worker with a token of a "
                 "service account of this Project that the computer's owner created, with --target-ids "
                 "including %(id)s (see Worker settings on the computer's page).") % values
    return _("No online worker of this Project runs Jobs on %(computer)s: start a worker with a token of this "
             "Project's service account, with --target-ids including %(id)s (see Worker settings on the "
             "computer's page).") % values


def _targets_exclude(target, workers: list[Worker]) -> str:
    names = list(dict.fromkeys(w.worker_id for w in workers))
    return ngettext("Worker %(workers)s is online, but its target IDs leave out %(computer)s: add %(id)s to its "
                    "--target-ids (MMT_WORKER_TARGET_IDS), or start a worker for it.",
                    "Workers %(workers)s are online, but their target IDs leave out %(computer)s: add %(id)s to "
                    "the --target-ids (MMT_WORKER_TARGET_IDS) of one of them, or start a worker for it.",
                    len(names)) % {"workers": ", ".join(names), "computer": target.name, "id": target.pk}
