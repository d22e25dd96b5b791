"""Claim throughput, each figure next to a baseline measured in the same run.

    .venv/bin/python bench/claim_throughput.py [--jobs 1000] [--clients 16] [--skip-in-process]

Over HTTP (issue 19): the server as docs/deployment.md runs it (gunicorn gthread 2 processes x 8 threads,
MADO_DEBUG=false, CONN_MAX_AGE 60 s, PostgreSQL); 16 worker clients (one keep-alive connection each)
say hello, then claim and complete until `--jobs` jobs on 4 computers of 16 GPUs are done. The
baseline is a bare DRF endpoint in the same server, mounted only by this script (a settings module and
a URLconf it writes under /tmp): the same token authentication, parser and renderer, and one
`FOR UPDATE SKIP LOCKED` claim and one completion on a bare table with a GPU reservation row.
In one process: the claim service from 16 threads against a raw SQL SKIP LOCKED loop.

gunicorn is not in requirements.txt: installed into .venv (gunicorn==23.0.0) when missing. Needs
PostgreSQL at 127.0.0.1:5432 (user postgres, trust auth). Creates and drops its own database. Prints
`name: value unit` lines; asserts nothing about time."""
from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from harness import PG, ensure_gunicorn, free_port, own_database, start, stop, wait_ready  # noqa: E402

DB = f"mado_bench_{uuid.uuid4().hex[:8]}"
VAR = Path(tempfile.mkdtemp(prefix="mado-bench-claims-"))
SERVER_ENV = {
    "MADO_DATABASE_URL": f"{PG}/{DB}",
    "MADO_DEBUG": "false",
    "MADO_DEV_MODE": "false",
    "MADO_SECRET_KEY": secrets.token_urlsafe(64),
    "MADO_ALLOWED_HOSTS": "127.0.0.1,localhost",
    "MADO_VAR_DIR": str(VAR),
    "MADO_LOG_LEVEL": "WARNING",
}
TARGETS, GPUS = 4, 16
GOAL_RATIO = 0.75  # issue 19: ours over HTTP at least 75 % of the bare endpoint

# The baseline's settings and URLconf, written under VAR and put on the server's path by this script only.
BARE_SETTINGS = "from mado.settings import *  # noqa: F401,F403\nROOT_URLCONF = 'bench_claim_urls'\n"
BARE_URLS = '''"""A bare DRF claim endpoint next to the product's URLs (bench/claim_throughput.py only)."""
from django.db import connection, transaction
from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from mado.urls import urlpatterns as product


class BareClaim(APIView):
    required_scopes = {"POST": "worker:execute"}

    def post(self, request):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT id, gpu FROM bench_job WHERE status = 'queued' AND gpu NOT IN "
                           "(SELECT gpu FROM bench_gpu) ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED")
            row = cursor.fetchone()
            if row is None:
                return Response({"item": None})
            cursor.execute("UPDATE bench_job SET status = 'claimed' WHERE id = %s", [row[0]])
            cursor.execute("INSERT INTO bench_gpu VALUES (%s, %s) ON CONFLICT DO NOTHING", [row[1], row[0]])
        return Response({"item": {"id": row[0], "gpu": row[1]}})


class BareComplete(APIView):
    required_scopes = {"POST": "worker:execute"}

    def post(self, request, job_id):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("DELETE FROM bench_gpu WHERE job = %s", [job_id])
            cursor.execute("UPDATE bench_job SET status = 'finished' WHERE id = %s", [job_id])
        return Response({"id": job_id, "status": "finished"})


urlpatterns = [path("bench/claim", BareClaim.as_view()), path("bench/jobs/<int:job_id>/complete",
                                                                BareComplete.as_view()), *product]
'''


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=16, help="concurrent worker clients (threads)")
    parser.add_argument("--skip-in-process", action="store_true", help="only the HTTP figures")
    parser.add_argument("--computers", type=int, default=TARGETS,
                        help="computers the jobs are spread over (each claim locks one while it places a job)")
    args = parser.parse_args()
    os.environ.update(SERVER_ENV)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mado.settings")

    with own_database(DB):
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        server, base = start_server()
        try:
            over_http(base, args.jobs, args.clients, args.computers)
            if not args.skip_in_process:
                in_process(args.jobs, args.clients)
        finally:
            stop(server)


# Over HTTP --------------------------------------------------------------------------------------------

def over_http(base: str, jobs: int, clients: int, computers: int) -> None:
    token, project, admin = world("http")
    queue_jobs(project, admin, make_targets(admin, "http", computers), jobs)
    bare_table(jobs)
    ours = http_rate(base, token, jobs, clients, ours=True)
    bare = http_rate(base, token, jobs, clients, ours=False)
    print(f"http_bare_drf_skip_locked_claims: {bare:.0f} claims/s")
    print(f"http_claim_endpoint_claims: {ours:.0f} claims/s")
    print(f"http_claim_endpoint_vs_bare: {ours / bare:.2f} ratio (goal >= {GOAL_RATIO:.2f})")


def http_rate(base: str, token: str, jobs: int, clients: int, *, ours: bool) -> float:
    """Claims per second of `clients` threads, each claiming then completing until `jobs` are done."""
    import requests

    done, lock, errors = [0], threading.Lock(), []
    spent = {"claim": [], "empty": [], "complete": []}  # seconds per call, by kind
    names = iter(range(clients))

    def work():
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {token}"
        name = f"bench-{next(names)}"
        call = (lambda path, body: session.post(base + path, json={"worker_id": name, **body}, timeout=120))
        if ours:
            call("/api/worker/hello", {"version": "bench", "hostname": "bench", "parallel_jobs": 1,
                                       "capabilities": ["jobs"]}).raise_for_status()
        ready.wait()  # every hello in before the clock starts
        while True:
            with lock:
                if done[0] >= jobs or errors:
                    return
            began = time.monotonic()
            response = call("/api/worker/claim" if ours else "/bench/claim", {"active_job_ids": []})
            if response.status_code != 200:
                errors.append(response.text[:500])
                return
            item = response.json()["item"]
            spent["empty" if item is None else "claim"].append(time.monotonic() - began)
            if item is None:
                continue  # every free job is on a computer another claim holds now, or waits for a GPU
            path = f"/api/worker/jobs/{item['id']}/complete" if ours else f"/bench/jobs/{item['id']}/complete"
            began = time.monotonic()
            answer = call(path, {"lease_id": item.get("lease_id"), "status": "finished", "exit_code": 0})
            spent["complete"].append(time.monotonic() - began)
            if answer.status_code != 200:
                errors.append(answer.text[:500])
                return
            with lock:
                done[0] += 1

    ready = threading.Barrier(clients + 1)
    pool = [threading.Thread(target=work) for _ in range(clients)]
    for thread in pool:
        thread.start()
    ready.wait()
    started = time.monotonic()
    for thread in pool:
        thread.join()
    elapsed = time.monotonic() - started
    if errors:
        raise SystemExit(f"{'ours' if ours else 'bare'}: a call failed: {errors[0]}")
    name = "http_claim_endpoint" if ours else "http_bare_drf"
    for kind, times in spent.items():
        median = statistics.median(times) * 1000 if times else 0
        print(f"{name}_{kind}_calls: {len(times)} calls, median {median:.1f} ms")
    return done[0] / elapsed


def bare_table(jobs: int) -> None:
    """The baseline's queue: as many jobs, one GPU each over the same 64 GPUs."""
    import psycopg

    with psycopg.connect(f"{PG}/{DB}", autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_job (id serial primary key, status text, gpu text)")
        conn.execute("CREATE TABLE bench_gpu (gpu text primary key, job int)")
        conn.execute("INSERT INTO bench_job (status, gpu) SELECT 'queued', (g %% %s)::text "
                     "FROM generate_series(1, %s) g", [TARGETS * GPUS, jobs])


def start_server() -> tuple[subprocess.Popen, str]:
    gunicorn = ensure_gunicorn()
    (VAR / "bench_claim_settings.py").write_text(BARE_SETTINGS)
    (VAR / "bench_claim_urls.py").write_text(BARE_URLS)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="bench_claim_settings", MADO_PUBLIC_URL=base,
               PYTHONPATH=os.pathsep.join(filter(None, [str(VAR), str(ROOT), os.environ.get("PYTHONPATH")])))
    log = VAR / "server.log"
    server = start([str(gunicorn), "mado.wsgi", "--bind", f"127.0.0.1:{port}", "--worker-class", "gthread",
                    "--workers", "2", "--threads", "8", "--log-level", "warning"], env, log)
    wait_ready(server, f"{base}/api/health", log)
    return server, base


# In one process -------------------------------------------------------------------------------------

def in_process(jobs: int, threads: int) -> None:
    baseline = raw_skip_locked(jobs, threads)
    print(f"raw_sql_skip_locked_claims: {baseline:.0f} claims/s")
    service = claim_service(jobs, threads)
    print(f"claim_service_claims: {service:.0f} claims/s")
    print(f"claim_service_vs_raw: {service / baseline:.2f} ratio")


def raw_skip_locked(jobs: int, threads: int) -> float:
    """The yardstick of DESIGN §13: claim + complete on a bare table with one reservation row."""
    import psycopg

    url = f"{PG}/{DB}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE bench_job, bench_gpu RESTART IDENTITY")
        conn.execute("INSERT INTO bench_job (status, gpu) SELECT 'queued', (g %% 64)::text "
                     "FROM generate_series(1, %s) g", [jobs])

    def work():
        with psycopg.connect(url) as conn:
            while True:
                with conn.transaction():
                    row = conn.execute("SELECT id, gpu FROM bench_job WHERE status = 'queued' AND gpu NOT IN "
                                       "(SELECT gpu FROM bench_gpu) ORDER BY id LIMIT 1 "
                                       "FOR UPDATE SKIP LOCKED").fetchone()
                    if row is None:
                        return
                    conn.execute("UPDATE bench_job SET status = 'claimed' WHERE id = %s", [row[0]])
                    conn.execute("INSERT INTO bench_gpu VALUES (%s, %s) ON CONFLICT DO NOTHING", [row[1], row[0]])
                with conn.transaction():
                    conn.execute("DELETE FROM bench_gpu WHERE job = %s", [row[0]])
                    conn.execute("UPDATE bench_job SET status = 'finished' WHERE id = %s", [row[0]])

    return _timed(work, threads, jobs)


def claim_service(jobs: int, threads: int) -> float:
    from django.db import connection

    from jobs import services
    from jobs.models import Job
    from mado.models import ApiToken
    from workers.models import Worker

    _plaintext, project, admin = world("in-process")
    token = ApiToken.objects.filter(user__service_account__project=project).latest("pk")
    queue_jobs(project, admin, make_targets(admin, "in-process"), jobs)
    counter = iter(range(10_000))

    def work():
        worker = Worker.objects.create(token=token, project=project, worker_id=f"in-process-{next(counter)}")
        try:
            while True:
                claimed = services.claim_job(worker, [])
                if claimed is None:
                    if not Job.objects.filter(status="queued", project=project).exists():
                        return
                    continue
                job = claimed[0]
                services.complete(worker, job.pk, lease_id=job.lease_id, status="finished", exit_code=0)
        finally:
            connection.close()

    return _timed(work, threads, jobs)


# The world ----------------------------------------------------------------------------------------

def world(slug: str):
    """A project with an admin and an admin-role service account holding a worker token."""
    from django.contrib.auth.models import User

    from mado import services as identity
    from mado.choices import Role
    from mado.models import Membership

    admin = User.objects.filter(username="bench-admin").first() or User.objects.create_superuser(
        "bench-admin", password=secrets.token_urlsafe(16))
    project = identity.create_project(identity.SYSTEM, slug=slug)
    Membership.objects.create(project=project, user=admin, role=Role.ADMIN)
    account = identity.create_service_account(identity.Actor(admin), project, name="bench-worker", role=Role.ADMIN)
    _token, plaintext = identity.issue_token(identity.SYSTEM, user=account.user, project=project,
                                             scopes=["read", "worker:execute"], kind="service")
    return plaintext, project, admin


def make_targets(admin, prefix: str, count: int = TARGETS) -> list:
    from computers.models import ComputeTarget

    return [ComputeTarget.objects.create(
        owner=admin, name=f"{prefix}-{i}", kind="ssh", visibility="public", enabled=True, host="h", ssh_user="u",
        ssh_key_path="/k", known_hosts_path="/kh", working_dir="/w", python_path="/p", runtimes=["python"],
        gpu_ids=[str(g) for g in range(GPUS)], concurrency=GPUS) for i in range(count)]


def queue_jobs(project, admin, targets: list, jobs: int) -> None:
    from jobs.models import Job

    count = len(targets)
    Job.objects.bulk_create([Job(project=project, created_by=admin, target=targets[i % count], command=["x"],
                                 gpu_ids=[str((i // count) % GPUS)]) for i in range(jobs)])


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
