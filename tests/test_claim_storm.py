"""Claim storms on PostgreSQL: many workers claiming and completing at once never break the rules."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from jobs.models import Job, JobEvent
from mado.models import ApiToken, Membership
from tests.job_fixtures import gpu_computer
from tests.storm import run_storm
from workers.models import Worker

WORKERS = 16
JOBS = 200  # 16 workers racing for 16 GPUs: contention, not volume (bench/claim_throughput.py measures volume)


def _world_for_storm(world):
    targets = [gpu_computer(world.global_admin, f"storm-{i}", gpus=("0", "1", "2", "3"), concurrency=4)
               for i in range(4)]
    token = ApiToken.objects.get(prefix=world.worker_token[:12])
    workers = [Worker.objects.create(token=token, project=world.project, worker_id=f"storm-worker-{i}")
               for i in range(WORKERS)]
    return targets, workers


def _queue(world, targets, gpu_sets):
    Membership.objects.filter(user=world.member).update(role="member")
    Job.objects.bulk_create([
        Job(project=world.project, created_by=world.member, target=targets[i % len(targets)], runtime="python",
            command=["python", "x.py"], gpu_ids=gpu_sets(i))
        for i in range(JOBS)
    ])


def _violations(targets) -> list[str]:
    """One consistent snapshot of the held jobs: no GPU twice, no computer above its concurrency."""
    problems = []
    held = list(Job.objects.filter(status__in=["claimed", "running"]).values_list("target_id", "gpu_ids"))
    per_target = Counter(t for t, _ in held)
    for target in targets:
        if per_target[target.pk] > target.concurrency:
            problems.append(f"{target.name} runs {per_target[target.pk]} > {target.concurrency}")
        gpus = Counter(g for t, ids in held if t == target.pk for g in ids)
        problems += [f"GPU {g} of {target.name} held {n} times" for g, n in gpus.items() if n > 1]
    return problems


def _assert_every_job_claimed_exactly_once():
    assert Job.objects.exclude(status="finished").count() == 0
    claims = Counter(JobEvent.objects.filter(kind="claimed").values_list("job_id", flat=True))
    assert len(claims) == JOBS and set(claims.values()) == {1}


@pytest.mark.django_db(transaction=True)
def test_a_storm_of_16_workers_claims_200_single_gpu_jobs_exactly_once_without_overlap(world):
    targets, workers = _world_for_storm(world)
    _queue(world, targets, lambda i: [str((i // 4) % 4)])
    problems, errors, seconds, _ = run_storm(workers, lambda: _violations(targets))
    assert not errors, errors[:3]
    print(f"claim storm (1 GPU each): {JOBS} jobs in {seconds:.1f} s = {JOBS / seconds:.0f} claims/s")
    assert problems == []
    _assert_every_job_claimed_exactly_once()


@pytest.mark.django_db(transaction=True)
def test_the_same_storm_with_overlapping_gpu_sets_never_puts_two_jobs_on_one_gpu(world):
    targets, workers = _world_for_storm(world)
    rng = random.Random(7)
    sets = [sorted(rng.sample(["0", "1", "2", "3"], rng.choice([1, 2, 3]))) for _ in range(JOBS)]
    _queue(world, targets, lambda i: sets[i])
    problems, errors, seconds, _ = run_storm(workers, lambda: _violations(targets))
    assert not errors, errors[:3]
    print(f"claim storm (overlapping GPU sets): {JOBS} jobs in {seconds:.1f} s = {JOBS / seconds:.0f} claims/s")
    assert problems == []
    _assert_every_job_claimed_exactly_once()
