"""mado_tracking: record metrics, parameters, tags and artifacts to a Run of Mado Compute.

It speaks MLflow's REST API 2.0 (the server's `<server>/mlflow`), so it also records to any MLflow tracking
server. Standard library and `requests` only. See docs/sdk.md.

    import mado_tracking
    with mado_tracking.start_run() as run:        # inside a job: the Job's Run
        mado_tracking.log_params({"lr": 0.001})
        for step in range(100):
            mado_tracking.log_metric("loss", 1 / (step + 1), step=step)   # buffered, sent in batches
        mado_tracking.log_artifact("model.pt")
"""
from ._http import TrackingError
from ._run import (
    ActiveRun,
    active_run,
    end_run,
    flush,
    get_metric_history,
    get_run,
    log_artifact,
    log_artifacts,
    log_metric,
    log_metrics,
    log_param,
    log_params,
    set_tag,
    set_tags,
    start_run,
)

__all__ = [
    "ActiveRun", "TrackingError", "active_run", "end_run", "flush", "get_metric_history", "get_run",
    "log_artifact", "log_artifacts", "log_metric", "log_metrics", "log_param", "log_params", "set_tag",
    "set_tags", "start_run",
]
__version__ = "0.1.0"
