"""The cluster parts of the Jobs pages: the New job form's Cluster mode and Cluster size with the
peer's explanation that resources are per replica, the job page's replica selector and per-replica
logs, and why a queued cluster job waits."""
from __future__ import annotations

import re

from django.urls import reverse

from jobs.models import Job, LogChunk
from tests.cluster.conftest import create, created_then_shrunk, session

HTMX = {"HTTP_HX_REQUEST": "true"}


def page_of(world, job_id: int, query: str = "") -> str:
    response = session(world.member).get(reverse("job-detail", args=["lab", job_id]) + query)
    assert response.status_code == 200
    return response.content.decode()


def test_the_form_has_cluster_mode_size_and_says_resources_are_per_replica(world, lab_nodes):
    page = session(world.member).get(reverse("job-create", args=["lab"])).content.decode()
    assert "Cluster mode" in page and "Cluster size" in page and "GPUs per replica" in page
    assert "are for each replica, not for the whole Job" in page and "times the cluster size (N)" in page
    assert '<option value="multi-node">Multi node</option>' in page and ">lab-nodes</option>" in page


def test_a_multi_node_job_is_created_from_the_form_without_a_computer(world, lab_nodes):
    response = session(world.member).post(reverse("job-create", args=["lab"]), {
        "computer": "", "runtime": "python", "command": "python train.py", "parameters": "{}",
        "cluster_mode": "multi-node", "cluster_size": "3", "gpus_per_replica": "1", "compute_group": lab_nodes.pk})
    assert response.status_code == 302, response.content.decode()[-2000:]
    job = Job.objects.get()
    assert (job.cluster_size, job.cluster_mode, job.gpus_per_replica, job.compute_group) == (3, "multi-node", 1,
                                                                                              lab_nodes)


def test_the_form_shows_the_services_refusals_under_the_cluster_fields(world, gpu_box):
    response = session(world.member).post(reverse("job-create", args=["lab"]), {
        "computer": "", "runtime": "python", "command": "python train.py", "cluster_mode": "multi-node",
        "cluster_size": "2"})
    page = response.content.decode()
    assert response.status_code == 200 and "runs on a compute group: choose one" in page
    response = session(world.member).post(reverse("job-create", args=["lab"]), {
        "computer": gpu_box.pk, "runtime": "python", "command": "python train.py", "cluster_size": "65"})
    assert "Ensure this value is less than or equal to 64" in response.content.decode()


def test_the_form_refuses_a_cluster_job_that_could_never_start_saying_why(world, gpu_box):
    """Issue 15 item 7: the New job form shows the service's reason under Cluster size; nothing is created."""
    response = session(world.member).post(reverse("job-create", args=["lab"]), {
        "computer": gpu_box.pk, "runtime": "python", "command": "python train.py", "parameters": "{}",
        "cluster_mode": "single-node", "cluster_size": "3", "gpus_per_replica": "2"})
    page = response.content.decode()
    assert response.status_code == 200 and not Job.objects.exists()
    reason = ("Needs 3 replicas × 2 GPUs; gpu-host-1 can hold at most 2 (by GPUs and concurrent jobs), so it cannot "
              "start. Ask for fewer replicas or GPUs, or choose another computer.")
    # Under the field it is about, with what was typed kept.
    field = re.search(r'<div class="field invalid" data-field="cluster_size">(.*?)</div>\s*</div>', page, re.DOTALL)
    assert field and reason in field.group(1) and 'value="3"' in field.group(1), page


def test_the_job_page_shows_why_a_cluster_job_waits(world, gpu_box):
    job = created_then_shrunk(world, gpu_box, gpus=("0", "1", "2", "3"), cluster_size=3, gpus_per_replica=2)
    page = page_of(world, job["id"])
    assert "Why it waits" in page and "Needs 3 replicas × 2 GPUs; gpu-host-1 can hold at most 2" in page
    assert "3 replicas · Single node" in page and "2 GPUs per replica" in page


def test_the_replica_selector_shows_one_replicas_logs(world, gpu_box, job_worker):
    create(world, computer=gpu_box.pk, cluster_size=2, gpus_per_replica=1)
    item = job_worker.claim()
    job_worker.leased(item, "logs", chunks=[
        {"replica": "main1", "stream": "stdout", "offset": 0, "data": "main says hi\n"},
        {"replica": "sub1", "stream": "stdout", "offset": 0, "data": "sub says hi\n"}])
    first = page_of(world, item["id"])
    assert "main says hi" in first and "sub says hi" not in first
    assert 'href="?replica=sub1"' in first and "GPU 0" in first and "GPU 1" in first
    sub = page_of(world, item["id"], "?replica=sub1")
    assert "sub says hi" in sub and "main says hi" not in sub and "replica=sub1" in sub
    poll = session(world.member).get(reverse("job-poll", args=["lab", item["id"]]) + "?after=0&replica=sub1", **HTMX)
    assert "sub says hi" in poll.content.decode() and "main says hi" not in poll.content.decode()
    text = session(world.member).get(reverse("job-log-text", args=["lab", item["id"]]) + "?replica=sub1")
    assert b"".join(text.streaming_content) == b"sub says hi\n"
    missing = session(world.member).get(reverse("job-detail", args=["lab", item["id"]]) + "?replica=sub5")
    assert missing.status_code == 404
    assert LogChunk.objects.count() == 2
