"""Claim throughput: our claim service against a raw SQL SKIP LOCKED loop, measured in the same run.

    make bench-claims            # or: .venv/bin/python bench/claim_throughput.py [--jobs 2000] [--threads 16]

Needs PostgreSQL at 127.0.0.1:5432 (user postgres, trust auth). Creates and drops its own database.
Prints `name: value unit` lines; asserts nothing about time."""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DB = f"mado_bench_{uuid.uuid4().hex[:8]}"
os.environ["MADO_DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{DB}"
os.environ.setdefault("MADO_VAR_DIR", "/tmp/mado-bench")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mado.settings")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=16)
    args = parser.parse_args()

    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{DB}"')
    try:
        run(args.jobs, args.threads)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')


def run(jobs: int, threads: int) -> None:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    baseline = raw_skip_locked(jobs, threads)
    print(f"raw_sql_skip_locked_claims: {baseline:.0f} claims/s")
    service = claim_service(jobs, threads)
    print(f"claim_service_claims: {service:.0f} claims/s")
    print(f"claim_service_vs_raw: {service / baseline:.2f} ratio")
    connection.close()


def raw_skip_locked(jobs: int, threads: int) -> float:
    """The yardstick of DESIGN §13: claim + complete on a bare table with one reservation row."""
    import psycopg

    url = f"postgresql://postgres@127.0.0.1:5432/{DB}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_job (id serial primary key, status text, gpu text)")
        conn.execute("CREATE TABLE bench_gpu (gpu text primary key, job int)")
        conn.execute("INSERT INTO bench_job (status, gpu) SELECT 'queued', (g %% 64)::text FROM generate_series(1, %s) g",
                     [jobs])

    def work():
        with psycopg.connect(url) as conn:
            while True:
                with conn.transaction():
                    row = conn.execute("SELECT id, gpu FROM bench_job WHERE status = 'queued' AND gpu NOT IN "
                                       "(SELECT gpu FROM bench_gpu) ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED").fetchone()
                    if row is None:
                        return
                    conn.execute("UPDATE bench_job SET status = 'claimed' WHERE id = %s", [row[0]])
                    conn.execute("INSERT INTO bench_gpu VALUES (%s, %s) ON CONFLICT DO NOTHING", [row[1], row[0]])
                with conn.transaction():
                    conn.execute("DELETE FROM bench_gpu WHERE job = %s", [row[0]])
                    conn.execute("UPDATE bench_job SET status = 'finished' WHERE id = %s", [row[0]])

    return _timed(work, threads, jobs)


def claim_service(jobs: int, threads: int) -> float:
    from django.contrib.auth.models import User
    from django.db import connection

    from computers.models import ComputeTarget
    from jobs import services
    from jobs.models import Job
    from mado import services as identity
    from mado.choices import Role
    from mado.models import ApiToken, Membership
    from workers.models import Worker

    admin = User.objects.create_superuser("bench-admin", password="x")
    project = identity.create_project(identity.SYSTEM, slug="bench")
    Membership.objects.create(project=project, user=admin, role=Role.ADMIN)
    account = identity.create_service_account(identity.Actor(admin), project, name="bench-worker", role=Role.ADMIN)
    identity.issue_token(identity.SYSTEM, user=account.user, project=project, scopes=["read", "worker:execute"],
                         kind="service")
    token = ApiToken.objects.get(user=account.user)
    targets = [ComputeTarget.objects.create(
        owner=admin, name=f"bench-{i}", kind="ssh", visibility="public", enabled=True, host="h", ssh_user="u",
        ssh_key_path="/k", known_hosts_path="/kh", working_dir="/w", python_path="/p", runtimes=["python"],
        gpu_ids=[str(g) for g in range(16)], concurrency=16) for i in range(4)]
    Job.objects.bulk_create([Job(project=project, created_by=admin, target=targets[i % 4], command=["x"],
                                 gpu_ids=[str((i // 4) % 16)]) for i in range(jobs)])
    counter = iter(range(10_000))

    def work():
        worker = Worker.objects.create(token=token, project=project, worker_id=f"bench-{next(counter)}")
        try:
            while True:
                claimed = services.claim_job(worker, [])
                if claimed is None:
                    if not Job.objects.filter(status="queued").exists():
                        return
                    continue
                job = claimed[0]
                services.complete(worker, job.pk, lease_id=job.lease_id, status="finished", exit_code=0)
        finally:
            connection.close()

    return _timed(work, threads, jobs)


def _timed(work, threads: int, jobs: int) -> float:
    pool = [threading.Thread(target=work) for _ in range(threads)]
    started = time.monotonic()
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return jobs / (time.monotonic() - started)


if __name__ == "__main__":
    main()
