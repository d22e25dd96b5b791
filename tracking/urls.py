"""/mlflow/…: MLflow's REST API 2.0 paths (the client appends them to MLFLOW_TRACKING_URI). Logged models
(logged-models/…, runs/outputs) are the registry app's (registry.urls, included ahead of these)."""
from django.urls import path, re_path

from tracking import artifacts
from tracking import mlflow_api as api

P = "api/2.0/mlflow/"

urlpatterns = [
    path(P + "experiments/create", api.experiments_create),
    path(P + "experiments/get", api.experiments_get),
    path(P + "experiments/get-by-name", api.experiments_get_by_name),
    path(P + "experiments/search", api.experiments_search),
    path(P + "experiments/update", api.experiments_update),
    path(P + "experiments/delete", api.experiments_delete),
    path(P + "experiments/restore", api.experiments_restore),
    path(P + "runs/create", api.runs_create),
    path(P + "runs/update", api.runs_update),
    path(P + "runs/delete", api.runs_delete),
    path(P + "runs/restore", api.runs_restore),
    path(P + "runs/get", api.runs_get),
    path(P + "runs/search", api.runs_search),
    path(P + "runs/log-metric", api.runs_log_metric),
    path(P + "runs/log-parameter", api.runs_log_parameter),
    path(P + "runs/set-tag", api.runs_set_tag),
    path(P + "runs/delete-tag", api.runs_delete_tag),
    path(P + "runs/log-batch", api.runs_log_batch),
    path(P + "runs/log-inputs", api.runs_log_inputs),
    path(P + "metrics/get-history", api.metrics_get_history),
    path(P + "artifacts/list", artifacts.run_artifacts_list),
    path("api/2.0/mlflow-artifacts/artifacts", artifacts.artifact_list),
    path("api/2.0/mlflow-artifacts/artifacts/<path:path>", artifacts.artifact),
    re_path(r"^(?P<path>.*)$", api.not_found_view),
]
