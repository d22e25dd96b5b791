from django.urls import path

from jobs import api

urlpatterns = [
    path("projects/<slug:project>/jobs", api.ProjectJobsView.as_view(), name="api-project-jobs"),
    path("jobs/<int:pk>", api.JobView.as_view(), name="api-job"),
    path("jobs/<int:pk>/stop", api.JobStopView.as_view(), name="api-job-stop"),
    path("jobs/<int:pk>/lost", api.JobLostView.as_view(), name="api-job-lost"),
    path("jobs/<int:pk>/logs", api.JobLogsView.as_view(), name="api-job-logs"),
    path("jobs/<int:pk>/metrics", api.JobMetricsView.as_view(), name="api-job-metrics"),
    path("jobs/<int:pk>/artifacts", api.JobArtifactsView.as_view(), name="api-job-artifacts"),
    path("jobs/<int:pk>/artifacts/<path:path>", api.JobArtifactDownloadView.as_view(), name="api-job-artifact"),
    path("projects/<slug:project>/sources", api.SourceUploadView.as_view(), name="api-project-sources"),
]
