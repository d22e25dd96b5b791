"""Thousands of outputs (seed 001, "When there are thousands of output files"; issue 18): a real job on the
loopback sshd writes 2,000 small files and one larger than a batch takes, declared through an artifacts
manifest; a real `mado-tracking-worker run` sends the small ones many to a request and the large one
alone, and every file arrives bit-exact. Killed in the middle of a batch, the worker started again
resumes from what the server confirmed: no confirmed file is sent twice, nothing unverified is complete."""
from __future__ import annotations

import hashlib
import threading
from collections import Counter

from jobs import outputs
from jobs.models import Artifact
from tests.agent_e2e_jobs.conftest import wait_until

WRITES = """\
import hashlib, json, os, sys
out = os.environ["MMT_OUTPUTS_DIR"]
count, large = int(sys.argv[1]), int(sys.argv[2])

def content(i):
    return hashlib.sha256(str(i).encode()).digest() * (i % 9) + f"file {i}\\n".encode()

entries = [(f"part{i // 100}/f{i:05d}.bin", content(i)) for i in range(count)]
if large:
    entries.append(("big/large.bin", bytes(range(256)) * (large // 256)))
with open(os.path.join(out, "artifacts.jsonl"), "w") as manifest:
    for path, data in entries:
        os.makedirs(os.path.join(out, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(out, path), "wb") as f:
            f.write(data)
        manifest.write(json.dumps({"path": path, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}) + "\\n")
with open(os.environ["MMT_RESULT_FILE"], "w") as f:
    json.dump({"version": 2, "complete": True, "artifactsManifest": "artifacts.jsonl"}, f)
"""


def content(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (i % 9) + f"file {i}\n".encode()


def expected(count: int, large: int) -> dict[str, bytes]:
    files = {f"part{i // 100}/f{i:05d}.bin": content(i) for i in range(count)}
    if large:
        files["big/large.bin"] = bytes(range(256)) * (large // 256)
    return files


def assert_stored_bit_exact(job, files: dict[str, bytes]) -> None:
    artifacts = {a.path: a for a in Artifact.objects.filter(job_id=job.pk)}
    assert sorted(artifacts) == sorted(files)
    for path, data in files.items():
        artifact = artifacts[path]
        assert artifact.complete and artifact.received_bytes == len(data), path
        with artifact.file.open("rb") as stored:
            assert stored.read() == data, f"{path} differs from what the job wrote"


def test_two_thousand_outputs_and_a_large_one_arrive_bit_exact(e2e, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    script = e2e.script("writes.py", WRITES)
    e2e.start_worker()
    job = e2e.create_job(command=["python", str(script), "2000", str(9 << 20)])
    ended = e2e.wait_ended(job, timeout=600)
    assert (ended.status, ended.error) == ("finished", ""), e2e.worker_output()[-3000:]
    assert_stored_bit_exact(job, expected(2000, 9 << 20))
    assert "Uploaded 2000 of 2000 small output(s)" in e2e.worker_output()


def test_a_worker_killed_in_the_middle_of_a_batch_resumes_without_resending_what_was_confirmed(
        e2e, settings, tmp_path, monkeypatch):
    settings.MEDIA_ROOT = tmp_path / "media"
    arrivals: Counter[str] = Counter()
    first_request_over = threading.Event()
    worker = e2e.start_worker()
    receive_entry, receive_batch = outputs._receive_entry, outputs.receive_batch

    def counted_entry(readable, part, target, path, size, digest):
        arrivals[path] += 1
        if sum(arrivals.values()) == 300 and not first_request_over.is_set():
            worker.kill()  # in the middle of the first batch, as a crash or a power cut would
        receive_entry(readable, part, target, path, size, digest)

    def observed_batch(job, readable, length):
        try:
            return receive_batch(job, readable, length)
        finally:
            first_request_over.set()

    monkeypatch.setattr(outputs, "_receive_entry", counted_entry)
    monkeypatch.setattr(outputs, "receive_batch", observed_batch)
    script = e2e.script("writes.py", WRITES)
    job = e2e.create_job(command=["python", str(script), "2000", "0"])
    wait_until(first_request_over.is_set, timeout=300, what=f"the first batch (worker: {worker.output()[-2000:]})")
    assert worker.process.wait(timeout=30) is not None
    confirmed = set(Artifact.objects.filter(job_id=job.pk, complete=True).values_list("path", flat=True))
    assert 300 <= len(confirmed) < 2000, len(confirmed)

    e2e.start_worker()
    ended = e2e.wait_ended(job, timeout=600)
    assert (ended.status, ended.error) == ("finished", ""), e2e.worker_output()[-3000:]
    assert_stored_bit_exact(job, expected(2000, 0))
    assert not [p for p in confirmed if arrivals[p] != 1], "a confirmed file was sent again"
    assert sum(arrivals.values()) < 2000 + 1000, "at most the unconfirmed rest of the cut batch came twice"
    assert not list((tmp_path / "media" / "partial").glob("batch-*")), "a partial file was left"
