"""/metrics after a claim storm (issue 21): every figure Prometheus reads equals what the database holds,
counted here from the rows themselves; scrapes taken during the storm never see a claim counter go back
or a computer's GPUs held twice."""
from __future__ import annotations

import random
from collections import Counter, defaultdict
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import services as job_services
from jobs.models import Artifact, GpuReservation, Job, JobEvent, LogChunk
from mado.models import ApiToken
from mado.services import Actor
from monitoring.collector import BUCKETS
from notifications import services as notification_services
from notifications.models import Delivery
from tests.conftest import bearer
from tests.job_fixtures import gpu_computer
from tests.monitoring.conftest import scrape
from tests.storm import run_storm
from workers.models import ONLINE_WINDOW, Worker

WORKERS = 6
JOBS = 150
GPUS = ("0", "1", "2", "3")
# How long before the storm each job was created: the dispatch latencies spread over the buckets.
AGES = (0, 2, 20, 200, 2000, 20000, 200000)


def _storm_world(world):
    targets = [gpu_computer(world.global_admin, f"metrics-gpu-{i}", gpus=GPUS, concurrency=4) for i in range(3)]
    token = ApiToken.objects.get(prefix=world.worker_token[:12])
    workers = [Worker.objects.create(token=token, project=world.project, worker_id=f"storm-{i}",
                                     hostname=f"gpu-host-{i % 3}") for i in range(WORKERS)]
    now = timezone.now()
    rng = random.Random(21)
    Job.objects.bulk_create([
        Job(project=world.project, created_by=world.member, target=targets[i % len(targets)], runtime="python",
            command=["python", "train.py"], gpu_ids=[rng.choice(GPUS)],
            created_at=now - timedelta(seconds=rng.choice(AGES)))
        for i in range(JOBS)
    ])
    return targets, workers


def _watch_scrapes(client, seen: list):
    """Runs over and over in the storm's watcher thread: claims only grow, no GPU is held twice."""

    def violations() -> list[str]:
        figures = scrape(client)
        claims = sum(figures.series("mado_job_claims_total").values())
        held = figures.series("mado_gpu_reservations")
        problems = [f"claims went from {seen[-1]} to {claims}"] if seen and claims < seen[-1] else []
        problems += [f"{labels}: {n} GPUs held of {len(GPUS)}" for labels, n in held.items() if n > len(GPUS)]
        seen.append(claims)
        return problems

    return violations


def _after_the_storm(world, targets, workers):
    """What a lab has beside finished jobs: held and running jobs, a queue, logs, artifacts, offline and
    stopped workers, notification deliveries in each state."""
    first = targets[0]
    for i in range(6):
        Job.objects.create(project=world.project, created_by=world.member, target=first, runtime="python",
                           command=["python", "train.py"], gpu_ids=["0", "1"] if i % 2 == 0 else ["2", "3"])
    held = []
    for _ in range(2):  # all four GPUs: four jobs wait
        held.append(job_services.claim_job(workers[0], [job.pk for job in held])[0])
    job_services.heartbeat(workers[0], held[0].pk, lease_id=held[0].lease_id, status="running")
    job_services.append_logs(held[0], [{"stream": "stdout", "offset": 0, "data": "epoch 1/3 loss=0.42\n"},
                                       {"stream": "stdout", "offset": 20, "data": "エポック 2/3\n"},
                                       {"stream": "stderr", "offset": 0, "data": "warning: ünïcode\n"}])
    job_services.append_logs(held[0], [{"stream": "app", "offset": 0, "data": "from the job's code\n"}],
                             streams=("app",))
    finished = Job.objects.filter(status="finished").order_by("pk")[:2]
    Artifact.objects.create(job=finished[0], path="model.pt", size=5_000_000, sha256="0" * 64,
                            received_bytes=5_000_000, complete=True)
    Artifact.objects.create(job=finished[1], path="big.ckpt", size=80_000_000, sha256="1" * 64,
                            received_bytes=33_554_432)

    now = timezone.now()
    Worker.objects.filter(pk__in=[w.pk for w in workers]).update(last_seen_at=now)
    Worker.objects.filter(pk=workers[1].pk).update(last_seen_at=now - timedelta(minutes=10))
    Worker.objects.filter(pk=workers[2].pk).update(stopped_at=now)
    Worker.objects.filter(pk=workers[3].pk).update(project=world.other_project)

    email, _ = notification_services.create_rule(
        Actor(world.project_admin), world.project, name="mail", events=["job.failed"], channel="email",
        email_to="lab@example.org")
    hook, _ = notification_services.create_rule(
        Actor(world.project_admin), world.project, name="hook", events=["job.finished"], channel="webhook",
        webhook_url="https://hooks.example.org/mado")
    for i, (rule, status) in enumerate([(email, "delivered"), (email, "delivered"), (email, "failed"),
                                        (hook, "pending"), (hook, "delivered"), (hook, "failed"), (hook, "failed")]):
        Delivery.objects.create(rule=rule, event="job.failed", source=f"test:{i}", payload={}, status=status)


def _histogram_from_rows(end: str) -> dict:
    """{(series name, labels): value} of one latency histogram, counted from the jobs' timestamps."""
    per_computer = defaultdict(list)
    for computer, created, stamp in Job.objects.values_list("target__name", "created_at", end):
        if stamp is not None:
            per_computer[computer].append((stamp - created).total_seconds())
    expected = {}
    for computer, seconds in per_computer.items():
        for bound in BUCKETS:
            expected[("bucket", computer, float(bound))] = sum(s <= bound for s in seconds)
        expected[("bucket", computer, float("inf"))] = len(seconds)
        expected[("count", computer)] = len(seconds)
        expected[("sum", computer)] = pytest.approx(sum(seconds), rel=1e-9, abs=1e-3)
    return expected


def _histogram_from_scrape(figures, name: str) -> dict:
    found = {}
    for labels, value in figures.series(f"{name}_bucket").items():
        labels = dict(labels)
        found[("bucket", labels["computer"], float(labels["le"]))] = value
    for part in ("count", "sum"):
        for labels, value in figures.series(f"{name}_{part}").items():
            found[(part, dict(labels)["computer"])] = value
    return found


@pytest.mark.django_db(transaction=True)
def test_after_a_claim_storm_every_figure_of_the_scrape_matches_the_database(world, metrics_token):
    targets, workers = _storm_world(world)
    seen_claims: list[float] = []
    problems, errors, seconds, checks = run_storm(workers, _watch_scrapes(bearer(metrics_token), seen_claims))
    assert not errors, errors[:3]
    assert problems == []
    assert checks > 0 and seen_claims[-1] >= seen_claims[0]
    print(f"storm with scrapes: {JOBS} jobs in {seconds:.1f} s, {checks} scrapes meanwhile")
    _after_the_storm(world, targets, workers)

    before = timezone.now()
    figures = scrape(bearer(metrics_token))
    after = timezone.now()

    # Jobs by status and computer: every pair, nothing more.
    jobs = Counter(Job.objects.values_list("status", "target__name"))
    assert figures.series("mado_jobs") == {(("computer", c), ("status", s)): n for (s, c), n in jobs.items()}
    assert jobs[("finished", targets[1].name)] > 0 and jobs[("queued", targets[0].name)] == 4

    # Claims: one per claim event, so the storm's 300 plus the two held jobs.
    claimed = Counter(JobEvent.objects.filter(kind="claimed").values_list("job__target__name", flat=True))
    assert figures.series("mado_job_claims_total") == {(("computer", c),): n for c, n in claimed.items()}
    assert sum(claimed.values()) == JOBS + 2
    assert figures.families["mado_job_claims"].type == "counter"

    # The two latency histograms, bucket by bucket, against the jobs' own timestamps.
    dispatch = _histogram_from_rows("claimed_at")
    assert _histogram_from_scrape(figures, "mado_job_dispatch_latency_seconds") == dispatch
    assert sum(v for k, v in dispatch.items() if k[0] == "count") == JOBS + 2
    assert len({v for k, v in dispatch.items() if k[0] == "bucket" and k[1] == targets[0].name}) > 3  # spread
    queue_wait = _histogram_from_rows("started_at")
    assert _histogram_from_scrape(figures, "mado_job_queue_wait_seconds") == queue_wait
    assert queue_wait[("count", targets[0].name)] == 1  # only the job that said it runs has started

    # The oldest queued job's age, as of the scrape.
    oldest = Job.objects.filter(status="queued").order_by("created_at").first()
    age = figures.value("mado_queue_oldest_job_age_seconds", computer=targets[0].name)
    assert (before - oldest.created_at).total_seconds() <= age <= (after - oldest.created_at).total_seconds()

    # GPU reservations held: the two claimed jobs' two GPUs each.
    held = Counter(GpuReservation.objects.values_list("target__name", flat=True))
    assert figures.series("mado_gpu_reservations") == {(("computer", c),): n for c, n in held.items()}
    assert held == {targets[0].name: 4}

    # Workers: online by project, and each worker with its presence.
    online = Counter()
    for worker in Worker.objects.select_related("project"):
        is_online = worker.stopped_at is None and worker.last_seen_at >= before - ONLINE_WINDOW
        online[worker.project.slug] += is_online
        labels = {"project": worker.project.slug, "worker": worker.worker_id, "host": worker.hostname,
                  "id": str(worker.pk)}
        assert figures.value("mado_worker_online", **labels) == int(is_online)
        assert figures.value("mado_worker_stopped", **labels) == int(worker.stopped_at is not None)
        assert figures.value("mado_worker_last_seen_timestamp_seconds", **labels) == pytest.approx(
            worker.last_seen_at.timestamp())
    assert figures.series("mado_workers_online") == {(("project", p),): n for p, n in online.items()}
    assert online == {"lab": WORKERS - 3, "other": 1}

    # Bytes received: logs in UTF-8 per stream, artifacts as far as they arrived.
    log_bytes = Counter()
    for stream, data in LogChunk.objects.values_list("stream", "data"):
        log_bytes[stream] += len(data.encode())
    assert figures.series("mado_log_bytes_received_total") == {(("stream", s),): n for s, n in log_bytes.items()}
    assert log_bytes["stdout"] == len("epoch 1/3 loss=0.42\nエポック 2/3\n".encode())
    assert figures.value("mado_artifact_bytes_received_total") == sum(
        Artifact.objects.values_list("received_bytes", flat=True)) == 5_000_000 + 33_554_432

    # Notification deliveries by result and channel.
    deliveries = Counter(Delivery.objects.values_list("status", "rule__channel"))
    assert figures.series("mado_notification_deliveries") == {
        (("channel", c), ("result", r)): n for (r, c), n in deliveries.items()}
    assert deliveries[("failed", "webhook")] == 2
