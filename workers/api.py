"""The workers as people see them through the API: GET /api/workers (global administrators) and
/api/projects/{project}/workers. What workers themselves call lives in worker_api/."""
from __future__ import annotations

from drf_spectacular.utils import OpenApiTypes, extend_schema
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import APIView

from mado.access import is_global_admin
from mado.api.views import items, project_for
from workers.models import Worker


def worker_body(worker: Worker, *, with_candidates: bool) -> dict:
    body = {
        "id": worker.pk,
        "worker_id": worker.worker_id,
        "project": worker.project.slug,
        "version": worker.version,
        "hostname": worker.hostname,
        "parallel_jobs": worker.parallel_jobs,
        "target_ids": worker.target_ids,
        "capabilities": worker.capabilities,
        "online": worker.is_online,
        "status": "online" if worker.is_online else "offline",
        "last_seen_at": worker.last_seen_at,
        "started_at": worker.started_at,
        "active_jobs": worker.active_jobs,
    }
    if with_candidates:
        body["ssh_key_candidates"] = worker.ssh_key_candidates
        body["known_hosts_candidates"] = worker.known_hosts_candidates
    return body


class ProjectWorkersView(APIView):
    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request, project):
        project = project_for(request, project)
        workers = Worker.objects.filter(project=project).select_related("project")
        return Response(items([worker_body(w, with_candidates=is_global_admin(request.user)) for w in workers]))


class AllWorkersView(APIView):
    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request):
        if not is_global_admin(request.user):
            raise exceptions.PermissionDenied("Only global administrators see every worker; "
                                              "use /api/projects/{project}/workers.")
        workers = Worker.objects.select_related("project")
        return Response(items([worker_body(w, with_candidates=True) for w in workers]))
