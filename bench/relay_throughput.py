"""Relay throughput of input datasets: a 1 GiB version (1000 small files and one large file) goes
from the server through a real worker into the dataset cache of an SSH target (one tar over the
worker's SSH connection), next to `cat file | ssh target 'cat > file'` of the same number of bytes
measured in the same run with the OpenSSH client, and the ratio. Direct download is printed beside it: the
same version into a cold cache on the same target, fetched by the target itself with the job token from
the archive endpoint (one tar, `dataset_transfer = direct`).

    .venv/bin/python bench/relay_throughput.py [--mb 1024]

`--mb 200` is the issue's full-size check: the version is also verified bit-exact in the cache (every
file's sha256 against the manifest), and a second job must move 0 bytes. Needs PostgreSQL at
127.0.0.1:5432 (creates and drops its own database) and root (it starts an sshd with a login user
`mmt`, as the tests do). Prints `name: value unit` lines; asserts correctness, never speed."""
from __future__ import annotations

import argparse
import hashlib
import os
import re
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
SMALL_FILES = int(os.environ.get("BENCH_SMALL_FILES", "1000"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=1024, help="size of the version in MiB")
    args = parser.parse_args()

    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{DB}"')
    try:
        run(args.mb << 20)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        shutil.rmtree(os.environ["MADO_VAR_DIR"], ignore_errors=True)


def version_files(total: int) -> dict[str, bytes]:
    files = {f"clips/{i % 10}/clip-{i:05d}.bin": hashlib.sha256(str(i).encode()).digest() * 64
             for i in range(SMALL_FILES)}
    block = os.urandom(1 << 20)
    big = total - sum(map(len, files.values()))
    files["big/shard-000.bin"] = (block * (big // len(block) + 1))[:big]
    return files


def run(total: int) -> None:
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import transaction
    from django.test.testcases import LiveServerThread, _StaticFilesHandler

    call_command("migrate", verbosity=0)
    settings.MEDIA_ROOT = Path(os.environ["MADO_VAR_DIR"]) / "media"

    from computers.models import ComputeTarget
    from datasets import services
    from jobs import services as job_services
    from jobs.models import Job
    from mado.services import Actor
    from tests.conftest import World
    from tests.datasets_transfer.conftest import make_version
    from tests.peers.sshd import start_sshd

    import worker_api.views

    original = worker_api.views.worker_job_payload  # until jobs/serializers carries input_datasets itself
    worker_api.views.worker_job_payload = lambda job, token: {"input_datasets": services.claim_payload(job),
                                                         **original(job, token)}

    server = LiveServerThread("127.0.0.1", _StaticFilesHandler, connections_override={}, port=0)
    server.daemon = True
    server.start()
    server.is_ready.wait()
    sshd = start_sshd()
    world = World()
    owner = (sshd.home.stat().st_uid, sshd.home.stat().st_gid)
    work = sshd.home / f"bench-{uuid.uuid4().hex[:6]}"
    work.mkdir()
    os.chown(work, *owner)
    files = version_files(total)
    version = make_version(world.member, world.project, "bench", files)
    del files
    computer = ComputeTarget.objects.create(
        owner=world.global_admin, name="bench-sshd", kind="ssh", visibility="public", enabled=True,
        host="127.0.0.1", port=sshd.port, ssh_user=sshd.user, ssh_key_path=str(sshd.key_path),
        known_hosts_path=str(sshd.known_hosts_path), working_dir=str(work), python_path="/usr/bin/python3",
        runtimes=["python"], concurrency=1)
    var = Path(os.environ["MADO_VAR_DIR"])
    (var / "home").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MMT_", "MADO_"))}
    env.update(HOME=str(var / "home"), MMT_API_URL=f"http://127.0.0.1:{server.port}", MMT_API_TOKEN=world.worker_token,
               MMT_WORKER_ID="bench-worker", MMT_WORKER_STATE_DIR=str(var / "state"), MMT_WORKER_CLAIM_WAIT="2",
               MMT_LOG_LEVEL="info")
    log_path = var / "worker.log"
    log = open(log_path, "wb")
    worker = subprocess.Popen([str(Path(sys.executable).with_name("mado-tracking-worker")), "run"], env=env,
                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def job_moving(target=computer, mode="relay") -> tuple[int, float]:
        with transaction.atomic():
            job = job_services.create_job(Actor(world.member), world.project, {
                "computer": target.pk, "runtime": "python", "command": ["python", "-c", "pass"]})
            services.attach_inputs(job, [version])
        deadline = time.monotonic() + 3600
        while (job := Job.objects.get(pk=job.pk)).status not in ("finished", "failed", "canceled"):
            if time.monotonic() > deadline or worker.poll() is not None:
                raise SystemExit("the job did not end; see " + str(log_path))
            time.sleep(0.2)
        assert job.status == "finished", (job.status, job.error)
        found = re.findall(rf"job {job.pk}: .*?(?:fetched by {mode}: (\d+) bytes moved in ([\d.]+) s|(0) bytes moved)",
                           log_path.read_text())
        moved, seconds, zero = found[-1]
        return (int(moved), float(seconds)) if moved else (0, 0.0)

    def check_cache(directory: Path) -> None:
        data = directory / ".mmt-cache" / "datasets" / version.digest.removeprefix("sha256:") / "data"
        for item in version.manifest():
            digest = hashlib.sha256()
            with open(data / item["path"], "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            assert digest.hexdigest() == item["sha256"], item["path"]

    # Direct: the same version into another working directory (a cold cache), downloaded by the target
    # itself with the job token from the archive endpoint.
    settings.PUBLIC_URL = f"http://127.0.0.1:{server.port}"
    direct_work = sshd.home / f"bench-direct-{uuid.uuid4().hex[:6]}"
    direct_work.mkdir()
    os.chown(direct_work, *owner)
    direct_computer = ComputeTarget.objects.create(
        owner=world.global_admin, name="bench-sshd-direct", kind="ssh", visibility="public", enabled=True,
        host="127.0.0.1", port=sshd.port, ssh_user=sshd.user, ssh_key_path=str(sshd.key_path),
        known_hosts_path=str(sshd.known_hosts_path), working_dir=str(direct_work), python_path="/usr/bin/python3",
        runtimes=["python"], concurrency=1, dataset_transfer="direct")

    try:
        moved, seconds = job_moving()
        check_cache(work)
        again, _ = job_moving()
        assert again == 0, again
        direct_moved, direct_seconds = job_moving(direct_computer, "direct")
        check_cache(direct_work)

        source = var / "baseline.bin"
        with open(source, "wb") as f:
            for _ in range(total >> 20):
                f.write(os.urandom(1 << 20))
        ssh = ["ssh", "-q", "-i", str(sshd.key_path), "-o", f"UserKnownHostsFile={sshd.known_hosts_path}",
               "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-p", str(sshd.port),
               f"{sshd.user}@127.0.0.1", f"cat > {work}/baseline.bin"]
        started = time.monotonic()
        subprocess.run(f"cat {source} | " + " ".join(map(str, ssh)), shell=True, check=True)
        baseline = time.monotonic() - started
        assert (work / "baseline.bin").stat().st_size == source.stat().st_size

        print(f"version: {version.total_size / 2 ** 20:.0f} MiB in {version.file_count} files "
              f"(bit-exact in the cache; a second job moved 0 bytes)")
        print(f"relay_through_worker: {version.total_size / seconds / 1e6:.0f} MB/s ({moved} bytes on the SSH "
              f"channel in {seconds:.1f} s)")
        print(f"cat_pipe_ssh_cat: {source.stat().st_size / baseline / 1e6:.0f} MB/s ({baseline:.1f} s)")
        print(f"relay_vs_cat_ssh: {(version.total_size / seconds) / (source.stat().st_size / baseline):.2f} ratio")
        print(f"direct_download: {version.total_size / direct_seconds / 1e6:.0f} MB/s ({direct_moved} bytes from the "
              f"archive endpoint in {direct_seconds:.1f} s, bit-exact in a cold cache)")
        print(f"direct_vs_cat_ssh: {(version.total_size / direct_seconds) / (source.stat().st_size / baseline):.2f} "
              "ratio")
        print(f"load_average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
        time.sleep(3)
        server.terminate()
        sshd.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(direct_work, ignore_errors=True)


if __name__ == "__main__":
    main()
