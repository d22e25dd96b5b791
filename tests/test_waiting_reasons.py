"""Why is my Job waiting? (issue 13, jobs.waiting): a queued Job on an SSH or Local computer says in
words what holds it back — on its page next to the status, in its row of the Jobs list and in the API
job body — checked in this order: the computer is disabled; no online worker of the Job's Project
serves it; the workers that do leave it out of their target IDs; its concurrent-job limit is reached;
its GPUs are held by other Jobs. Otherwise nothing is said (a worker claims it shortly). Rendered by
Django's test client; one case per reason, the query count of a page of reasons, and Japanese."""
from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone, translation

from computers.models import ComputeTarget
from jobs import cluster, services, waiting
from jobs.models import Job
from mado.services import Actor
from tests.conftest import WORKER_SCOPES, bearer
from tests.job_fixtures import JobWorker, gpu_computer
from workers.models import Worker

pytestmark = pytest.mark.django_db

DISABLED = "gpu-host-1 is disabled: it starts once its owner enables it again."


@pytest.fixture(autouse=True)
def in_english():
    """Sentences made outside a request speak English, whatever language the last request left active."""
    with translation.override("en"):
        yield


def make_job(world, target, user=None, **extra) -> Job:
    data = {"computer": target.pk, "runtime": "python", "command": ["python", "train.py"], **extra}
    return services.create_job(Actor(user or world.member), world.project, data)


def claimed_job(world, target, worker: JobWorker, **extra) -> Job:
    job = make_job(world, target, **extra)
    item = worker.claim()
    assert item is not None and item["id"] == job.pk
    assert worker.heartbeat(item, "running").status_code == 200  # acknowledged: the next claim takes another
    return job


def page_of(client, user, job: Job, **headers) -> str:
    client.force_login(user)
    response = client.get(f"/projects/lab/jobs/{job.pk}/", **headers)
    assert response.status_code == 200
    return response.content.decode()


def shown_reason(page: str) -> str | None:
    """The sentence in #waiting-reason of a job page, without its label; None when there is none."""
    match = re.search(r'<p class="waiting-reason" id="waiting-reason"><strong>[^<]*</strong> (.*?)</p>', page, re.DOTALL)
    return match.group(1).replace("&#x27;", "'") if match else None


def list_reason(client, user, job: Job) -> str | None:
    client.force_login(user)
    page = client.get("/projects/lab/jobs/").content.decode()
    row = re.search(rf'<tr data-job="{job.pk}">(.*?)</tr>', page, re.DOTALL)
    assert row, page
    match = re.search(r'<small class="waiting-reason muted">(.*?)</small>', row.group(1), re.DOTALL)
    return match.group(1).replace("&#x27;", "'") if match else None


def api_reason(world, job: Job):
    body = bearer(world.member_token(world.member)).get(f"/api/jobs/{job.pk}").json()
    return body["waiting_reason"]


def no_worker_sentence(target) -> str:
    return (f"No online worker of this Project runs Jobs on {target.name}: start a worker with a token of this "
            f"Project's service account, with --target-ids including {target.pk} (see Worker settings on the "
            "computer's page).")


# Each reason ------------------------------------------------------------------------------------

def test_a_job_on_a_disabled_computer_says_it_starts_once_the_owner_enables_it(world, client, gpu_box, job_worker):
    job = make_job(world, gpu_box)
    assert shown_reason(page_of(client, world.member, job)) is None  # served and free: nothing holds it
    ComputeTarget.objects.filter(pk=gpu_box.pk).update(enabled=False)
    assert shown_reason(page_of(client, world.member, job)) == DISABLED
    assert list_reason(client, world.member, job) == DISABLED
    assert api_reason(world, job) == DISABLED


def test_a_job_no_online_worker_serves_says_how_to_start_one_with_the_computers_id(world, client, gpu_box):
    job = make_job(world, gpu_box)
    expected = no_worker_sentence(gpu_box)
    assert shown_reason(page_of(client, world.member, job)) == expected
    assert list_reason(client, world.member, job) == expected
    assert api_reason(world, job) == expected


def test_workers_that_are_offline_of_another_project_or_without_jobs_do_not_count(world, client, gpu_box):
    job = make_job(world, gpu_box)
    offline = JobWorker(world.worker_token, "gone-worker")
    assert offline.hello().status_code == 200
    Worker.objects.filter(worker_id="gone-worker").update(last_seen_at=timezone.now() - timedelta(minutes=5))
    checks_only = JobWorker(world.worker_token, "checks-only", capabilities=("checks", "reads"))
    assert checks_only.hello().status_code == 200
    from mado import services as identity_services
    from mado.choices import Role, TokenKind

    other = identity_services.create_service_account(Actor(world.global_admin), world.other_project,
                                                     name="other-worker", role=Role.ADMIN)
    other_token = world.token(other.user, WORKER_SCOPES, project=world.other_project, kind=TokenKind.SERVICE)
    assert JobWorker(other_token, "other-project-worker").hello().status_code == 200
    assert waiting.reason(job) == no_worker_sentence(gpu_box)

    assert JobWorker(world.worker_token, "lab-worker-1").hello().status_code == 200
    assert waiting.reason(job) is None


def test_a_private_computer_no_worker_may_serve_says_its_owner_must_create_the_service_account(world, client):
    """The global admin's service account may not run Jobs on alice's Private computer."""
    box = gpu_computer(world.project_admin, "alices-box", visibility="private")
    job = make_job(world, box, user=world.project_admin)
    assert JobWorker(world.worker_token).hello().status_code == 200
    expected = (f"No online worker of this Project runs Jobs on alices-box: start a worker with a token of a "
                f"service account of this Project that the computer's owner created, with --target-ids including "
                f"{box.pk} (see Worker settings on the computer's page).")
    assert shown_reason(page_of(client, world.project_admin, job)) == expected

    from mado.choices import TokenKind

    alices_token = world.token(world.alices_account.user, WORKER_SCOPES, kind=TokenKind.SERVICE)
    assert JobWorker(alices_token, "alices-worker").hello().status_code == 200
    assert shown_reason(page_of(client, world.project_admin, job)) is None


def test_workers_whose_target_ids_leave_the_computer_out_are_named(world, client, gpu_box):
    other = gpu_computer(world.global_admin, "gpu-host-2")
    job = make_job(world, gpu_box)
    assert JobWorker(world.worker_token, "lab-worker-1", target_ids=[other.pk]).hello().status_code == 200
    one = (f"Worker lab-worker-1 is online, but its target IDs leave out gpu-host-1: add {gpu_box.pk} to its "
           "--target-ids (MMT_WORKER_TARGET_IDS), or start a worker for it.")
    assert shown_reason(page_of(client, world.member, job)) == one
    assert list_reason(client, world.member, job) == one

    assert JobWorker(world.worker_token, "lab-worker-2", target_ids=[other.pk]).hello().status_code == 200
    two = (f"Workers lab-worker-1, lab-worker-2 are online, but their target IDs leave out gpu-host-1: add "
           f"{gpu_box.pk} to the --target-ids (MMT_WORKER_TARGET_IDS) of one of them, or start a worker for it.")
    assert shown_reason(page_of(client, world.member, job)) == two

    # One worker that includes it is enough.
    assert JobWorker(world.worker_token, "lab-worker-3", target_ids=[other.pk, gpu_box.pk]).hello().status_code == 200
    assert shown_reason(page_of(client, world.member, job)) is None


def test_a_computer_running_its_concurrent_job_limit_says_how_many_it_runs(world, client, job_worker):
    box = gpu_computer(world.global_admin, concurrency=2)
    claimed_job(world, box, job_worker)
    waiting_job = make_job(world, box)
    assert shown_reason(page_of(client, world.member, waiting_job)) is None  # one slot left
    item = job_worker.claim()
    assert item["id"] == waiting_job.pk and job_worker.heartbeat(item, "running").status_code == 200
    third = make_job(world, box)
    expected = "gpu-host-1 already runs 2 of 2 concurrent jobs: it starts when one of them ends."
    assert shown_reason(page_of(client, world.member, third)) == expected
    assert list_reason(client, world.member, third) == expected

    ComputeTarget.objects.filter(pk=box.pk).update(concurrency=1)
    third = Job.objects.select_related("target").get(pk=third.pk)
    assert waiting.reason(third) == ("gpu-host-1 already runs 2 of 1 concurrent job: it starts when one ends.")


def test_a_job_whose_gpus_are_held_names_the_jobs_holding_them(world, client, gpu_box, job_worker):
    first = claimed_job(world, gpu_box, job_worker, gpu_ids=["0"])
    job = make_job(world, gpu_box, gpu_ids=["0", "2"])
    expected = f"GPU 0 held by job {first.pk}: it starts when that job ends."
    assert shown_reason(page_of(client, world.member, job)) == expected

    item = job_worker.claim()
    assert item is None  # the claim agrees: the job waits for GPU 0
    second = make_job(world, gpu_box, gpu_ids=["2"])
    item = job_worker.claim()
    assert item["id"] == second.pk and job_worker.heartbeat(item, "running").status_code == 200
    expected = f"GPU 0, 2 held by jobs {first.pk}, {second.pk}: it starts when they end."
    assert shown_reason(page_of(client, world.member, job)) == expected
    assert list_reason(client, world.member, job) == expected
    assert api_reason(world, job) == expected


def test_a_job_that_a_worker_will_claim_and_jobs_not_queued_say_nothing(world, client, gpu_box, job_worker):
    running = claimed_job(world, gpu_box, job_worker)
    queued = make_job(world, gpu_box, gpu_ids=["1"])
    page = page_of(client, world.member, queued)
    assert shown_reason(page) is None and 'id="waiting-reason"' not in page
    assert shown_reason(page_of(client, world.member, running)) is None
    assert list_reason(client, world.member, queued) is None
    assert api_reason(world, queued) is None and api_reason(world, running) is None
    ComputeTarget.objects.filter(pk=gpu_box.pk).update(enabled=False)
    assert waiting.reason(running) is None  # only queued jobs wait


def test_a_cluster_job_keeps_the_cluster_sentence(world, client, gpu_box, job_worker):
    # Created while the computer had 6 GPUs (creation refuses what can never start); it has 4 now.
    ComputeTarget.objects.filter(pk=gpu_box.pk).update(gpu_ids=["0", "1", "2", "3", "4", "5"])
    job = make_job(world, gpu_box, cluster_size=3, gpus_per_replica=2)
    ComputeTarget.objects.filter(pk=gpu_box.pk).update(gpu_ids=["0", "1", "2", "3"])
    job.target.refresh_from_db()
    sentence = cluster.queued_reason(job)
    assert sentence.startswith("Needs 3 replicas × 2 GPUs; gpu-host-1 can hold at most 2")
    assert waiting.reason(job) == sentence
    assert shown_reason(page_of(client, world.member, job)) == sentence
    assert list_reason(client, world.member, job) == sentence


def test_a_site_job_says_nothing_here(world):
    site = ComputeTarget.objects.create(owner=world.member, name="hpc-site", kind="site", enabled=False)
    job = Job.objects.create(project=world.project, created_by=world.member, target=site, status="queued")
    assert waiting.reasons([job]) == {}
    assert waiting.reason(job) is None


def test_the_job_page_updates_its_reason_while_it_polls(world, client, gpu_box):
    """The page's poll carries the head again when the reason changes (a worker came online)."""
    job = make_job(world, gpu_box)
    page = page_of(client, world.member, job)
    version = re.search(r"v=([0-9a-f]{16})", page).group(1)
    assert JobWorker(world.worker_token).hello().status_code == 200
    poll = client.get(f"/projects/lab/jobs/{job.pk}/poll?after=0&v={version}", HTTP_HX_REQUEST="true")
    body = poll.content.decode()
    assert 'id="job-head"' in body and 'id="waiting-reason"' not in body


# A page of reasons ------------------------------------------------------------------------------

def every_kind_of_wait(world, n: int, start: int = 0) -> list[Job]:
    """n groups of queued jobs, one of each reason, each group on computers of its own."""
    jobs = []
    for i in range(start, start + n):
        disabled = gpu_computer(world.global_admin, f"off-{i}")
        ComputeTarget.objects.filter(pk=disabled.pk).update(enabled=False)
        private = gpu_computer(world.project_admin, f"private-{i}", visibility="private")
        full = gpu_computer(world.global_admin, f"full-{i}", concurrency=1)
        Job.objects.create(project=world.project, created_by=world.member, target=full, status="claimed",
                           heartbeat_at=timezone.now())
        busy = gpu_computer(world.global_admin, f"busy-{i}")
        holder = Job.objects.create(project=world.project, created_by=world.member, target=busy, status="running",
                                    gpu_ids=["0"], heartbeat_at=timezone.now())
        holder.gpu_reservations.create(target=busy, gpu_id="0")
        free = gpu_computer(world.global_admin, f"free-{i}")
        for target, gpus in ((disabled, []), (private, []), (full, []), (busy, ["0"]), (free, ["1"])):
            jobs.append(Job.objects.create(project=world.project, created_by=world.project_admin, target=target,
                                           status="queued", gpu_ids=gpus))
    return jobs


def count_queries(call) -> int:
    with CaptureQueriesContext(connection) as queries:
        call()
    return len(queries.captured_queries)


def test_the_reasons_of_a_page_take_the_same_queries_for_5_jobs_as_for_40(world, client):
    assert JobWorker(world.worker_token, "lab-worker-1").hello().status_code == 200
    assert JobWorker(world.worker_token, "lab-worker-2").hello().status_code == 200
    few = every_kind_of_wait(world, 1)
    loaded = list(Job.objects.filter(pk__in=[j.pk for j in few]).select_related("target"))
    reasons = waiting.reasons(loaded)
    assert [reasons[j.pk] is None for j in few] == [False, False, False, False, True], reasons
    small = count_queries(lambda: waiting.reasons(loaded))
    assert small == 5  # online workers, computers served (one service account), slots (2), reservations

    many = every_kind_of_wait(world, 7, start=1)
    queued = list(Job.objects.filter(status="queued").select_related("target"))
    assert len(queued) == 40
    assert count_queries(lambda: waiting.reasons(queued)) == small
    reasons = waiting.reasons(queued)
    assert sum(reason is not None for reason in reasons.values()) == 32
    assert reasons[many[3].pk].startswith("GPU 0 held by job ")

    client.force_login(world.project_admin)
    listed = count_queries(lambda: client.get("/projects/lab/jobs/"))
    Job.objects.filter(pk__in=[j.pk for j in many]).delete()
    assert count_queries(lambda: client.get("/projects/lab/jobs/")) == listed


def test_the_jobs_list_asks_once_per_page(world, client, gpu_box, django_assert_max_num_queries):
    for _ in range(30):
        make_job(world, gpu_box)
    client.force_login(world.member)
    with django_assert_max_num_queries(16):  # 14 today; one a job would be 44
        page = client.get("/projects/lab/jobs/").content.decode()
    assert page.count(no_worker_sentence(gpu_box).replace("'", "&#x27;")) == 30


# Japanese ---------------------------------------------------------------------------------------

def test_the_reason_speaks_japanese_to_a_japanese_browser(world, client, gpu_box):
    job = make_job(world, gpu_box)
    ComputeTarget.objects.filter(pk=gpu_box.pk).update(enabled=False)
    page = page_of(client, world.member, job, HTTP_ACCEPT_LANGUAGE="ja")
    assert shown_reason(page) == "gpu-host-1 は無効になっています。所有者が有効に戻すと開始します。"
    assert "待っている理由" in page
    ComputeTarget.objects.filter(pk=gpu_box.pk).update(enabled=True)
    page = page_of(client, world.member, job, HTTP_ACCEPT_LANGUAGE="ja")
    assert f"--target-ids に {gpu_box.pk} を含めて" in shown_reason(page)


def test_a_list_of_job_bodies_carries_the_reasons_of_its_page(world, gpu_box):
    from jobs.serializers import job_body

    job = make_job(world, gpu_box)
    jobs = list(Job.objects.select_related("target", "project", "created_by", "worker"))
    reasons = waiting.reasons(jobs)
    body = job_body(world.member, jobs[0], is_project_admin=False, waiting_reasons=reasons)
    assert body["waiting_reason"] == no_worker_sentence(gpu_box) == job_body(world.member, job)["waiting_reason"]
