"""HTML routes of Jobs; included at the root by mado/urls.py."""
from django.urls import path

from jobs import gpu_board, views

urlpatterns = [
    # Under Computers, but here: the board reads reservations and jobs, which computers/ may not import.
    path("settings/computers/gpus/", gpu_board.gpu_board, name="gpu-board"),
    path("projects/<slug:project>/jobs/", views.job_list, name="jobs"),
    path("projects/<slug:project>/jobs/new", views.job_create, name="job-create"),
    path("projects/<slug:project>/jobs/<int:pk>/", views.job_detail, name="job-detail"),
    path("projects/<slug:project>/jobs/<int:pk>/poll", views.job_poll, name="job-poll"),
    path("projects/<slug:project>/jobs/<int:pk>/log.txt", views.job_log_text, name="job-log-text"),
    path("projects/<slug:project>/jobs/<int:pk>/stop", views.job_stop, name="job-stop"),
    path("projects/<slug:project>/jobs/<int:pk>/lost", views.job_mark_lost, name="job-mark-lost"),
    path("projects/<slug:project>/jobs/<int:pk>/artifacts/<int:artifact_id>", views.artifact_download,
         name="job-artifact"),
]
