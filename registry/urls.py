"""/mlflow/…: MLflow's model registry REST API 2.0 paths and MLflow 3's logged models. Included by
mado/urls.py ahead of tracking.urls, whose catch-all answers every other /mlflow/ path with ENDPOINT_NOT_FOUND."""
from django.urls import path

from registry import logged_models_api as logged
from registry import mlflow_api as api

P = "api/2.0/mlflow/"
M = P + "registered-models/"
V = P + "model-versions/"
L = P + "logged-models"

urlpatterns = [
    path(M + "create", api.models_create),
    path(M + "get", api.models_get),
    path(M + "rename", api.models_rename),
    path(M + "update", api.models_update),
    path(M + "delete", api.models_delete),
    path(M + "search", api.models_search),
    path(M + "get-latest-versions", api.models_latest_versions),
    path(M + "set-tag", api.models_set_tag),
    path(M + "delete-tag", api.models_delete_tag),
    path(M + "alias", api.models_alias),
    path(V + "create", api.versions_create),
    path(V + "get", api.versions_get),
    path(V + "update", api.versions_update),
    path(V + "delete", api.versions_delete),
    path(V + "search", api.versions_search),
    path(V + "transition-stage", api.versions_transition_stage),
    path(V + "get-download-uri", api.versions_download_uri),
    path(V + "set-tag", api.versions_set_tag),
    path(V + "delete-tag", api.versions_delete_tag),
    path(L, logged.create),
    path(L + "/search", logged.search),
    path(L + "/<str:model_id>", logged.one),
    path(L + "/<str:model_id>/params", logged.params),
    path(L + "/<str:model_id>/tags", logged.tags),
    path(L + "/<str:model_id>/tags/<path:tag_key>", logged.tag),
    path(L + "/<str:model_id>/artifacts/directories", logged.artifact_directories),
    path(P + "runs/outputs", logged.runs_outputs),
]
