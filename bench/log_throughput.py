"""Log delivery throughput: a job prints 200 MB of numbered lines on an SSH target; the worker follows
them over one stream and posts them to the server. Measured in the same run, on the same file:

- `raw_paramiko_cat`: a plain `cat stdout.log` over one paramiko channel (the yardstick, DESIGN §13)
- `supervisor_follow_stream`: the supervisor's framed follow stream alone, read to the end
- `worker_log_delivery`: first to last chunk stored by the server (follow + HTTP + PostgreSQL), as
  frames of bytes (worker/jobs/{id}/log-frames, docs/logs.md); with `--json`, as an older server
  takes them: the log-frames path answers 404 and the worker falls back to JSON chunks

    .venv/bin/python bench/log_throughput.py [--mb 200] [--json]

Needs PostgreSQL at 127.0.0.1:5432 (user postgres, trust auth; creates and drops its own database),
root (it starts an sshd with a login user `mmt`, as the tests do). Checks that every line arrived once
and in order; prints `name: value unit` lines and asserts nothing about speed."""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DB = f"mado_bench_{uuid.uuid4().hex[:8]}"
os.environ["MADO_DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{DB}"
os.environ.setdefault("MADO_VAR_DIR", f"/tmp/mado-bench-{uuid.uuid4().hex[:6]}")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mado.settings")



def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="serve no log-frames: the worker sends JSON chunks")
    parser.add_argument("--profile", action="store_true", help="print where the server's log requests spend time")
    parser.add_argument("--catch-up", action="store_true",
                        help="SIGKILL the worker once the job runs, start it again when the job has written its log: "
                             "the new worker delivers a log that exists, as `cat` reads it")
    args = parser.parse_args()

    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{DB}"')
    try:
        run(args.mb, args.json, args.profile, args.catch_up)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')


urlpatterns: list = []  # this script's URLconf (ROOT_URLCONF = "__main__"): the server's, log-frames first


def route_log_frames(json_only: bool) -> None:
    from django.conf import settings
    from django.urls import path, re_path

    from mado import urls
    from mado.exceptions import json_not_found
    from worker_api.logs import JobLogFramesView

    global handler400, handler404, handler500
    route = (re_path(r"^api/worker/jobs/[0-9]+/log-frames$", json_not_found) if json_only  # as an older server
             else path("api/worker/jobs/<int:job_id>/log-frames", JobLogFramesView.as_view()))
    urlpatterns[:] = [route, *urls.urlpatterns]
    handler400, handler404, handler500 = urls.handler400, urls.handler404, urls.handler500
    settings.ROOT_URLCONF = "__main__"


def run(mb: int, json_only: bool, profile: bool = False, catch_up: bool = False) -> None:
    import django

    django.setup()
    route_log_frames(json_only)
    from django.core.management import call_command
    from django.db import transaction
    from django.test.testcases import LiveServerThread, _StaticFilesHandler

    call_command("migrate", verbosity=0)

    from computers.models import ComputeTarget
    from jobs import services as job_services
    from jobs.models import Job, LogChunk
    from mado.services import Actor
    from tests.conftest import World
    from tests.peers.sshd import start_sshd
    from worker_agent.ssh import Connection, Target
    from worker_agent.supervisor import Remote, StateFrame, workspace

    import cProfile
    import pstats
    import threading

    profiles: list = []
    guard = threading.Lock()

    class Handler(_StaticFilesHandler):
        """With --profile: each request to a …/logs or …/log-frames path under cProfile (one per thread)."""

        def __call__(self, environ, start_response):
            if not profile or "/log" not in environ.get("PATH_INFO", ""):
                return super().__call__(environ, start_response)
            profiler = cProfile.Profile()
            try:
                return profiler.runcall(super().__call__, environ, start_response)
            finally:
                with guard:
                    profiles.append(profiler)

    server = LiveServerThread("127.0.0.1", Handler, connections_override={}, port=0)
    server.daemon = True
    server.start()
    server.is_ready.wait()
    url = f"http://127.0.0.1:{server.port}"
    sshd = start_sshd()
    world = World()
    user_dir = sshd.home / f"bench-{uuid.uuid4().hex[:6]}"
    user_dir.mkdir()
    os.chown(user_dir, sshd.home.stat().st_uid, sshd.home.stat().st_gid)
    script = user_dir / "volume.py"
    from tests.support import NUMBERED_LINES

    # The job notes when it starts and stops writing (beside the log, not in it): how fast it wrote
    # bounds how fast anything can deliver, and the last chunk's lag behind its end is what a reader waits.
    times = user_dir / "times"
    script.write_text(f"import time\nopen({str(times)!r}, 'w').write(f'{{time.time()}}\\n')\n" + NUMBERED_LINES
                      + f"sys.stdout.flush()\nopen({str(times)!r}, 'a').write(f'{{time.time()}}\\n')\n")
    os.chown(script, sshd.home.stat().st_uid, sshd.home.stat().st_gid)
    computer = ComputeTarget.objects.create(
        owner=world.global_admin, name="bench-sshd", kind="ssh", visibility="public", enabled=True,
        host="127.0.0.1", port=sshd.port, ssh_user=sshd.user, ssh_key_path=str(sshd.key_path),
        known_hosts_path=str(sshd.known_hosts_path), working_dir=str(user_dir), python_path="/usr/bin/python3",
        runtimes=["python"], concurrency=1)
    state = Path(os.environ["MADO_VAR_DIR"]) / "worker-state"
    home = Path(os.environ["MADO_VAR_DIR"]) / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MMT_", "MADO_"))}
    env.update(HOME=str(home), MMT_API_URL=url, MMT_API_TOKEN=world.worker_token, MMT_WORKER_ID="bench-worker",
               MMT_WORKER_STATE_DIR=str(state), MMT_WORKER_CLAIM_WAIT="2", MMT_LOG_LEVEL="info")
    log = open(Path(os.environ["MADO_VAR_DIR"]) / "worker.log", "wb")

    def start_worker():
        return subprocess.Popen([str(Path(sys.executable).with_name("mado-tracking-worker")), "run"], env=env,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    worker = start_worker()
    size = mb * 10 ** 6
    restart_after = 0  # with --catch-up: the last chunk id stored before the second worker started
    try:
        with transaction.atomic():
            job = job_services.create_job(Actor(world.member), world.project, {
                "computer": computer.pk, "runtime": "python",
                "command": ["python", str(script), str(size)]})
        deadline = time.monotonic() + 1800
        if catch_up:
            while not times.exists():
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise SystemExit("the job did not start; see " + log.name)
                time.sleep(0.05)
            worker.kill()
            worker.wait()
            while len(times.read_text().split()) < 2:
                time.sleep(0.05)
            restart_after = LogChunk.objects.filter(job_id=job.pk).order_by("-id").values_list("id", flat=True).first() or 0
            worker = start_worker()
        while Job.objects.get(pk=job.pk).status not in ("finished", "failed", "canceled"):
            if time.monotonic() > deadline or worker.poll() is not None:
                raise SystemExit("the job did not end; see " + log.name)
            time.sleep(0.2)
        job = Job.objects.get(pk=job.pk)
        assert job.status == "finished", (job.status, job.error)
        chunks = LogChunk.objects.filter(job_id=job.pk, stream="stdout")
        first = chunks.order_by("id").first().created_at
        last = chunks.order_by("id").last().created_at
        delivered = 0
        expected = 0
        for chunk in chunks.order_by("offset").iterator(chunk_size=200):
            assert chunk.offset == delivered, "a gap or an overlap"
            data = chunk.data.encode()
            delivered += len(data)
        # every line once and in order
        text_lines = 0
        tail = ""
        for chunk in chunks.order_by("offset").iterator(chunk_size=200):
            text = tail + chunk.data
            parts = text.split("\n")
            tail = parts.pop()
            for line in parts:
                assert line == f"{expected:010d} {'x' * 88}", (expected, line[:40])
                expected += 1
            text_lines += len(parts)
        assert tail == ""
        # From the first request's rows to the last's: the bytes of the first request (rows stored
        # within a few ms of the first) took no measured time, so they are not counted either.
        seconds = (last - first).total_seconds()
        first_request = sum(len(c.data.encode()) for c in chunks.filter(created_at__lte=first + timedelta(milliseconds=5)))
        job_dir = workspace(str(user_dir), job.pk)

        target = Target.from_api({"kind": "ssh", "host": "127.0.0.1", "port": sshd.port, "ssh_user": sshd.user,
                                  "ssh_key_path": str(sshd.key_path),
                                  "known_hosts_path": str(sshd.known_hosts_path)})
        connection = Connection(target).open()
        started = time.monotonic()
        with connection.stream(["cat", f"{job_dir}/stdout.log"], timeout=30) as stream:
            raw = 0
            while block := stream.read(1 << 20):
                raw += len(block)
        raw_seconds = time.monotonic() - started
        started = time.monotonic()
        followed = 0
        with Remote(connection, working_dir=str(user_dir), job_id=job.pk, python="/usr/bin/python3").follow(0, 0) as f:
            for item in f:
                if isinstance(item, StateFrame):
                    continue
                if item.stream == "stdout":
                    followed += len(item.data)
        follow_seconds = time.monotonic() - started
        connection.close()
        assert raw == delivered == followed, (raw, delivered, followed)
        mode = "JSON chunks (--json)" if json_only else "log frames"
        print(f"log_bytes: {delivered / 1e6:.0f} MB ({expected} lines, {chunks.count()} chunks as {mode}, "
              f"all once and in order)")
        print(f"load_average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"raw_paramiko_cat: {raw / raw_seconds / 1e6:.0f} MB/s")
        print(f"supervisor_follow_stream: {followed / follow_seconds / 1e6:.0f} MB/s")
        print(f"worker_log_delivery: {(delivered - first_request) / seconds / 1e6:.1f} MB/s")
        if catch_up:
            after = chunks.filter(id__gt=restart_after).order_by("id")
            begun = after.first().created_at
            caught = sum(len(c.data.encode()) for c in after.filter(created_at__gt=begun + timedelta(milliseconds=5))
                         .iterator(chunk_size=50))
            span = (after.last().created_at - begun).total_seconds()
            print(f"worker_catch_up_delivery: {caught / 1e6:.1f} MB of a written log in {span:.2f} s = "
                  f"{caught / span / 1e6:.1f} MB/s ({after.count()} chunks; the restarted worker, from its first request's "
                  f"rows to its last)")
        wrote_from, wrote_to = (float(x) for x in times.read_text().split())
        print(f"job_write_rate: {delivered / (wrote_to - wrote_from) / 1e6:.0f} MB/s (the job printing into its log)")
        print(f"last_chunk_after_job_end: {last.timestamp() - wrote_to:.2f} s")
        print(f"worker_log_delivery_vs_raw_cat: {((delivered - first_request) / seconds) / (raw / raw_seconds):.2f} ratio")
        if catch_up:
            print(f"worker_catch_up_vs_raw_cat: {(caught / span) / (raw / raw_seconds):.2f} ratio")
        said = [line.split("job ", 1)[-1] for line in Path(log.name).read_text(errors="replace").splitlines()
                if "MB of logs in" in line]
        print(f"worker_says: {said[-1] if said else '(no MB/s line)'}")
        if profiles:
            stats = pstats.Stats(profiles[0])
            for more in profiles[1:]:
                stats.add(more)
            print(f"server profile of {len(profiles)} log requests (cumulative, top 25):")
            stats.sort_stats("cumulative").print_stats(25)
            stats.sort_stats("tottime").print_stats(12)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
        time.sleep(3)  # the worker's last long-polls end on the server before its database goes
        import logging

        logging.getLogger("django.request").setLevel(logging.CRITICAL)
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    if str(user_dir).encode() in open(f"/proc/{name}/cmdline", "rb").read():
                        os.kill(int(name), signal.SIGKILL)
                except OSError:
                    pass
        server.terminate()
        sshd.stop()
        shutil.rmtree(user_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
