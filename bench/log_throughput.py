"""Log delivery throughput: a job prints 200 MB of numbered lines on an SSH target; the worker follows
them over one stream and posts them to the server. Measured in the same run, on the same file:

- `raw_paramiko_cat`: a plain `cat stdout.log` over one paramiko channel (the yardstick, DESIGN §13)
- `supervisor_follow_stream`: the supervisor's framed follow stream alone, read to the end
- `worker_log_delivery`: first to last chunk stored by the server (follow + HTTP + PostgreSQL)

    .venv/bin/python bench/log_throughput.py [--mb 200]

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
    args = parser.parse_args()

    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{DB}"')
    try:
        run(args.mb)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')


def run(mb: int) -> None:
    import django

    django.setup()
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

    server = LiveServerThread("127.0.0.1", _StaticFilesHandler, connections_override={}, port=0)
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

    script.write_text(NUMBERED_LINES)
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
    worker = subprocess.Popen([str(Path(sys.executable).with_name("mado-tracking-worker")), "run"], env=env,
                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    size = mb * 10 ** 6
    try:
        with transaction.atomic():
            job = job_services.create_job(Actor(world.member), world.project, {
                "computer": computer.pk, "runtime": "python",
                "command": ["python", str(script), str(size)]})
        deadline = time.monotonic() + 1800
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
        seconds = (last - first).total_seconds()
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
        print(f"log_bytes: {delivered / 1e6:.0f} MB ({expected} lines, {chunks.count()} chunks, all once and in order)")
        print(f"raw_paramiko_cat: {raw / raw_seconds / 1e6:.0f} MB/s")
        print(f"supervisor_follow_stream: {followed / follow_seconds / 1e6:.0f} MB/s")
        print(f"worker_log_delivery: {delivered / seconds / 1e6:.1f} MB/s")
        print(f"worker_log_delivery_vs_raw_cat: {(delivered / seconds) / (raw / raw_seconds):.2f} ratio")
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
