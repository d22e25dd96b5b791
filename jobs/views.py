"""HTML pages of Jobs (DESIGN §10, seed 001 "When the connection drops, and when a Job is stopped"):
the project's Jobs list, the New job form, a job's page with live logs, metrics charts, artifacts and
timeline, and the Request stop dialog.

Who may see or stop what is asked of jobs.access; every change goes through jobs.services. Every page
also works without HTMX: polling only adds live updates, and the dialog opens as a whole page."""
from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from pathlib import PurePosixPath

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count, Max
from django.db.models.functions import Right
from django.http import FileResponse, Http404, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import filesizeformat
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.timesince import timesince
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods
from django_htmx.http import HttpResponseStopPolling

from jobs import access, executors, inputs, outputs, page_blocks, services, timeline, waiting
from jobs.charts import job_charts
from computers.choices import Kind
from jobs.choices import ACTIVE_STATUSES, MAIN_REPLICA, JobStatus
from jobs.forms import JobForm, add_service_error
from jobs.models import Job, LogChunk
from mado import access as identity
from mado.choices import Role
from mado.dialogs import dialog, dialog_done
from mado.errors import ServiceError
from mado.forms import service_refusals
from mado.services import Actor
from mado.validation import BIGINT_MAX, as_int

LIST_PAGE = 50
LOG_TAIL = 2000   # chunks shown when the page opens; the whole log is a download away
# Characters shown when the page opens: a chunk holds up to 4 MiB (log-frames), so a count of chunks alone
# could put gigabytes into one page.
LOG_TAIL_CHARS = 1_000_000
LOG_PAGE = 500    # chunks per poll, so a burst of output catches up in a few polls

# Jobs list --------------------------------------------------------------------------------------

@login_required
@require_GET
def job_list(request, project):
    project = identity.project_for_user(request.user, project)
    jobs = access.visible_in(request.user, project).select_related("project", "target", "created_by", "worker")
    page = Paginator(jobs, LIST_PAGE).get_page(request.GET.get("page"))
    is_admin = identity.has_role(request.user, project, Role.ADMIN)
    reasons = waiting.reasons(page)  # for the whole page at once: its queries do not grow with the rows
    context = {
        "project": project,
        "page": page,
        "rows": [{"job": job, "refusal": access.stop_refusal(request.user, job, is_project_admin=is_admin),
                  "age": _age(job.created_at), "waiting_reason": reasons.get(job.pk)}
                 for job in page],
        # The list polls while something can still change by itself.
        "polling": jobs.filter(status__in=ACTIVE_STATUSES).exists(),
        "can_create": identity.has_role(request.user, project, Role.MEMBER),
    }
    if request.htmx and request.GET.get("fragment") == "list":
        return render(request, "jobs/partials/_job_list.html", context)
    # Shown above the list, outside the part that polls, so an opened "first time" section stays open.
    context["manual_sites"] = _manual_sites(request, project, list(page))
    return render(request, "jobs/job_list.html", context)


def _manual_sites(request, project, jobs: list) -> list[dict]:
    """The instructions of each manual site that Jobs on this page are waiting for (seed 003, "Submit
    manually"): one block per computer, whatever the number of Jobs waiting."""
    waiting = {job.target_id: job.target for job in jobs if job.status == JobStatus.WAITING_MANUAL}
    blocks = (_manual_target(request, target, project) for target in sorted(waiting.values(), key=lambda t: t.name))
    return [block for block in blocks if block is not None]


def _manual_for(request, job: Job) -> dict | None:
    if job.status != JobStatus.WAITING_MANUAL:
        return None
    return _manual_target(request, job.target, job.project)


# New job ----------------------------------------------------------------------------------------

@login_required
@require_http_methods(["GET", "POST"])
def job_create(request, project):
    project = identity.project_for_user(request.user, project, Role.MEMBER)
    if request.method == "POST":
        form = JobForm(request.POST, user=request.user, project=project)
        if form.is_valid():
            with service_refusals(form, add_service_error):
                job = services.create_job(Actor.from_request(request), project, form.service_data())
                return redirect("job-detail", project=project.slug, pk=job.pk)
    else:
        # Choosing another computer reloads the fields that depend on it (HTMX), or the whole form
        # (the Show options button without JavaScript); what was typed comes along in the query.
        form = JobForm(user=request.user, project=project, initial=_initial_from(request.GET))
    context = {"project": project, "form": form, "manual": _manual_target(request, form.target, project)}
    if request.htmx and request.GET.get("fragment") == "computer":
        fields = render_to_string("jobs/partials/_computer_fields.html", context, request=request)
        # The GPUs count lives outside #computer-fields (it is for sites only): swapped out of band.
        gpu_count = render_to_string("jobs/job_create.html#gpu-count", {**context, "oob": True}, request=request)
        return HttpResponse(fields + gpu_count)
    return render(request, "jobs/job_create.html", context)


def _manual_target(request, target, project) -> dict | None:
    """A manual site (chosen in the form, or waited for): how its Jobs get submitted."""
    executor = executors.executor_for(target.kind) if target is not None else None
    return executor.manual_instructions(request, target, project) if executor else None


def _initial_from(query) -> dict:
    initial = {name: query.get(name) for name in ("name", "computer", "runtime", "image", "command", "requirements",
                                                   "parameters", "walltime", "cluster_mode", "cluster_size",
                                                   "gpus_per_replica", "compute_group", "gpu_count", "notify_me", "run_kind")
               if query.get(name) is not None}
    if "gpu_ids" in query:
        initial["gpu_ids"] = query.getlist("gpu_ids")
    initial.setdefault("parameters", "{}")
    return initial


# Job page ---------------------------------------------------------------------------------------

@login_required
@require_GET
def job_detail(request, project, pk):
    job = _job(request, project, pk)
    replica = _replica(request, job)
    chunks, omitted = _log_tail(job, replica)
    blocks = page_blocks.render_blocks(request, job)
    context = {
        **_panels(request, job),
        **_metrics_panel(job, blocks),
        "chunks": chunks,
        "logs_omitted": omitted,
        "after": chunks[-1].pk if chunks else 0,
        "polling": not job.is_terminal,
        "replica": replica,
        "job_blocks": blocks.html,
    }
    return render(request, "jobs/job_detail.html", context)


def _log_tail(job: Job, replica: str | None) -> tuple[list[LogChunk], bool]:
    """The newest chunks, at most LOG_TAIL of them and LOG_TAIL_CHARS characters in all (the oldest one
    shown keeps only its end), oldest first, and whether older output was left out. Only each chunk's
    end is read from the database, and only until the page is full."""
    rows = (_log_chunks(job, replica).order_by("-id").defer("data")
            .annotate(tail=Right("data", LOG_TAIL_CHARS))[:LOG_TAIL + 1])
    kept, room = [], LOG_TAIL_CHARS
    for chunk in rows.iterator(chunk_size=16):
        if len(kept) == LOG_TAIL or room <= 0:
            return kept[::-1], True
        chunk.data = chunk.tail[-room:]
        kept.append(chunk)
        room -= len(chunk.tail)
        if room < 0 or len(chunk.tail) == LOG_TAIL_CHARS:  # its start was cut, here or by Right()
            return kept[::-1], True
    return kept[::-1], False


def _metrics_panel(job: Job, blocks: page_blocks.RenderedBlocks) -> dict:
    """jobs' own Metrics panel, unless a block replaces it (tracking's Run panel draws the same series,
    downsampled in the database); its charts load up to 100,000 points, so only when it is shown."""
    if not blocks.shows("metrics"):
        return {"show_metrics": False}
    charts, charts_truncated = job_charts(job)
    return {"show_metrics": True, "charts": charts, "charts_truncated": charts_truncated}


def _replica(request, job: Job) -> str | None:
    """The replica whose logs the page shows: a cluster job shows one at a time (main1 first)."""
    if not job.is_cluster:
        return None
    chosen = request.GET.get("replica") or MAIN_REPLICA
    if chosen not in job.replica_names:
        raise Http404("No such replica in this job.")
    return chosen


def _log_chunks(job: Job, replica: str | None):
    return job.log_chunks.filter(replica=replica) if replica else job.log_chunks.all()


@login_required
@require_GET
def job_poll(request, project, pk):
    """One poll of the job page: the log chunks after `after` appended to the log, the panels again
    when something in them changed, and the next poller. 286 once the job ended and every chunk was
    sent, which stops htmx polling."""
    job = _job(request, project, pk)  # read before the chunks: a chunk stored after this is sent next time
    after = as_int(request.GET.get("after", "0"), low=0, high=BIGINT_MAX)
    if after is None:
        raise Http404("after is the id of the last log chunk shown.")
    replica = _replica(request, job)
    chunks = list(_log_chunks(job, replica).filter(id__gt=after).order_by("id")[:LOG_PAGE])
    done = job.is_terminal and len(chunks) < LOG_PAGE
    panels = _panels(request, job)
    changed = panels["version"] != request.GET.get("v")
    # The apps' blocks (jobs.page_blocks) are swapped out of band like the panels, when something changed.
    blocks = page_blocks.render_blocks(request, job, oob=True) if changed else None
    context = {
        **panels,
        **(_metrics_panel(job, blocks) if blocks is not None else {}),
        "replica": replica,
        "chunks": chunks,
        "after": chunks[-1].pk if chunks else after,
        "polling": not done,
        "panels_changed": changed,
    }
    content = render_to_string("jobs/partials/_poll.html", context, request=request)
    if blocks is not None:
        content += "".join(blocks.html)
    return HttpResponseStopPolling(content) if done else HttpResponse(content)


@login_required
@require_GET
def job_log_text(request, project, pk):
    """The whole log as text, stdout and stderr in the order they arrived (of one replica: ?replica=)."""
    job = _job(request, project, pk)
    replica = _replica(request, job)
    chunks = (chunk for chunk in _log_chunks(job, replica).order_by("id").only("data").iterator(chunk_size=500))
    response = StreamingHttpResponse((chunk.data for chunk in chunks), content_type="text/plain; charset=utf-8")
    suffix = f"-{replica}" if replica else ""
    response["Content-Disposition"] = f'inline; filename="job-{job.pk}{suffix}.log"'
    return response


@login_required
@require_GET
def artifact_download(request, project, pk, artifact_id):
    job = _job(request, project, pk)
    artifact = get_object_or_404(job.artifacts, pk=artifact_id, complete=True)
    if not artifact.file:
        raise Http404("This artifact has no stored file.")
    # Always a download as bytes: the declared MIME type comes from the job and is not trusted.
    return FileResponse(artifact.file.open("rb"), as_attachment=True, filename=PurePosixPath(artifact.path).name,
                        content_type="application/octet-stream")


def _job(request, project: str, pk: int) -> Job:
    job = access.job_for(request.user, pk)
    if job.project.slug != project:
        raise Http404("No job with this id in this project.")
    return job


def _panels(request, job: Job) -> dict:
    """What the job page shows besides the logs and the metrics (_metrics_panel), and a version that changes
    when any of it does."""
    artifacts = list(job.artifacts.all())
    events = list(job.events.all())
    metric_stamp = job.metrics.aggregate(n=Count("id"), last=Max("id"))
    waiting_reason = waiting.reason(job)
    executor = executors.executor_for(job.target.kind) if job.target is not None else None
    error = executor.error_for(request.user, job) if executor else job.error
    uploading = _upload_line(job)
    version = "|".join(map(str, [waiting_reason, uploading,
        job.status, job.end_reason, job.exit_code, job.worker_id, job.target_id, job.stop_requested_at,
        job.is_unresponsive,
        job.started_at, job.finished_at, [e.pk for e in events][-1:], metric_stamp["n"], metric_stamp["last"],
        [(a.pk, a.complete) for a in artifacts], page_blocks.versions(job),
    ]))
    return {
        "project": job.project,
        "job": job,
        "refusal": access.stop_refusal(request.user, job),
        "can_mark_lost": job.is_unresponsive and access.can_mark_lost(request.user, job),
        "timeline": timeline.timeline(events, error=(job.error, error)),
        "claimer": _claimer(job, events, executor.submitter(job) if executor else None),
        "error": error,
        "walltime": _duration(job.walltime_seconds),
        "heartbeat_age": _age(job.heartbeat_at) if job.heartbeat_at else "",
        "artifacts": artifacts,
        "parameters": json.dumps(job.parameters, indent=2, ensure_ascii=False, sort_keys=True),
        "manual": _manual_for(request, job),
        "replicas": list(job.replicas.select_related("target")) if job.is_cluster else [],
        "input_versions": inputs.page_versions(job),
        "waiting_reason": waiting_reason,
        "upload_progress": uploading,
        "version": hashlib.sha256(version.encode()).hexdigest()[:16],
    }


def _upload_line(job: Job) -> str:
    """The line "Uploading outputs: 1,234 of 10,000 files, …" while a running job's declared outputs arrive."""
    progress = outputs.upload_progress(job) if not job.is_terminal else None
    if progress is None:
        return ""
    return _("Uploading outputs: %(files)s of %(total_files)s files, %(bytes)s of %(total_bytes)s") % {
        "files": f"{progress['files']:,}", "total_files": f"{progress['total_files']:,}",
        "bytes": filesizeformat(progress["bytes"]), "total_bytes": filesizeformat(progress["total_bytes"])}


def _claimer(job: Job, events: list, submitter: str | None) -> dict:
    """Who took the Job from the queue, as its claim recorded it: its worker; for a site, the launcher or
    the person whose `mado-tracking submit` did (the executor of its kind says), so the Details say what the
    timeline's "Claimed by" line says. `who` is None while nobody has."""
    site = job.target is not None and job.target.kind == Kind.SITE
    label = _("Submitted by") if site else _("Worker")
    if job.worker is not None:
        return {"label": label, "who": job.worker.worker_id}
    if submitter is not None:
        return {"label": label, "who": submitter}
    claim = timeline.last_claim(events)
    if claim is not None:
        return {"label": label, "who": claim.text}
    if site:
        nobody = _("Never submitted") if job.is_terminal else _("Not submitted yet")
    else:
        nobody = _("Never claimed") if job.is_terminal else _("Not claimed yet")
    return {"label": label, "who": None, "nobody": nobody}


def _age(moment) -> str:
    if timezone.now() - moment < timedelta(minutes=1):
        return _("just now")
    return _("%(age)s ago") % {"age": timesince(moment, depth=1)}


def _duration(seconds: int | None) -> str:
    if not seconds:
        return ""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    return " ".join(f"{n}{unit}" for n, unit in parts if n)


# Request stop -----------------------------------------------------------------------------------

@login_required
@require_http_methods(["GET", "POST"])
def job_stop(request, project, pk):
    job = _job(request, project, pk)
    if not access.can_stop(request.user, job):
        raise PermissionDenied(_("Only the creator and Project admins can stop this Job"))
    origin = request.POST.get("from") or request.GET.get("from")
    back = (reverse("jobs", args=[job.project.slug]) if origin == "list"
            else reverse("job-detail", args=[job.project.slug, job.pk]))
    error = _decide(request, job, services.request_stop) if request.method == "POST" else None
    if request.method == "POST" and error is None:
        return dialog_done(request, "jobsChanged", back)
    context = {"project": job.project, "job": job, "refusal": access.stop_refusal(request.user, job),
               "error": error, "origin": origin or "detail",
               "queued": job.status in (JobStatus.QUEUED, JobStatus.WAITING_MANUAL)}
    # A refusal (the job ended meanwhile) is shown in the dialog with 200: htmx swaps no 4xx answer.
    return dialog(request, "jobs/partials/_stop_dialog.html", context, back=back, page="jobs/dialog_page.html")


# Mark as lost -----------------------------------------------------------------------------------

@login_required
@require_http_methods(["GET", "POST"])
def job_mark_lost(request, project, pk):
    """A Project admin's decision that a Not responding Job's worker is gone (jobs.services.mark_lost):
    the dialog says what that does and what it does not (the process may still run on the computer)."""
    job = _job(request, project, pk)
    if not access.can_mark_lost(request.user, job):
        raise PermissionDenied(_("Only Project admins can mark a Job as lost."))
    back = reverse("job-detail", args=[job.project.slug, job.pk])
    error = _decide(request, job, services.mark_lost) if request.method == "POST" else None
    if request.method == "POST" and error is None:
        return dialog_done(request, "jobsChanged", back)
    context = {"project": job.project, "job": job, "error": error, "refusal": access.lost_refusal(job),
               "heartbeat_age": _age(job.heartbeat_at) if job.heartbeat_at else ""}
    # Refusals are shown in the dialog with 200, as in Request stop: htmx swaps no 4xx answer.
    return dialog(request, "jobs/partials/_lost_dialog.html", context, back=back, page="jobs/dialog_page.html")


def _decide(request, job: Job, decision) -> str | None:
    """Carries out a dialog's decision on `job` (Request stop, Mark as lost), or says why it was refused;
    the dialog then shows the job as the refusal saw it."""
    try:
        decision(Actor.from_request(request), job)
    except ServiceError as refused:
        job.refresh_from_db()
        return refused.message
    return None
