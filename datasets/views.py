"""HTML pages of Datasets: the project's datasets with their versions, and one version's files."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Prefetch
from django.http import Http404
from django.shortcuts import render
from django.views.decorators.http import require_GET

from datasets import access
from datasets.models import DatasetVersion
from mado import access as identity

DATASET_PAGE = 25
FILE_PAGE = 100


@login_required
@require_GET
def dataset_list(request, project):
    project = identity.project_for_user(request.user, project)
    versions = DatasetVersion.objects.select_related("created_by", "job").order_by("status", "-number", "-id")
    datasets = (access.visible_in(request.user, project).select_related("created_by")
                .prefetch_related(Prefetch("versions", queryset=versions)))
    page = Paginator(datasets, DATASET_PAGE).get_page(request.GET.get("page"))
    return render(request, "datasets/dataset_list.html", {
        "project": project, "page": page, "can_write": access.can_write(request.user, project)})


@login_required
@require_GET
def version_detail(request, project, dataset, version):
    project = identity.project_for_user(request.user, project)
    dataset = access.dataset_for(request.user, project, str(dataset))
    try:
        version = access.version_for(dataset, version)
    except Http404:
        raise Http404("No such version of this dataset; open it from the Datasets page.") from None
    files = Paginator(version.entries.only("path", "sha256", "size").order_by("path"), FILE_PAGE)
    return render(request, "datasets/version_detail.html", {
        "project": project, "dataset": dataset, "version": version, "page": files.get_page(request.GET.get("page"))})
