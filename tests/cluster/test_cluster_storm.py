"""All or nothing on PostgreSQL: 12 workers claim a mix of ordinary, single-node and multi-node
cluster jobs on one compute group while a checker asserts, over and over, that no cluster job ever
holds part of its resources, no GPU is booked twice and no computer runs more than its concurrency.
Each check is one SQL statement, so it sees one consistent snapshot of what claims have committed."""
from __future__ import annotations

import json
import random
from collections import Counter

import pytest
from django.db import connection

from jobs.models import Job, JobEvent
from mado.models import ApiToken
from tests.cluster.conftest import make_group
from tests.job_fixtures import gpu_computer
from tests.storm import run_storm
from workers.models import Worker

WORKERS = 12
JOBS = 150  # 12 workers racing for mixed ordinary and cluster jobs: contention, not volume
GPUS = ("0", "1", "2", "3")

CLUSTER_HOLDINGS = """
SELECT j.id, j.status, j.cluster_size, j.gpus_per_replica,
       (SELECT count(*) FROM jobs_gpureservation r WHERE r.job_id = j.id),
       (SELECT count(*) FROM jobs_jobreplica p WHERE p.job_id = j.id)
FROM jobs_job j WHERE j.cluster_size > 1
"""
# What runs where, in one statement: held ordinary jobs and held replicas, with their GPUs.
HELD_PLACES = """
SELECT j.target_id, j.gpu_ids::text FROM jobs_job j
 WHERE j.status IN ('claimed', 'running') AND j.cluster_size = 1
UNION ALL
SELECT p.target_id, p.gpu_ids::text FROM jobs_jobreplica p JOIN jobs_job j ON j.id = p.job_id
 WHERE j.status IN ('claimed', 'running')
"""


def _violations(targets) -> list[str]:
    problems = []
    with connection.cursor() as cursor:
        cursor.execute(CLUSTER_HOLDINGS)
        for job_id, status, size, per, reserved, replicas in cursor.fetchall():
            held = status in ("claimed", "running")
            expected = (size * per, size) if held else (0, 0 if status == "queued" else None)
            if reserved != expected[0] or (expected[1] is not None and replicas != expected[1]):
                problems.append(f"cluster job {job_id} ({status}, {size}×{per}) holds {reserved} GPUs, "
                                f"{replicas} replicas")
        cursor.execute(HELD_PLACES)
        places = [(target, json.loads(gpus)) for target, gpus in cursor.fetchall()]
    slots = Counter(target for target, _ in places)
    for target in targets:
        if slots[target.pk] > target.concurrency:
            problems.append(f"{target.name} runs {slots[target.pk]} > {target.concurrency}")
        gpus = Counter(g for t, ids in places if t == target.pk for g in ids)
        problems += [f"GPU {g} of {target.name} booked {n} times" for g, n in gpus.items() if n > 1]
    return problems


def _queue(world, targets, group):
    rng = random.Random(9)
    jobs = []
    for i in range(JOBS):
        kind = rng.choice(["ordinary", "ordinary", "single", "multi"])
        fields = {"target": rng.choice(targets)}
        if kind == "ordinary":
            fields["gpu_ids"] = sorted(rng.sample(GPUS, rng.choice([0, 1, 2])))
        elif kind == "single":
            fields.update(cluster_size=2, cluster_mode="single-node", gpus_per_replica=rng.choice([1, 2]))
        else:
            fields.update(cluster_size=rng.choice([2, 3, 5]), cluster_mode="multi-node", gpus_per_replica=1,
                          compute_group=group, target=targets[0])
        jobs.append(Job(project=world.project, created_by=world.member, runtime="python", command=["x"], **fields))
    Job.objects.bulk_create(jobs)


@pytest.mark.django_db(transaction=True)
def test_a_storm_of_ordinary_and_cluster_claims_never_leaves_a_partial_reservation(world):
    targets = [gpu_computer(world.global_admin, f"node-{i}", gpus=GPUS, concurrency=4) for i in range(4)]
    group = make_group(world, "storm-nodes", targets)
    token = ApiToken.objects.get(prefix=world.worker_token[:12])
    workers = [Worker.objects.create(token=token, project=world.project, worker_id=f"storm-{i}",
                                     capabilities=["jobs", "cluster_jobs"])
               for i in range(WORKERS)]
    _queue(world, targets, group)
    problems, errors, seconds, checks = run_storm(workers, lambda: _violations(targets), idle_rounds=30,
                                                  drain=True)
    print(f"cluster claim storm: {JOBS} jobs in {seconds:.1f} s, {checks} consistency checks")
    assert not errors, errors[:3]
    assert problems == [], problems[:5]
    assert checks > 20
    assert Job.objects.exclude(status="finished").count() == 0
    claims = Counter(JobEvent.objects.filter(kind="claimed").values_list("job_id", flat=True))
    assert len(claims) == JOBS and set(claims.values()) == {1}
    # Every multi-node job ran with all its replicas.
    spread = Job.objects.filter(cluster_mode="multi-node", cluster_size__gt=1)
    assert spread.exists() and all(job.replicas.count() == job.cluster_size for job in spread)


def test_the_checker_sees_a_partial_reservation_and_a_double_booking(world):
    """The storm's checker is not blind: a hand-made partial cluster claim and a GPU in two replicas show."""
    from jobs.models import GpuReservation, JobReplica

    nodes = [gpu_computer(world.global_admin, f"node-{i}", gpus=GPUS) for i in range(2)]
    job = Job.objects.create(project=world.project, created_by=world.member, target=nodes[0], command=["x"],
                             cluster_size=2, gpus_per_replica=1, status="claimed")
    JobReplica.objects.create(job=job, index=0, name="main1", target=nodes[0], gpu_ids=["0"])
    JobReplica.objects.create(job=job, index=1, name="sub1", target=nodes[0], gpu_ids=["0"])
    GpuReservation.objects.create(job=job, target=nodes[0], gpu_id="0")
    problems = _violations(nodes)
    assert any("holds 1 GPUs, 2 replicas" in p for p in problems)
    assert "GPU 0 of node-0 booked 2 times" in problems
