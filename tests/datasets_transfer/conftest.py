"""Fixtures of the dataset transfer tests: versions made on the server's storage, the cache program
run as a local process, and (for the end-to-end tests) the jobs of tests/agent_e2e_jobs with input
versions (created through jobs.services.create_job with `input_datasets`, as the API and the New job
form do)."""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from datasets import services
from datasets.models import Dataset, DatasetFile
from mado.services import Actor

PROGRAM = str(Path(__file__).resolve().parents[2] / "worker_agent" / "target" / "dataset_cache.py")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_of(files: dict[str, bytes]) -> list[dict]:
    return sorted(({"path": p, "sha256": sha(d), "size": len(d)} for p, d in files.items()), key=lambda i: i["path"])


def digest_of(files: dict[str, bytes]) -> str:
    lines = "".join(f"{i['sha256']} {i['size']} {i['path']}\n" for i in manifest_of(files))
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


def sample_files(small: int, big_bytes: int, seed: str = "a", small_bytes: int = 0) -> dict[str, bytes]:
    """`small` small files in a few directories (one with a non-ASCII and a long name) and one big one.
    The small files are a few hundred bytes each, or `small_bytes` each when given (all different)."""
    def small_file(i: int) -> bytes:
        text = f"{seed}:{i}:".encode()
        return (text * (small_bytes // len(text) + 1))[:small_bytes] if small_bytes else text * (1 + i % 40)

    files = {f"part-{i % 7}/item-{i:05d}.txt": small_file(i) for i in range(small)}
    files["labels/ラベル.json"] = json.dumps({"seed": seed}).encode()
    files["deep/" + "n" * 120 + ".bin"] = seed.encode() * 3
    if big_bytes:
        block = hashlib.sha256(seed.encode()).digest() * 32768  # 1 MiB
        files["big/audio.bin"] = (block * (big_bytes // len(block) + 1))[:big_bytes]
    return files


def make_version(user, project, name: str, files: dict[str, bytes]):
    """A complete version whose bytes are put straight into the server's storage (as an upload would)."""
    actor = Actor(user)
    dataset = Dataset.objects.filter(project=project, name=name).first() or \
        services.create_dataset(actor, project, {"name": name})
    version, _ = services.create_version(actor, dataset, manifest_of(files))
    by_sha = {sha(d): d for d in files.values()}
    for stored in DatasetFile.objects.filter(project=project, complete=False, sha256__in=list(by_sha)):
        relative = f"datasets/{project.pk}/files/{stored.sha256[:2]}/{stored.sha256}"
        target = services.media(relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(by_sha[stored.sha256])
        stored.file.name, stored.received_bytes, stored.complete = relative, stored.size, True
        stored.save()
    return services.complete_version(actor, version)


# -- the cache program as a local process ---------------------------------------------------------

def tar_of(files: dict[str, bytes], corrupt: str | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w|", format=tarfile.PAX_FORMAT) as archive:
        for item in manifest_of(files):
            data = files[item["path"]]
            if item["path"] == corrupt:
                data = bytes([data[0] ^ 0x01]) + data[1:]
            info = tarfile.TarInfo(item["path"])
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def header(files: dict[str, bytes], *, job_id=1, limit=1 << 30, version_id=7, mode="relay", **extra) -> dict:
    return {"job_id": job_id, "mode": mode, "limit_bytes": limit,
            "version": {"id": version_id, "digest": digest_of(files), "total_size": sum(map(len, files.values())),
                        "file_count": len(files)}, **extra}


def finish(proc: subprocess.Popen, data: bytes | None = None) -> bytes:
    """Write `data`, close stdin and read stdout to its end through the same buffered reader that
    read the first line (communicate() would skip what that reader holds already)."""
    def feed():
        try:
            if data:
                proc.stdin.write(data)
            proc.stdin.close()
        except BrokenPipeError:
            pass

    writer = threading.Thread(target=feed)
    writer.start()
    out = proc.stdout.read()
    writer.join()
    proc.wait(timeout=60)
    return out


class Cache:
    """`<working_dir>/.mmt-cache/datasets` of a fake target in a temporary directory."""

    def __init__(self, working_dir: Path):
        self.working_dir = working_dir
        self.root = working_dir / ".mmt-cache" / "datasets"

    def start(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-I", PROGRAM, *args, str(self.root)] if args[0] != "release"
                                else [sys.executable, "-I", PROGRAM, args[0], str(self.root), *args[1:]],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def ensure(self, files: dict[str, bytes], *, corrupt: str | None = None, **kw) -> tuple[list[dict], dict]:
        """Run `ensure` as the relay does; returns (the progress lines, the answer)."""
        proc = self.start("ensure")
        proc.stdin.write((json.dumps(header(files, **kw)) + "\n").encode())
        proc.stdin.flush()
        first = json.loads(proc.stdout.readline())
        data = None
        if first.get("state") == "send":
            data = (json.dumps(manifest_of(files)) + "\n").encode() + tar_of(files, corrupt)
        out = finish(proc, data)
        lines = [first] + [json.loads(line) for line in out.decode().splitlines() if line.strip()]
        return lines[:-1], lines[-1]

    def run(self, *args: str) -> dict:
        proc = self.start(*args)
        out, _ = proc.communicate(b"", timeout=60)
        return json.loads(out.decode().strip().splitlines()[-1])

    def entry(self, files: dict[str, bytes]) -> Path:
        return self.root / digest_of(files).removeprefix("sha256:")

    def job_state(self, job_id, status: str) -> None:
        """The supervisor's state.json of a job: what decides whether its pins still hold."""
        directory = self.working_dir / ".mmt" / "jobs" / str(job_id)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "state.json").write_text(json.dumps({"status": status}))


@pytest.fixture
def cache(tmp_path) -> Cache:
    return Cache(tmp_path / "work")


def create_job_with_inputs(e2e, versions, **data):
    """A job as the API and the New job form make it: its input versions checked and recorded with it."""
    from jobs import services as job_services

    body = {"computer": e2e.computer.pk, "runtime": "python", "input_datasets": [v.pk for v in versions], **data}
    return job_services.create_job(Actor(e2e.world.member), e2e.world.project, body)


def tree(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def writable_bits(directory: Path) -> list[str]:
    return [str(p) for p in [directory, *directory.rglob("*")] if os.stat(p).st_mode & 0o222]


from tests.agent_e2e_jobs.conftest import e2e  # noqa: E402,F401  (the shared end-to-end fixture)
from tests.peers.sshd import sshd  # noqa: E402,F401

CHECK_JOB = '''\
import hashlib, json, os, sys
params = json.load(open(os.environ["MMT_PARAMETERS_FILE"]))
dirs = json.loads(os.environ["MMT_INPUT_DATASET_DIRS"])
info = json.load(open(os.environ["MMT_DATASET_VERSIONS_FILE"]))["items"]
assert sorted(dirs) == sorted(str(i["id"]) for i in info) == sorted(params["manifests"]), (dirs, info)
checked = 0
for vid, manifest in params["manifests"].items():
    root = dirs[vid]
    found = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
    if found != sorted(i["path"] for i in manifest):
        print("FILES DIFFER", vid); sys.exit(3)
    for item in manifest:
        digest = hashlib.sha256()
        with open(os.path.join(root, item["path"]), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != item["sha256"]:
            print("MISMATCH", item["path"]); sys.exit(3)
        checked += 1
    try:
        open(os.path.join(root, manifest[0]["path"]), "ab")
        print("WRITABLE"); sys.exit(4)
    except PermissionError:
        pass
places = sorted(set(os.path.dirname(d) for d in dirs.values()))
print(f"verified {checked} files of versions {sorted(dirs)} in {places}")
'''


def checking_job(e2e, versions, **data):
    """A job that checks the sha256 of every file of its inputs itself, through MMT_INPUT_DATASET_DIRS."""
    script = e2e.working_dir / "check_inputs.py"
    if not script.exists():
        e2e.script("check_inputs.py", CHECK_JOB)
    manifests = {str(v.pk): v.manifest() for v in versions}
    return create_job_with_inputs(e2e, versions, command=["python", str(script)],
                                  parameters={"manifests": manifests}, **data)
