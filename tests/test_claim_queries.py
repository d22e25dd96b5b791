"""The claim's cost in queries (issue 19): a worker's claim over HTTP, with its job token, its audit row
and the job's "claimed" event, takes a fixed number of queries, however many jobs wait ahead of it."""
from __future__ import annotations

import pytest

from jobs import services
from jobs.models import GpuReservation, Job, JobEvent
from mado.models import AuditEvent, JobToken
from mado.services import Actor
from tests.conftest import bearer
from tests.job_fixtures import gpu_computer, job_request
from tracking.models import Run

# The token; BEGIN and COMMIT; the worker, read and locked at once; the job with its computer (SKIP
# LOCKED), its held jobs, its Run and whether it has inputs; one write: the claim if its computer's slots
# and GPUs are still free, with the reservation, the job token, the event, the audit row and the count.
CLAIM_QUERIES = 6


def _queue(world, target, count: int, gpu: str):
    Job.objects.bulk_create([Job(project=world.project, created_by=world.member, target=target, runtime="python",
                                 command=["python", "x.py"], gpu_ids=[gpu]) for _ in range(count)])


@pytest.fixture
def quiet_sweep(monkeypatch):
    """The once-a-second requeue sweep (services.requeue_unstarted) rides on claims; it is not one."""
    monkeypatch.setattr(services, "_last_requeue", float("inf"))


@pytest.mark.parametrize("waiting_ahead", [1, 40])
@pytest.mark.django_db(transaction=True)  # committed as in production, so the count is production's
def test_a_claim_over_http_costs_a_fixed_number_of_queries(world, job_worker, quiet_sweep, waiting_ahead,
                                                           django_assert_max_num_queries):
    target = gpu_computer(world.global_admin)
    _queue(world, target, 1 + waiting_ahead, gpu="0")  # the first holds GPU 0; the others wait for it
    _queue(world, target, 1, gpu="1")
    first = job_worker.claim()
    with django_assert_max_num_queries(CLAIM_QUERIES):
        item = job_worker.claim(active=[first["id"]])
    # Past every job waiting for GPU 0, the one on GPU 1, with everything a claim writes.
    assert item["gpu_ids"] == ["1"] and item["job_token"].startswith("mado_mtj_")
    job = Job.objects.get(pk=item["id"])
    assert job.status == "claimed" and str(job.lease_id) == item["lease_id"]
    assert list(GpuReservation.objects.filter(job=job).values_list("gpu_id", flat=True)) == ["1"]
    assert JobToken.objects.filter(job_id=job.pk, lease_id=job.lease_id, revoked_at__isnull=True).count() == 1
    assert JobEvent.objects.filter(job=job, kind="claimed").count() == 1
    assert AuditEvent.objects.filter(action="job.claim", object_id=str(job.pk)).count() == 1
    assert job.worker.active_jobs == 2
    # The next claim finds nothing free: no job is handed out twice, no GPU twice.
    assert job_worker.claim(active=[first["id"], item["id"]]) is None
    # The token works: the job's own code may record with it.
    assert bearer(item["job_token"]).get("/api/projects/lab/jobs").status_code != 401


@pytest.mark.django_db(transaction=True)
def test_a_job_with_its_run_is_handed_out_with_that_run_in_the_same_queries(world, job_worker, quiet_sweep,
                                                                            django_assert_max_num_queries):
    # Created as people create jobs, so tracking gives it its Run (jobs.hooks); the claim reads it along.
    job = services.create_job(Actor(world.member), world.project, job_request(gpu_computer(world.global_admin)))
    run = Run.objects.get(job=job)
    with django_assert_max_num_queries(CLAIM_QUERIES):
        item = job_worker.claim()
    assert item["id"] == job.pk and item["input_datasets"] == []
    assert (item["run_id"], item["experiment_id"]) == (run.run_id, str(run.experiment_id))
