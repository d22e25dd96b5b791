from django.urls import path

from workers import api

urlpatterns = [
    path("worker/hello", api.HelloView.as_view(), name="api-worker-hello"),
    path("worker/goodbye", api.GoodbyeView.as_view(), name="api-worker-goodbye"),
    path("worker/checks/claim", api.CheckClaimView.as_view(), name="api-worker-check-claim"),
    path("worker/checks/<int:check_id>/complete", api.CheckCompleteView.as_view(), name="api-worker-check-complete"),
    path("worker/reads/claim", api.ReadClaimView.as_view(), name="api-worker-read-claim"),
    path("worker/reads/<int:read_id>/complete", api.ReadCompleteView.as_view(), name="api-worker-read-complete"),
    path("worker/claim", api.JobClaimView.as_view(), name="api-worker-claim"),
    path("worker/resume", api.JobResumeView.as_view(), name="api-worker-resume"),
    path("worker/jobs/<int:job_id>/heartbeat", api.JobHeartbeatView.as_view(), name="api-worker-job-heartbeat"),
    path("worker/jobs/<int:job_id>/logs", api.JobLogsView.as_view(), name="api-worker-job-logs"),
    path("worker/jobs/<int:job_id>/metrics", api.JobMetricsView.as_view(), name="api-worker-job-metrics"),
    path("worker/jobs/<int:job_id>/outputs", api.JobOutputsView.as_view(), name="api-worker-job-outputs"),
    path("worker/jobs/<int:job_id>/artifacts/<path:path>", api.JobArtifactUploadView.as_view(),
         name="api-worker-job-artifact"),
    path("worker/jobs/<int:job_id>/source", api.JobSourceView.as_view(), name="api-worker-job-source"),
    path("worker/jobs/<int:job_id>/complete", api.JobCompleteView.as_view(), name="api-worker-job-complete"),
    path("workers", api.AllWorkersView.as_view(), name="api-workers"),
    path("projects/<slug:project>/workers", api.ProjectWorkersView.as_view(), name="api-project-workers"),
]
