"""Pages with many rows (issue 19: "the Jobs list with 1,000 jobs and the Computers list with 1,000
computers ... p50 <= 150 ms"), next to baselines measured in the same run.

    .venv/bin/python bench/list_pages.py [--rows 1000] [--repeat 15]

Rendered through Django's test Client (MADO_DEBUG=false, PostgreSQL) by a signed-in project member and
by a global administrator. Baselines: the same pages with no rows at all (what the page costs around
the list), and a raw ORM fetch of the rows the page shows (50 Jobs with their computers and creators;
50 computers with their owners; every computer too, which the Computers list drew before it showed 50 per
page). The query count of each page is printed beside it (tests pin that it does not grow).

Needs PostgreSQL at 127.0.0.1:5432 (user postgres, trust auth). Creates and drops its own database.
Prints `name: value unit` lines; asserts nothing about time."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from harness import own_database  # noqa: E402  (bench/ is on sys.path: the script's folder)
DB = f"mado_bench_{uuid.uuid4().hex[:8]}"
os.environ["MADO_DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{DB}"
os.environ["MADO_DEBUG"] = "false"          # as served: no query log, cached templates
os.environ["MADO_ALLOWED_HOSTS"] = "testserver,127.0.0.1,localhost"   # the test Client's host
os.environ.setdefault("MADO_VAR_DIR", "/tmp/mado-bench")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mado.settings")
GOAL_MS = 150
STATUSES = ["queued", "claimed", "running", "finished", "failed", "canceled"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1000, help="Jobs and computers")
    parser.add_argument("--repeat", type=int, default=15, help="calls per figure")
    args = parser.parse_args()

    with own_database(DB):
        run(args)


def run(args) -> None:
    import django

    django.setup()
    import logging

    from django.core.management import call_command

    logging.getLogger("axes").setLevel(logging.WARNING)  # one sign-in line per page measured otherwise

    call_command("migrate", verbosity=0)
    admin, member, project, empty_project = world()
    jobs_url, empty_jobs_url = (f"/projects/{p.slug}/jobs/" for p in (project, empty_project))
    print(f"# {args.rows:,} Jobs and computers; p50/p95 of {args.repeat} calls after one warm-up; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    empty = {"jobs": page(member, empty_jobs_url, args.repeat), "computers": page(member, "/settings/computers/",
                                                                                    args.repeat)}
    fill(admin, member, project, args.rows)
    print(f"baseline_raw_fetch_50_jobs: {p50(fetch_jobs(project), args.repeat):.1f} ms")
    print(f"baseline_raw_fetch_50_computers: {p50(lambda: list(computers()[:50]), args.repeat):.1f} ms")
    print(f"baseline_raw_fetch_all_computers: {p50(lambda: list(computers()), args.repeat):.1f} ms")
    for name, url in (("jobs", jobs_url), ("computers", "/settings/computers/")):
        print(f"baseline_{name}_page_without_rows: {empty[name][0]:.1f} ms p50 ({empty[name][2]} queries)")
        for who, user in (("member", member), ("global_admin", admin)):
            median, high, queries = page(user, url, args.repeat)
            print(f"{name}_page_{args.rows}_{who}: {median:.1f} ms p50, {high:.1f} ms p95 ({queries} queries; "
                  f"{median / empty[name][0]:.1f}x the page without rows; goal <= {GOAL_MS} ms)")


def world():
    from django.contrib.auth.models import User

    from mado import services as identity
    from mado.choices import Role
    from mado.models import Membership

    admin = User.objects.create_superuser("bench-admin", password="x")
    member = User.objects.create_user("bench-member", password="x")
    project = identity.create_project(identity.SYSTEM, slug="bench")
    empty_project = identity.create_project(identity.SYSTEM, slug="bench-empty")
    for p in (project, empty_project):
        Membership.objects.create(project=p, user=member, role=Role.MEMBER)
    return admin, member, project, empty_project


def fill(admin, member, project, rows: int) -> None:
    from computers.models import ComputeTarget
    from jobs.models import Job

    ComputeTarget.objects.bulk_create(
        ComputeTarget(owner=admin if i % 2 else member, name=f"node-{i:04d}", kind="ssh",
                      visibility="public" if i % 3 else "private", enabled=True, host=f"node-{i}.internal",
                      ssh_user="u", ssh_key_path="/k", known_hosts_path="/kh", working_dir="/w", python_path="/p",
                      runtimes=["python"], gpu_ids=["0", "1"], concurrency=2)
        for i in range(rows))
    targets = list(ComputeTarget.objects.filter(visibility="public"))
    Job.objects.bulk_create(
        Job(project=project, created_by=member, target=targets[i % len(targets)], runtime="python",
            command=["python", f"train_{i}.py"], name=f"run-{i:04d}", status=STATUSES[i % len(STATUSES)],
            gpu_ids=["0"] if i % 3 == 0 else [])
        for i in range(rows))


def fetch_jobs(project):
    from jobs.models import Job

    return lambda: list(Job.objects.filter(project=project).select_related("target", "created_by")
                        .order_by("-created_at")[:50])


def computers():
    from computers.models import ComputeTarget

    return ComputeTarget.objects.select_related("owner").order_by("name")


def page(user, url: str, repeat: int) -> tuple[float, float, int]:
    from django.db import connection
    from django.test import Client

    client = Client()
    client.force_login(user)
    queries = []
    # Counted by an execute wrapper: the query log is off (DEBUG false) and reset by every request.
    with connection.execute_wrapper(lambda execute, sql, *rest: queries.append(sql) or execute(sql, *rest)):
        assert client.get(url).status_code == 200, url
    times = timed(lambda: client.get(url), repeat)
    return statistics.median(times), percentile(times, 95), len(queries)


def timed(call, repeat: int) -> list[float]:
    call()  # warm-up: connections, template loading, PostgreSQL's buffers
    times = []
    for _ in range(max(repeat, 1)):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return times


def p50(call, repeat: int) -> float:
    return statistics.median(timed(call, repeat))


def percentile(times: list[float], pct: int) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


if __name__ == "__main__":
    main()
