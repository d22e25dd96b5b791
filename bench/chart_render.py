"""Chart drawing of a long series (issue 16: "a series of 100,000 points downsampled, min/max per pixel
bucket, in <= 300 ms"), against the cost of reading the same rows, measured in the same run.

    .venv/bin/python bench/chart_render.py [--points 100000] [--keys 5] [--repeat 7]

Two cases: a Run with one key of --points points, and a Run with --keys keys of --points points each.
For each: `tracking.charts.run_charts(run)` (what the Run panel draws with) and the job page (its Run panel;
a Job's Run page redirects there) rendered through Django's test Client by a signed-in member
(MADO_DEBUG=false); as baselines a raw psycopg fetch of every (step, value) row of the Run and a plain
`SELECT count(*)` of them, and once the job page of a Run without points.
Each figure is the median of --repeat calls after one warm-up call; --profile adds cProfile and the
slowest SQL queries of one run_charts call and one job page per case.

Needs PostgreSQL at 127.0.0.1:5432 (user postgres, trust auth). Creates and drops its own database.
Prints `name: value ms` lines; asserts nothing about time."""
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
from harness import PG, own_database  # noqa: E402  (bench/ is on sys.path: the script's folder)
DB = f"mado_bench_{uuid.uuid4().hex[:8]}"
os.environ["MADO_DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{DB}"
os.environ["MADO_DEBUG"] = "false"          # as served (docs/deployment.md): no query log, cached templates
os.environ["MADO_ALLOWED_HOSTS"] = "testserver,127.0.0.1,localhost"   # the test Client's host
os.environ.setdefault("MADO_VAR_DIR", "/tmp/mado-bench")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mado.settings")
GOAL_MS = 300


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=100_000, help="points per series")
    parser.add_argument("--keys", type=int, default=5, help="series of the second case")
    parser.add_argument("--repeat", type=int, default=7, help="calls per figure (the median is printed)")
    parser.add_argument("--profile", action="store_true", help="also print cProfile's top functions of "
                                                               "run_charts and of the job page, per case")
    args = parser.parse_args()

    with own_database(DB):
        run(args)


def run(args) -> None:
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    member, project, target = world()
    empty_job, _empty_run = job_with_run(member, project, target, "no-points")
    print(f"# {args.points:,} points per series, median of {args.repeat} calls after one warm-up; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for name, keys in (("1key", ["loss"]), (f"{args.keys}keys", [f"metric_{i}" for i in range(args.keys)])):
        job, run_ = job_with_run(member, project, target, name)
        started = time.monotonic()
        insert_points(run_, keys, args.points)
        print(f"{name}_insert_copy: {(time.monotonic() - started) * 1000:.0f} ms "
              f"({len(keys) * args.points:,} rows, psycopg COPY + ANALYZE; setup, not a figure)")
        measure(name, member, project, job, run_, len(keys) * args.points, args)
    # What the job page costs without a chart: the rest of the page, under the same load.
    empty = job_page_ms(member, f"/projects/{project.slug}/jobs/{empty_job.pk}/", args.repeat)
    print(f"baseline_job_page_run_without_points: {empty:.1f} ms")
    print(f"# load average at the end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


def world():
    """A project, a signed-in member and a public computer the member's Jobs go to."""
    from django.contrib.auth.models import User

    from computers.models import ComputeTarget
    from mado import services as identity
    from mado.choices import Role
    from mado.models import Membership

    admin = User.objects.create_superuser("bench-admin", password="x")
    member = User.objects.create_user("bench-member", password="x")
    project = identity.create_project(identity.SYSTEM, slug="bench")
    Membership.objects.create(project=project, user=admin, role=Role.ADMIN)
    Membership.objects.create(project=project, user=member, role=Role.MEMBER)
    target = ComputeTarget.objects.create(
        owner=admin, name="bench-gpu", kind="ssh", visibility="public", enabled=True, host="h", ssh_user="u",
        ssh_key_path="/k", known_hosts_path="/kh", working_dir="/w", python_path="/p", runtimes=["python"],
        gpu_ids=["0"], concurrency=1)
    return member, project, target


def job_with_run(member, project, target, name: str):
    """A Job created through jobs.services, so that tracking's hook gives it its Run (the job page's panel)."""
    from jobs import services as job_services
    from mado.services import Actor
    from tracking.models import Run

    job = job_services.create_job(Actor(member), project, {"computer": target.pk, "runtime": "python",
                                                           "command": ["python", "train.py"], "name": name,
                                                           "run_kind": "training"})
    return job, Run.objects.get(job=job)


def insert_points(run_, keys: list[str], points: int) -> None:
    """The rows straight into the metric table with COPY (a slow fall with one spike per series), then the
    latest point and count of each series as the write path keeps them, then ANALYZE as autovacuum would."""
    from django.db import connection

    from tracking.models import LatestMetric, Metric

    table = Metric._meta.db_table
    connection.ensure_connection()
    with connection.connection.cursor() as cursor:
        with cursor.copy(f"COPY {table} (run_id, key, value, timestamp, step, is_nan) FROM STDIN") as copy:
            for key in keys:
                for i in range(points):
                    value = 50.0 if i == points * 7 // 9 else 1.0 - i / points
                    copy.write_row((run_.pk, key, value, 1_700_000_000_000 + i, i, False))
        cursor.execute(f"ANALYZE {table}")
    LatestMetric.objects.bulk_create([LatestMetric(run=run_, key=key, value=1.0 - (points - 1) / points,
                                                   timestamp=1_700_000_000_000 + points - 1, step=points - 1,
                                                   points=points)
                                      for key in keys])


def measure(name: str, member, project, job, run_, rows: int, args) -> None:
    import psycopg

    from tracking import charts
    from tracking.models import Metric, Run

    table = Metric._meta.db_table
    with psycopg.connect(f"{PG}/{DB}") as raw:
        fetched = median_ms(lambda: raw.execute(f"SELECT step, value FROM {table} WHERE run_id = %s",
                                                [run_.pk]).fetchall(), args.repeat)
        counted = median_ms(lambda: raw.execute(f"SELECT count(*) FROM {table} WHERE run_id = %s",
                                                [run_.pk]).fetchone(), args.repeat)
    print(f"{name}_baseline_raw_fetch_all_rows: {fetched:.1f} ms ({rows:,} rows, psycopg fetchall)")
    print(f"{name}_baseline_select_count: {counted:.1f} ms")

    fresh = lambda: Run.objects.get(pk=run_.pk)  # noqa: E731  (a view loads its Run on every request)
    drawn = charts.run_charts(fresh())
    assert drawn and all(c["count"] == rows // len(drawn) for c in drawn), "the charts do not hold every point"
    chart = median_ms(lambda: charts.run_charts(fresh()), args.repeat)
    print(f"{name}_run_charts: {chart:.1f} ms (goal <= {GOAL_MS} ms; {chart / fetched:.2f}x the raw fetch)")

    # A Job's Run page redirects to the job page, whose Run panel draws the charts: that page is timed.
    url = f"/projects/{project.slug}/jobs/{job.pk}/"
    took = job_page_ms(member, url, args.repeat, charts=len(drawn))
    print(f"{name}_job_page: {took:.1f} ms (goal <= {GOAL_MS} ms; {took / fetched:.2f}x the raw fetch)")
    if args.profile:
        profile(f"{name} run_charts", lambda: charts.run_charts(fresh()))
        client = signed_in(member)
        profile(f"{name} job_page", lambda: client.get(url))


def signed_in(member):
    from django.test import Client

    client = Client()
    client.force_login(member)
    return client


def job_page_ms(member, url: str, repeat: int, *, charts: int = 0) -> float:
    client = signed_in(member)
    response = client.get(url)
    assert response.status_code == 200 and response.content.count(b'class="chart-card"') == charts, url
    return median_ms(lambda: client.get(url), repeat)


def median_ms(call, repeat: int) -> float:
    call()  # warm-up: connections, template loading, PostgreSQL's buffers
    times = []
    for _ in range(max(repeat, 1)):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def profile(label: str, call) -> None:
    """Where the time of one call goes: cProfile's top functions by cumulative time, and the SQL queries."""
    import cProfile
    import pstats

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    profiler = cProfile.Profile()
    with CaptureQueriesContext(connection) as queries:
        profiler.runcall(call)
    print(f"# profile of {label}: {len(queries.captured_queries)} queries")
    for query in sorted(queries.captured_queries, key=lambda q: -float(q["time"]))[:6]:
        print(f"#   {float(query['time']) * 1000:.1f} ms  {query['sql'][:220]}")
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
