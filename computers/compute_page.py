"""The project's Compute page: the computers usable in the project (read only) and its Workers (computers
sits above workers, so the page that shows both lives here)."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET

from computers import access as computer_access
from mado import access, downloads
from workers.models import Worker


@login_required
@require_GET
def project_compute(request, project):
    """Viewers and above. Computers: Public ones and the viewer's own Private ones (computers.access)."""
    project = access.project_for_user(request.user, project)
    # Enabled ones first: a disabled computer is listed, and marked, but runs nothing new.
    computers = list(computer_access.usable_by(request.user).select_related("owner").order_by("-enabled", "name"))
    workers = list(Worker.objects.filter(project=project).order_by("worker_id", "-last_seen_at"))
    agent_version = downloads.agent_version()
    for worker in workers:  # older than the agent this server offers at /downloads/
        worker.upgrade_available = downloads.is_older(worker.version, agent_version)
    return render(request, "workers/project_compute.html", {
        "project": project,
        "computers": computers,
        "disabled_count": sum(1 for c in computers if not c.enabled),
        "workers": workers,
        "agent_version": agent_version,
    })
