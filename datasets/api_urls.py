"""Included under /api/ by mado/urls.py, ahead of mado.api.urls and its catch-all."""
from django.urls import path

from datasets import api

BASE = "projects/<slug:project>/datasets"
VERSION = BASE + "/<str:dataset>/versions/<int:version>"
WORKER_INPUT = "worker/jobs/<int:job_id>/datasets/<int:version>"

urlpatterns = [
    path(BASE, api.DatasetListView.as_view(), name="api-datasets"),
    path(BASE + "/<str:dataset>", api.DatasetView.as_view(), name="api-dataset"),
    path(BASE + "/<str:dataset>/versions", api.VersionListView.as_view(), name="api-dataset-versions"),
    path(VERSION, api.VersionView.as_view(), name="api-dataset-version"),
    path(VERSION + "/manifest", api.VersionManifestView.as_view(), name="api-dataset-version-manifest"),
    path(VERSION + "/complete", api.VersionCompleteView.as_view(), name="api-dataset-version-complete"),
    path(VERSION + "/files/<path:path>", api.VersionFileView.as_view(), name="api-dataset-file"),
    # Relay transfer: the worker holding the job reads its inputs under the job's lease.
    path(WORKER_INPUT + "/manifest", api.WorkerInputManifestView.as_view(), name="api-worker-job-dataset-manifest"),
    path(WORKER_INPUT + "/files/<path:path>", api.WorkerInputFileView.as_view(), name="api-worker-job-dataset-file"),
    path("worker/jobs/<int:job_id>/dataset-cache", api.WorkerCacheUsageView.as_view(),
         name="api-worker-job-dataset-cache"),
]
