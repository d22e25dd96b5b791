"""HTML pages of tracking (issue 16, item 6): the Run panel of a job page (registered as a job page block
by tracking.page_blocks), a project's Runs list with filters and chosen parameter/metric columns, the
comparison of 2–5 Runs' metrics overlaid, a standalone Run's page, and downloads of artifacts the running
code logged (MLflow's proxied artifact store, tracking.artifacts). Read-only: viewers and up; someone
outside the project gets 404."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import FileResponse, Http404, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET
from django_htmx.http import HttpResponseStopPolling

from mado import access as identity
from tracking import access, charts
from tracking.artifacts import clean_path, root_of
from tracking.choices import TERMINAL_RUN_STATUSES, LifecycleStage, RunKind, RunStatus
from tracking.errors import MlflowError
from tracking.models import LatestMetric, Param, Run, point_value

LIST_PAGE = 50
MAX_COLUMNS = 20            # parameter or metric columns chosen at once
MAX_KEYS_OFFERED = 200      # parameter/metric names offered as columns
COMPARE_MIN, COMPARE_MAX = 2, 5
HIDDEN_TAG_PREFIX = "mlflow."  # the client's own bookkeeping (run name, user, source): shown elsewhere


# The Run panel (job page block and standalone Run page) ---------------------------------------------

def _artifacts(run: Run) -> list[dict]:
    """Files the running code logged (SDK or MLflow), relative paths in name order."""
    root = root_of(run)
    found = []
    if not root.is_dir():
        return found
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            if name.endswith((".uploading", ".lock")):
                continue
            path = Path(directory) / name
            found.append({"path": path.relative_to(root).as_posix(), "size": path.stat().st_size,
                          "mtime": path.stat().st_mtime_ns})
    return sorted(found, key=lambda a: a["path"])


def run_version(run: Run) -> str:
    """Changes whenever the panel's content does; cheap enough for a poll every second: each series' count
    of points comes with its latest point (LatestMetric.points), so no history is counted."""
    latest = list(LatestMetric.objects.filter(run=run).values_list("key", "step", "timestamp", "points"))
    tags = list(run.tags.values_list("key", "value"))
    stamp = [run.status, run.end_time, run.name, run.kind, run.lifecycle_stage, latest, tags, run.params.count(),
             run.inputs.count(),
             [(a["path"], a["size"], a["mtime"]) for a in _artifacts(run)]]
    return hashlib.sha256(repr(stamp).encode()).hexdigest()[:16]


def panel_context(run: Run) -> dict:
    return {
        "run": run,
        "params": list(run.params.all()),
        "tags": [t for t in run.tags.all() if not t.key.startswith(HIDDEN_TAG_PREFIX)],
        "inputs": list(run.inputs.all()),
        "charts": charts.run_charts(run),
        "run_artifacts": _artifacts(run),
        "run_ended": run.status in TERMINAL_RUN_STATUSES,
        "run_version": run_version(run),
    }


def job_block_context(request, job) -> dict | None:
    """The job page's Run panel (jobs.page_blocks); the job page already checked who may see the job."""
    run = Run.objects.filter(job=job).select_related("experiment", "project").first()
    if run is None:
        return None
    return {**panel_context(run), "project": job.project}


def job_block_version(job) -> str:
    run = Run.objects.filter(job=job).first()
    return run_version(run) if run is not None else "none"


# Runs list ------------------------------------------------------------------------------------------

def _keys(request, name: str) -> list[str]:
    keys = []
    for value in request.GET.getlist(name):
        for key in value.split(","):
            key = key.strip()
            if key and key not in keys:
                keys.append(key)
    return keys[:MAX_COLUMNS]


def _target(run: Run, project) -> str:
    if run.job_id:
        return reverse("job-detail", args=[project.slug, run.job_id])
    return reverse("run-detail", args=[project.slug, run.run_id])


@login_required
@require_GET
def run_list(request, project):
    project = identity.project_for_user(request.user, project)
    runs = (access.runs_visible_in(request.user, project).filter(lifecycle_stage=LifecycleStage.ACTIVE)
            .select_related("experiment", "created_by"))
    chosen = {name: request.GET.get(name, "").strip() for name in ("experiment", "status", "kind", "creator")}
    experiments = list(access.experiments_visible_in(request.user, project).filter(
        lifecycle_stage=LifecycleStage.ACTIVE))
    if chosen["experiment"]:
        runs = runs.filter(experiment_id=chosen["experiment"] if chosen["experiment"].isdigit() else -1)
    lookups = {"status": "status", "kind": "kind", "creator": "created_by__username"}
    runs = runs.filter(**{lookup: chosen[name] for name, lookup in lookups.items() if chosen[name]})
    param_keys, metric_keys = _keys(request, "params"), _keys(request, "metrics")
    page = Paginator(runs, LIST_PAGE).get_page(request.GET.get("page"))
    on_page = [run.run_id for run in page]
    params: dict = {}
    for run_id, key, value in Param.objects.filter(run_id__in=on_page, key__in=param_keys).values_list(
            "run_id", "key", "value"):
        params.setdefault(run_id, {})[key] = value
    metrics: dict = {}
    for run_id, key, value, is_nan in LatestMetric.objects.filter(run_id__in=on_page, key__in=metric_keys).values_list(
            "run_id", "key", "value", "is_nan"):
        metrics.setdefault(run_id, {})[key] = charts.drawing._number(point_value(value, is_nan))
    in_project = Run.objects.filter(project=project, lifecycle_stage=LifecycleStage.ACTIVE)
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "project": project,
        "page": page,
        "rows": [{"run": run, "url": _target(run, project),
                  "params": [params.get(run.run_id, {}).get(k, "") for k in param_keys],
                  "metrics": [metrics.get(run.run_id, {}).get(k, "") for k in metric_keys]} for run in page],
        "chosen": chosen,
        "param_keys": param_keys,
        "metric_keys": metric_keys,
        "params_text": ",".join(param_keys),
        "metrics_text": ",".join(metric_keys),
        "experiments": experiments,
        "statuses": RunStatus.choices,
        "kinds": RunKind.choices,
        "creators": sorted(set(in_project.values_list("created_by__username", flat=True))),
        "param_names": list(Param.objects.filter(run__in=in_project).values_list("key", flat=True)
                            .distinct().order_by("key")[:MAX_KEYS_OFFERED]),
        "metric_names": list(LatestMetric.objects.filter(run__in=in_project).values_list("key", flat=True)
                             .distinct().order_by("key")[:MAX_KEYS_OFFERED]),
        "query": query.urlencode(),
        "compare_min": COMPARE_MIN,
        "compare_max": COMPARE_MAX,
    }
    return render(request, "tracking/run_list.html", context)


# Compare --------------------------------------------------------------------------------------------

@login_required
@require_GET
def run_compare(request, project):
    project = identity.project_for_user(request.user, project)
    run_ids = list(dict.fromkeys(r for r in request.GET.getlist("run") if r))
    context = {"project": project, "compare_min": COMPARE_MIN, "compare_max": COMPARE_MAX}
    if not COMPARE_MIN <= len(run_ids) <= COMPARE_MAX:
        context["error"] = _("Select from %(least)s to %(most)s Runs to compare; you selected %(count)s.") % {
            "least": COMPARE_MIN, "most": COMPARE_MAX, "count": len(run_ids)}
        return render(request, "tracking/run_compare.html", context, status=400)
    found = {run.run_id: run for run in access.runs_visible_in(request.user, project)
             .filter(pk__in=run_ids).select_related("experiment", "created_by")}
    if len(found) != len(run_ids):
        raise Http404("Some of these Runs are not in this project.")
    runs = [found[r] for r in run_ids]
    series = charts.run_series(run_ids)
    keys = sorted({key for by_key in series.values() for key in by_key})
    legend = [{"run": run, "color": charts.COLORS[i % len(charts.COLORS)], "url": _target(run, project)}
              for i, run in enumerate(runs)]
    compared = []
    for key in keys:
        lines, on_time = charts.compare_lines(key, [(run.name or run.run_id, series[run.run_id].get(key))
                                                    for run in runs])
        compared.append({"key": key, "svg": charts.overlay_chart(key, lines, time_axis=on_time),
                         "x_axis": charts.TIME if on_time else charts.STEP,
                         "runs": sum(1 for _label, points in lines if points)})
    param_rows = {}
    for run_id, key, value in Param.objects.filter(run_id__in=run_ids).values_list("run_id", "key", "value"):
        param_rows.setdefault(key, {})[run_id] = value
    context.update({
        "runs": runs, "legend": legend, "charts": compared,
        "params": [{"key": key, "values": [values.get(r, "") for r in run_ids],
                    "differs": len({values.get(r) for r in run_ids}) > 1}
                   for key, values in sorted(param_rows.items())],
    })
    return render(request, "tracking/run_compare.html", context)


# A standalone Run -----------------------------------------------------------------------------------

def _run(request, project, run_id) -> tuple:
    project = identity.project_for_user(request.user, project)
    run = (access.runs_visible_in(request.user, project).select_related("experiment", "created_by")
           .filter(pk=run_id).first())
    if run is None:
        raise Http404("No Run with this id in this project.")
    return project, run


@login_required
@require_GET
def run_detail(request, project, run_id):
    project, run = _run(request, project, run_id)
    if run.job_id:
        return redirect("job-detail", project=project.slug, pk=run.job_id)
    context = {**panel_context(run), "project": project, "polling": run.status not in TERMINAL_RUN_STATUSES}
    return render(request, "tracking/run_detail.html", context)


@login_required
@require_GET
def run_panel(request, project, run_id):
    """One poll of a standalone Run's page: 204 when nothing changed, the panel when something did, 286
    (htmx stops polling) with the last panel once the Run has ended."""
    project, run = _run(request, project, run_id)
    ended = run.status in TERMINAL_RUN_STATUSES
    if not ended and request.GET.get("v") == run_version(run):
        return HttpResponse(status=204)
    context = {**panel_context(run), "project": project, "polling": not ended}
    content = render_to_string("tracking/partials/_run_panel.html", context, request=request)
    return HttpResponseStopPolling(content) if ended else HttpResponse(content)


@login_required
@require_GET
def run_artifact(request, project, run_id, path):
    """An artifact the running code logged, always as a download of bytes."""
    _project, run = _run(request, project, run_id)
    target = _artifact_file(root_of(run), path)
    if target is None:
        raise Http404(_("No such artifact in this Run; artifact paths are relative to the Run's artifacts, "
                        "without '..', as the Run's page lists them."))
    return FileResponse(open(target, "rb"), as_attachment=True, filename=target.name,
                        content_type="application/octet-stream")


def _artifact_file(root: Path, path: str) -> Path | None:
    """The complete file at `path` inside `root`, or None: a path the MLflow API would refuse ('..', '.',
    empty parts, absolute, NUL, backslashes, names the file system refuses) is turned away before the file
    system sees it, and a path that leads out of the root through a link is found by resolving it."""
    try:
        if clean_path(path) != path:
            return None
    except MlflowError:
        return None
    root = root.resolve()
    target = (root / path).resolve()
    try:
        inside = root in target.parents and target.is_file()
    except OSError:  # e.g. a path the file system cannot look up
        return None
    return target if inside and not target.name.endswith((".uploading", ".lock")) else None
