"""Outputs throughput (issue 18, item 1): a real job on a loopback sshd target writes `--small` outputs of
1 KiB each (default 10,000) and one of `--large-mib` MiB (default 500), declared through an artifacts
manifest (seed 001); a real `mado-tracking-worker run` lists them, sends the small ones many to a request
(PUT worker/jobs/{id}/artifacts-batch) and the large one in resumable parts, until the job has ended with
every artifact stored. Every stored file is then checked against its declared sha256.

Figures: the upload (from the moment the job's process finished writing until the job ended: listing
with sha256 on the target, the declaration, the uploads, the completion), the time until every small file
was stored, and the whole job from its creation. Baseline in the same run: `tar c | ssh target 'tar x'`
of the same outputs directory with the OpenSSH client, and the ratio baseline / upload.

    .venv/bin/python bench/outputs_throughput.py [--small 10000] [--large-mib 500]

The server runs as docs/deployment.md says (gunicorn gthread 2 processes x 8 threads, MADO_DEBUG=false,
PostgreSQL) on a database this script creates and drops (bench/harness.py). Needs root (sshd and its
login user `mmt`, as the e2e tests). Prints `name: value unit` lines and the load average; asserts
correctness, never speed."""
from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from harness import PG, ensure_gunicorn, free_port, own_database, start, stop, wait_ready, wait_until  # noqa: E402

TAG = uuid.uuid4().hex[:8]
DB = f"mado_bench_outputs_{TAG}"
VAR = Path(tempfile.mkdtemp(prefix="mado-bench-outputs-"))
BIN = Path(sys.executable).parent
SERVER_ENV = {
    "MADO_DATABASE_URL": f"{PG}/{DB}",
    "MADO_DEBUG": "false",
    "MADO_DEV_MODE": "false",
    "MADO_DB_CONN_MAX_AGE": "60",
    "MADO_SECRET_KEY": secrets.token_urlsafe(64),
    "MADO_ALLOWED_HOSTS": "127.0.0.1,localhost",
    "MADO_VAR_DIR": str(VAR / "var"),
}
os.environ.update(SERVER_ENV)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mado.settings")
ENDED = ("finished", "failed", "canceled")
GOAL_SMALL_SECONDS = 15  # issue 18: 10,000 small files end to end
GOAL_RATIO = 0.5

# argv: small count, large MiB, the file that gets the time the writing ended.
WRITES = """\
import hashlib, json, os, sys, time
out = os.environ["MMT_OUTPUTS_DIR"]
count, large_mib, stamp = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
lines = []
for i in range(count):
    path = f"small/{i // 1000:02d}/f{i:05d}.bin"
    data = (hashlib.sha256(str(i).encode()).digest() * 32)[:1024]
    os.makedirs(os.path.join(out, os.path.dirname(path)), exist_ok=True)
    with open(os.path.join(out, path), "wb") as f:
        f.write(data)
    lines.append(json.dumps({"path": path, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}))
if large_mib:
    block, digest = os.urandom(1 << 20), hashlib.sha256()
    with open(os.path.join(out, "large.bin"), "wb") as f:
        for _ in range(large_mib):
            f.write(block)
            digest.update(block)
    lines.append(json.dumps({"path": "large.bin", "sha256": digest.hexdigest(), "size": large_mib << 20}))
with open(os.path.join(out, "artifacts.jsonl"), "w") as f:
    f.write("\\n".join(lines) + "\\n")
with open(os.environ["MMT_RESULT_FILE"], "w") as f:
    json.dump({"version": 2, "complete": True, "artifactsManifest": "artifacts.jsonl"}, f)
open(stamp, "w").write(repr(time.time()))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=10_000, help="outputs of 1 KiB (default 10000)")
    parser.add_argument("--large-mib", type=int, default=500, help="size of the one large output (default 500)")
    args = parser.parse_args()
    ensure_gunicorn()
    processes: list = []
    sshd = None
    try:
        with own_database(DB):
            from tests.peers.sshd import start_sshd

            sshd = start_sshd()
            run(args.small, args.large_mib, sshd, processes)
    finally:
        for process in processes:
            stop(process)
        if sshd is not None:
            sshd.stop()
        shutil.rmtree(VAR, ignore_errors=True)


def run(small: int, large_mib: int, sshd, processes: list) -> None:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import transaction

    from computers.models import ComputeTarget
    from jobs import services as job_services
    from jobs.models import Artifact, Job
    from mado.services import Actor
    from tests.conftest import World

    call_command("migrate", verbosity=0)
    world = World()
    owner = (sshd.home.stat().st_uid, sshd.home.stat().st_gid)
    work = sshd.home / f"bench-outputs-{TAG}"
    (work / "marks").mkdir(parents=True)
    work.chmod(0o755)
    (work / "marks").chmod(0o777)
    for path in (work, work / "marks"):
        os.chown(path, *owner)
    script = work / "writes.py"
    script.write_text(WRITES)
    os.chown(script, *owner)
    computer = ComputeTarget.objects.create(
        owner=world.global_admin, name=f"sshd-{TAG}", kind="ssh", visibility="public", enabled=True,
        host="127.0.0.1", port=sshd.port, ssh_user=sshd.user, ssh_key_path=str(sshd.key_path),
        known_hosts_path=str(sshd.known_hosts_path), working_dir=str(work), python_path="/usr/bin/python3",
        runtimes=["python"], gpu_ids=[], concurrency=1)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (VAR / "var").mkdir(exist_ok=True)
    server = start([str(BIN / "gunicorn"), "mado.wsgi", "--bind", f"127.0.0.1:{port}", "--worker-class", "gthread",
                    "--workers", "2", "--threads", "8", "--timeout", "600", "--log-level", "warning"],
                   dict(os.environ, MADO_PUBLIC_URL=url), VAR / "server.log")
    processes.append(server)
    wait_ready(server, f"{url}/api/health", VAR / "server.log")
    home = VAR / "worker-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MMT_", "MADO_", "DJANGO_"))}
    env.update(HOME=str(home), MMT_API_URL=url, MMT_API_TOKEN=world.worker_token, MMT_WORKER_ID=f"bench-{TAG}",
               MMT_WORKER_STATE_DIR=str(VAR / "worker-state"), MMT_WORKER_SSH_DIR=str(sshd.client_dir),
               MMT_LOG_LEVEL="info", MMT_WORKER_MAX_OUTPUT_FILES=str(max(small + 10, 10_000)))
    worker_log = VAR / "worker.log"
    processes.append(start([str(BIN / "mado-tracking-worker"), "run"], env, worker_log))

    stamp = work / "marks" / "written"
    created = time.time()
    with transaction.atomic():
        job = job_services.create_job(Actor(world.member), world.project, {
            "computer": computer.pk, "runtime": "python",
            "command": ["python", str(script), str(small), str(large_mib), str(stamp)]})
    written = float(wait_until(lambda: stamp.exists() and stamp.read_text(), 3600, "the job to write its outputs",
                               interval=0.05))
    small_done = None
    deadline = time.monotonic() + 3600
    while Job.objects.filter(pk=job.pk).values_list("status", flat=True)[0] not in ENDED:
        if small_done is None and Artifact.objects.filter(job_id=job.pk, complete=True, size__lte=1024).count() == small:
            small_done = time.time()
        if time.monotonic() > deadline:
            raise SystemExit(f"the job did not end; see {worker_log}")
        time.sleep(0.05)
    ended = time.time()
    job = Job.objects.get(pk=job.pk)
    if job.status != "finished":
        print(worker_log.read_text()[-3000:], file=sys.stderr)
        raise SystemExit(f"the job ended {job.status}: {job.error}")
    small_done = small_done or ended
    artifacts = list(Artifact.objects.filter(job_id=job.pk))
    assert len(artifacts) == small + (1 if large_mib else 0), len(artifacts)
    total = 0
    for artifact in artifacts:
        assert artifact.complete, artifact.path
        digest = hashlib.sha256()
        with artifact.file.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        assert digest.hexdigest() == artifact.sha256, artifact.path
        total += artifact.size

    # Baseline: the same outputs directory through the OpenSSH client into a directory on the target.
    outputs = work / ".mmt" / "jobs" / str(job.pk) / "outputs"
    if not (outputs / "artifacts.jsonl").exists():
        raise SystemExit(f"the job's outputs are not at {outputs} for the baseline")
    copy = work / "baseline-copy"
    ssh = ["ssh", "-q", "-i", str(sshd.key_path), "-o", f"UserKnownHostsFile={sshd.known_hosts_path}",
           "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-p", str(sshd.port), f"{sshd.user}@127.0.0.1",
           f"mkdir -p {copy} && tar x -C {copy}"]
    began = time.monotonic()
    subprocess.run(f"tar c -C {shlex.quote(str(outputs))} . | {shlex.join(ssh)}", shell=True, check=True)
    baseline = time.monotonic() - began
    assert (copy / "artifacts.jsonl").exists()

    upload = ended - written
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"outputs: {small} of 1 KiB and {'one of ' + str(large_mib) + ' MiB' if large_mib else 'no large one'}, "
          f"{total / 1e6:.1f} MB in all, bit-exact on the server")
    print(f"load_average: {load} (1, 5, 15 min; {os.cpu_count()} cores)")
    print(f"job_total: {ended - created:.1f} s (created to ended, writing included)")
    print(f"upload_end_to_end: {upload:.1f} s (writing ended to job ended: listing, declaration, uploads, completion)")
    print(f"small_files_stored: {small_done - written:.1f} s (writing ended to all {small} small files stored; "
          f"goal ≤ {GOAL_SMALL_SECONDS} s for 10,000)")
    for name, seconds in phases(worker_log.read_text(errors="replace"), job.pk, written, ended):
        print(f"{name}: {seconds:.1f} s")
    print(f"upload_throughput: {total / upload / 1e6:.1f} MB/s")
    print(f"tar_pipe_ssh_tar: {baseline:.1f} s ({total / baseline / 1e6:.1f} MB/s)")
    print(f"upload_vs_tar_ssh: {baseline / upload:.2f} ratio (goal ≥ {GOAL_RATIO})")


def phases(log: str, job_id: int, written: float, ended: float) -> list[tuple[str, float]]:
    """Where the upload's time goes, from the worker's log lines of the job (their asctime)."""
    marks = {}
    for line in log.splitlines():
        if f"job {job_id}: " not in line:
            continue
        try:
            moment = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        if "result.json accepted" in line:
            marks.setdefault("accepted", moment)
        elif "small output(s)" in line:
            marks["small"] = moment
        elif "Uploaded large.bin" in line:
            marks["large"] = moment
    if "accepted" not in marks:
        return []
    out = [("phase_exit_listing_declaration", marks["accepted"] - written)]
    last = marks["accepted"]
    for key, name in (("small", "phase_small_batches"), ("large", "phase_large_file")):
        if key in marks:
            out.append((name, marks[key] - last))
            last = marks[key]
    out.append(("phase_completion", ended - last))
    return out


if __name__ == "__main__":
    main()
