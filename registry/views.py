"""HTML pages of the model registry: the project's registered models with their versions, and a
version's download (its file, or its directory as a .zip)."""
from __future__ import annotations

import tempfile
import zipfile
from pathlib import Path

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Prefetch
from django.http import FileResponse, Http404
from django.shortcuts import render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET

from mado import access as identity
from registry import services
from registry.models import ModelVersion

MODEL_PAGE = 25


@login_required
@require_GET
def model_list(request, project):
    project = identity.project_for_user(request.user, project)
    versions = ModelVersion.objects.select_related("run", "run__job", "created_by").prefetch_related("aliases")
    models = (services.models_visible_in(request.user, project).select_related("created_by")
              .prefetch_related(Prefetch("versions", queryset=versions)).order_by("name"))
    page = Paginator(models, MODEL_PAGE).get_page(request.GET.get("page"))
    return render(request, "registry/model_list.html", {"project": project, "page": page})


@login_required
@require_GET
def version_download(request, project, model, version):
    project = identity.project_for_user(request.user, project)
    found = services.models_visible_in(request.user, project).filter(pk=model).first()
    row = found.versions.filter(version=version).first() if found else None
    if row is None:
        raise Http404(_("No such model version; open it from the Models page."))
    media = Path(settings.MEDIA_ROOT).resolve()
    target = (media / row.stored_path).resolve() if row.stored_path else None
    if target is None or media not in target.parents or not target.exists():
        raise Http404(_("This version's files are not stored on this server; its source is %(source)s.")
                      % {"source": row.source})
    if target.is_file():
        return FileResponse(open(target, "rb"), as_attachment=True, filename=target.name)
    bundle = tempfile.TemporaryFile()
    with zipfile.ZipFile(bundle, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in sorted(p for p in target.rglob("*") if p.is_file()):
            # Only the version's own files: never one a link inside it leads to elsewhere.
            if not file.name.endswith((".uploading", ".lock")) and target in file.resolve().parents:
                archive.write(file, file.relative_to(target).as_posix())
    bundle.seek(0)
    return FileResponse(bundle, as_attachment=True, filename=f"{found.name}-v{row.version}.zip")
