"""Many small artifacts in one request (PUT worker/jobs/{id}/artifacts-batch): each file verified against
its declaration as it arrives, bad input refused with what to fix and nothing unverified marked
complete, a cut batch resumed by the declaration sent again, and the job page's upload progress line."""
from __future__ import annotations

import hashlib
import json

import pytest
from rest_framework.test import APIClient

from jobs import outputs
from jobs.models import Artifact
from tests.conftest import assert_error
from tests.job_fixtures import job_request
from worker_agent import remote_files
from worker_agent.core import lifecycle
from worker_agent.core import outputs as core_outputs
from worker_agent.core.api import ApiError, Unavailable


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


FILES = {f"out/{i:03d}.txt": f"line {i}\n".encode() * (i + 1) for i in range(30)}


def declaration(files: dict[str, bytes]) -> dict:
    manifest = "".join(json.dumps({"path": p, "sha256": sha(d), "size": len(d)}) + "\n" for p, d in files.items())
    listing = [{"path": p, "size": len(d), "sha256": sha(d), "kind": "file"} for p, d in files.items()]
    listing.append({"path": "artifacts.jsonl", "size": len(manifest.encode()), "sha256": sha(manifest.encode()),
                    "kind": "file"})
    return {"result": json.dumps({"version": 2, "complete": True, "artifactsManifest": "artifacts.jsonl"}),
            "files": listing, "manifest": manifest}


def frames(files: dict[str, bytes], sizes: dict[str, int] | None = None) -> bytes:
    return b"".join(core_outputs.frame_header(p, (sizes or {}).get(p, len(d))) + d for p, d in files.items())


@pytest.fixture
def declared(world, gpu_box, job_worker, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    client = APIClient()
    client.force_login(world.member)
    client.post("/api/projects/lab/jobs", job_request(gpu_box), format="json")
    item = job_worker.claim()
    answer = job_worker.leased(item, "outputs", **declaration(FILES))
    assert answer.status_code == 200, answer.content
    return item


def put_batch(worker, item, body: bytes, **headers):
    return worker.client.put(f"/api/worker/jobs/{item['id']}/artifacts-batch?worker_id={worker.worker_id}"
                             f"&lease_id={item['lease_id']}", data=body, content_type="application/octet-stream",
                             **headers)


def stored(item) -> dict[str, bytes]:
    return {a.path: a.file.read() for a in Artifact.objects.filter(job_id=item["id"], complete=True)}


def test_a_batch_stores_every_file_bit_exact_and_the_job_finishes(world, declared, job_worker):
    answer = put_batch(job_worker, declared, frames(FILES))
    assert answer.status_code == 200, answer.content
    assert sorted(answer.json()["confirmed"]) == sorted(FILES)
    assert stored(declared) == FILES
    assert job_worker.leased(declared, "outputs", **declaration(FILES)).json()["upload"] == []
    assert job_worker.complete(declared).status_code == 200


def test_files_already_stored_are_read_past_and_confirmed(world, declared, job_worker):
    first = dict(list(FILES.items())[:10])
    assert put_batch(job_worker, declared, frames(first)).status_code == 200
    answer = put_batch(job_worker, declared, frames(FILES))
    assert sorted(answer.json()["confirmed"]) == sorted(FILES)
    assert answer.json()["received_bytes"] == sum(len(d) for p, d in FILES.items() if p not in first)
    assert stored(declared) == FILES


@pytest.mark.parametrize("case, status, code", [
    ("wrong_sha", 422, "sha256_mismatch"),
    ("wrong_size", 422, "size_mismatch"),
    ("undeclared", 422, "artifact_not_declared"),
    ("traversal", 422, "artifact_not_declared"),
    ("bad_header", 422, "invalid_batch"),
    ("lone_surrogate", 422, "invalid_batch"),
    ("truncated", 400, "batch_truncated"),
])
def test_bad_input_is_refused_with_what_to_fix_and_only_verified_files_are_complete(
        world, declared, job_worker, case, status, code):
    good = dict(list(FILES.items())[:5])
    bad_path = "out/005.txt"
    if case == "wrong_sha":
        bad = core_outputs.frame_header(bad_path, len(FILES[bad_path])) + b"X" * len(FILES[bad_path])
    elif case == "wrong_size":
        bad = core_outputs.frame_header(bad_path, len(FILES[bad_path]) + 1) + FILES[bad_path] + b"\n"
    elif case == "undeclared":
        bad = core_outputs.frame_header("out/other.txt", 3) + b"abc"
    elif case == "traversal":
        bad = core_outputs.frame_header("../../etc/passwd", 3) + b"abc"
    elif case == "bad_header":
        bad = b"not a header\n" + FILES[bad_path]
    elif case == "lone_surrogate":  # valid JSON, but a path no file system, database or answer can hold
        bad = b'{"path": "out/\\ud800.txt", "size": 3}\n' + b"abc"
    else:
        bad = core_outputs.frame_header(bad_path, len(FILES[bad_path])) + FILES[bad_path][:7]
    body = assert_error(put_batch(job_worker, declared, frames(good) + bad + frames({"out/006.txt": FILES["out/006.txt"]})
                                  if case != "truncated" else frames(good) + bad), status, code)
    if case not in ("bad_header", "lone_surrogate"):
        assert ("out/" in body["error"] or "passwd" in body["error"]), body
    assert stored(declared) == good, "what was verified before the bad file stays, nothing after it"
    assert not list((outputs.media("partial")).glob("batch-*")), "no partial file is left"
    assert not (outputs.media("") / "etc").exists()
    pending = job_worker.leased(declared, "outputs", **declaration(FILES)).json()["upload"]
    assert sorted(pending) == sorted(set(FILES) - set(good))


def test_too_many_files_or_bytes_in_one_batch_get_413(world, declared, job_worker, monkeypatch):
    monkeypatch.setattr(outputs, "BATCH_MAX_FILES", 3)
    assert_error(put_batch(job_worker, declared, frames(FILES)), 413, "batch_too_large")
    assert len(stored(declared)) == 3
    monkeypatch.setattr(outputs, "BATCH_MAX_BYTES", 10)
    assert_error(put_batch(job_worker, declared, b"x" * (10 + 3 * outputs.BATCH_HEADER_MAX + 1)), 413,
                 "batch_too_large")


def test_a_worker_holding_an_ended_jobs_old_lease_writes_no_more_outputs(world, declared, job_worker):
    first = dict(list(FILES.items())[:2])
    assert put_batch(job_worker, declared, frames(first)).status_code == 200
    assert job_worker.complete(declared, status="failed", exit_code=3).status_code == 200
    rest = dict(list(FILES.items())[2:4])
    assert_error(put_batch(job_worker, declared, frames(rest)), 409, "job_ended")
    path = "out/002.txt"
    single = job_worker.client.put(f"/api/worker/jobs/{declared['id']}/artifacts/{path}?worker_id="
                                   f"{job_worker.worker_id}&lease_id={declared['lease_id']}", data=FILES[path],
                                   content_type="application/octet-stream")
    assert_error(single, 409, "job_ended")
    assert stored(declared) == first, "the failed job's outputs are what it had sent before it ended"


def test_a_cut_batch_resumes_without_sending_a_confirmed_file_again(world, declared, job_worker, monkeypatch):
    """lifecycle.send_outputs against this server: the first batch breaks off after 12 files (the
    connection cut); the declaration sent again lists only the rest, and no file arrives twice."""
    arrivals: list[str] = []
    receive = outputs._receive_entry

    def counted(readable, part, target, path, size, digest):
        arrivals.append(path)
        receive(readable, part, target, path, size, digest)

    monkeypatch.setattr(outputs, "_receive_entry", counted)
    monkeypatch.setattr(lifecycle, "BATCH_FILES", 20)
    listing = declaration(FILES)
    calls = []

    def declare(result, files, manifest):
        answer = job_worker.leased(declared, "outputs", result=result, files=files, manifest=manifest)
        return answer.json()

    def upload_batch(files):
        calls.append(len(files))
        body = frames({f["path"]: FILES[f["path"]] for f in files})
        if len(calls) == 1:  # the connection breaks after 12 files
            cut = len(frames({f["path"]: FILES[f["path"]] for f in files[:12]})) + 5
            put_batch(job_worker, declared, body[:cut])
            raise Unavailable("Cannot reach the API server (ConnectionError).")
        answer = put_batch(job_worker, declared, body)
        if answer.status_code != 200:
            raise ApiError(answer.json()["error"], status=answer.status_code, code=answer.json()["code"])
        return answer.json()

    completion = lifecycle.send_outputs(
        {"files": listing["files"], "result": listing["result"].encode(), "manifest": listing["manifest"].encode()},
        max_files=10_000, limit_setting=None, declare=declare, upload_batch=upload_batch, pause=lambda s: None,
        upload=lambda *a: pytest.fail("no file goes alone"), note=lambda text, level: None)
    assert completion == lifecycle.FINISHED
    assert sorted(arrivals) == sorted(FILES) and len(arrivals) == len(FILES), "each file arrived once"
    assert calls == [20, 18], "the second batch holds the 8 unconfirmed of the first and the 10 after it"
    assert stored(declared) == FILES


def test_the_job_page_shows_the_upload_progress_while_files_arrive(world, declared, job_worker):
    client = APIClient()
    client.force_login(world.member)
    put_batch(job_worker, declared, frames(dict(list(FILES.items())[:10])))
    total = len(FILES)
    assert outputs.upload_progress(Artifact.objects.get(path="out/000.txt").job) == {
        "files": 10, "total_files": total, "bytes": sum(len(d) for d in list(FILES.values())[:10]),
        "total_bytes": sum(a.size for a in Artifact.objects.filter(job_id=declared["id"]))}
    page = client.get(f"/projects/lab/jobs/{declared['id']}/").content.decode()
    assert f"Uploading outputs: 10 of {total} files" in page, page[:2000]


def test_the_targets_program_and_the_in_process_frames_are_the_same_bytes_and_a_short_source_raises(tmp_path):
    """The `files` program's frames (run on an SSH target) and iter_frames (the site runner) send the same
    frames; a file that shrank since it was listed is padded to its listed size, so the frames stay aligned
    and the server's sha256 check refuses it; a source that ends early raises instead of sending less."""
    import subprocess
    import sys

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "a.txt").write_bytes(b"hello")
    (tmp_path / "big.bin").write_bytes(bytes(range(256)) * 5000)
    files = [{"path": "out/a.txt", "size": 5}, {"path": "big.bin", "size": 256 * 5000}, {"path": "gone", "size": 3}]
    body = core_outputs.FramedBody(files, core_outputs.iter_frames(str(tmp_path), files))
    sent = b"".join(iter(lambda: body.read(8192), b""))
    assert len(sent) == len(body)
    ran = subprocess.run([sys.executable, "-I", "-S", "-c", remote_files.FILES.source, "frames", str(tmp_path)],
                         input=json.dumps(files).encode(), capture_output=True, check=True)
    assert ran.stdout == sent
    assert sent.endswith(core_outputs.frame_header("gone", 3) + b"\0\0\0")
    short = core_outputs.FramedBody(files, iter([sent[:100]]))
    with pytest.raises(OSError, match="ended"):
        while short.read(8192):
            pass
