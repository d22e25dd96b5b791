"""Every endpoint that workers call (worker/…), under /api/; included by mado/api/urls.py. Users' views
of workers are in workers/api_urls.py, of datasets in datasets/api_urls.py."""
from django.urls import path

from worker_api import datasets, logs, views

WORKER_INPUT = "worker/jobs/<int:job_id>/datasets/<int:version>"

urlpatterns = [
    path("worker/hello", views.HelloView.as_view(), name="api-worker-hello"),
    path("worker/goodbye", views.GoodbyeView.as_view(), name="api-worker-goodbye"),
    path("worker/checks/claim", views.CheckClaimView.as_view(), name="api-worker-check-claim"),
    path("worker/checks/<int:check_id>/complete", views.CheckCompleteView.as_view(), name="api-worker-check-complete"),
    path("worker/reads/claim", views.ReadClaimView.as_view(), name="api-worker-read-claim"),
    path("worker/reads/<int:read_id>/complete", views.ReadCompleteView.as_view(), name="api-worker-read-complete"),
    path("worker/computers/<int:computer_id>/gpus", views.GpuReadingsView.as_view(), name="api-worker-computer-gpus"),
    path("worker/claim", views.JobClaimView.as_view(), name="api-worker-claim"),
    path("worker/resume", views.JobResumeView.as_view(), name="api-worker-resume"),
    path("worker/jobs/<int:job_id>/heartbeat", views.JobHeartbeatView.as_view(), name="api-worker-job-heartbeat"),
    path("worker/jobs/<int:job_id>/release", views.JobReleaseView.as_view(), name="api-worker-job-release"),
    path("worker/jobs/<int:job_id>/logs", views.JobLogsView.as_view(), name="api-worker-job-logs"),
    path("worker/jobs/<int:job_id>/metrics", views.JobMetricsView.as_view(), name="api-worker-job-metrics"),
    path("worker/jobs/<int:job_id>/outputs", views.JobOutputsView.as_view(), name="api-worker-job-outputs"),
    path("worker/jobs/<int:job_id>/log-frames", logs.JobLogFramesView.as_view(), name="api-worker-job-log-frames"),
    path("worker/jobs/<int:job_id>/artifacts-batch", views.JobArtifactBatchView.as_view(),
         name="api-worker-job-artifact-batch"),
    path("worker/jobs/<int:job_id>/artifacts/<path:path>", views.JobArtifactUploadView.as_view(),
         name="api-worker-job-artifact"),
    path("worker/jobs/<int:job_id>/source", views.JobSourceView.as_view(), name="api-worker-job-source"),
    path("worker/jobs/<int:job_id>/complete", views.JobCompleteView.as_view(), name="api-worker-job-complete"),
    # Relay transfer: the worker holding the job reads its inputs under the job's lease.
    path(WORKER_INPUT + "/manifest", datasets.WorkerInputManifestView.as_view(),
         name="api-worker-job-dataset-manifest"),
    path(WORKER_INPUT + "/files/<path:path>", datasets.WorkerInputFileView.as_view(),
         name="api-worker-job-dataset-file"),
    path(WORKER_INPUT + "/archive", datasets.WorkerInputArchiveView.as_view(), name="api-worker-job-dataset-archive"),
    path("worker/jobs/<int:job_id>/dataset-cache", datasets.WorkerCacheUsageView.as_view(),
         name="api-worker-job-dataset-cache"),
]
