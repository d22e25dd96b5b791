"""Included under /api/ by mado/urls.py, ahead of mado.api.urls and its catch-all."""
from django.urls import path

from datasets import api

BASE = "projects/<slug:project>/datasets"
VERSION = BASE + "/<str:dataset>/versions/<int:version>"

urlpatterns = [
    path(BASE, api.DatasetListView.as_view(), name="api-datasets"),
    path(BASE + "/<str:dataset>", api.DatasetView.as_view(), name="api-dataset"),
    path(BASE + "/<str:dataset>/versions", api.VersionListView.as_view(), name="api-dataset-versions"),
    path(VERSION, api.VersionView.as_view(), name="api-dataset-version"),
    path(VERSION + "/manifest", api.VersionManifestView.as_view(), name="api-dataset-version-manifest"),
    path(VERSION + "/complete", api.VersionCompleteView.as_view(), name="api-dataset-version-complete"),
    path(VERSION + "/archive", api.VersionArchiveView.as_view(), name="api-dataset-version-archive"),
    path(VERSION + "/files/<path:path>", api.VersionFileView.as_view(), name="api-dataset-file"),
]
