"""Resumable uploads: parts, a part re-sent, gaps, wrong bytes; completion; ranged downloads; the digest."""
from __future__ import annotations

import hashlib
import os

import pytest

from datasets.models import DatasetFile, DatasetVersion
from tests.conftest import assert_error, bearer
from tests.datasets.conftest import manifest_of, sha
from worker_agent import results

BIG = os.urandom(300_000)
SMALL = b"transcript\n"


@pytest.fixture
def started(uploader):
    uploader.create_dataset("speech")
    created = uploader.create_version("speech", manifest_of({"audio/big.flac": BIG, "text/small.txt": SMALL}))
    assert created.status_code == 201, created.content
    return created.json()


def part(start, end, total=len(BIG)):
    return {"HTTP_CONTENT_RANGE": f"bytes {start}-{end}/{total}"}


def test_a_new_version_asks_for_every_file_and_is_uploading(started):
    assert started["status"] == "uploading" and started["number"] is None
    assert started["upload"] == [
        {"path": "audio/big.flac", "sha256": sha(BIG), "size": len(BIG), "received_bytes": 0},
        {"path": "text/small.txt", "sha256": sha(SMALL), "size": len(SMALL), "received_bytes": 0},
    ]


def test_parts_resume_a_resent_part_is_harmless_and_a_gap_names_the_offset(uploader, started):
    version = started["id"]
    first = uploader.put("speech", version, "audio/big.flac", BIG[:100_000], **part(0, 99_999))
    assert first.json() == {"path": "audio/big.flac", "sha256": sha(BIG), "size": len(BIG),
                            "received_bytes": 100_000, "complete": False}
    # The answer to a part was lost and the client sends it again: nothing changes.
    again = uploader.put("speech", version, "audio/big.flac", BIG[:100_000], **part(0, 99_999))
    assert again.json()["received_bytes"] == 100_000
    # A part that overlaps what the server has: the known bytes are skipped.
    overlap = uploader.put("speech", version, "audio/big.flac", BIG[50_000:200_000], **part(50_000, 199_999))
    assert overlap.json()["received_bytes"] == 200_000
    gap = uploader.put("speech", version, "audio/big.flac", BIG[250_000:], **part(250_000, len(BIG) - 1))
    body = assert_error(gap, 409, "range_mismatch")
    assert "resume the upload from byte 200000" in body["error"] and body["fields"]["received_bytes"] == ["200000"]
    # Asking again for the same version answers what the server has.
    resumed = uploader.create_version("speech", manifest_of({"audio/big.flac": BIG, "text/small.txt": SMALL}))
    assert resumed.status_code == 200 and resumed.json()["id"] == version
    assert resumed.json()["upload"][0]["received_bytes"] == 200_000
    assert_error(uploader.complete("speech", version), 409, "version_incomplete")
    last = uploader.put("speech", version, "audio/big.flac", BIG[200_000:], **part(200_000, len(BIG) - 1))
    assert last.json()["complete"] is True
    assert uploader.put("speech", version, "text/small.txt", SMALL).json()["complete"] is True
    done = uploader.complete("speech", version)
    assert done.status_code == 200 and done.json()["status"] == "complete" and done.json()["number"] == 1
    stored = DatasetFile.objects.get(sha256=sha(BIG))
    assert open(stored.file.path, "rb").read() == BIG


def test_bytes_that_do_not_match_the_sha256_are_refused_and_dropped(uploader, started):
    version = started["id"]
    forged = bytearray(BIG)
    forged[123_456] ^= 0xFF
    uploader.put("speech", version, "audio/big.flac", bytes(forged[:150_000]), **part(0, 149_999))
    wrong = uploader.put("speech", version, "audio/big.flac", bytes(forged[150_000:]), **part(150_000, len(BIG) - 1))
    assert "upload it again from byte 0" in assert_error(wrong, 422, "sha256_mismatch")["error"]
    stored = DatasetFile.objects.get(sha256=sha(BIG))
    assert stored.received_bytes == 0 and not stored.complete
    assert uploader.put("speech", version, "audio/big.flac", BIG).json()["complete"] is True


def test_more_bytes_than_the_range_or_size_and_bad_ranges_are_refused(uploader, started):
    version = started["id"]
    uploader.put("speech", version, "audio/big.flac", BIG[:1000], **part(0, 999))
    too_many = uploader.put("speech", version, "audio/big.flac", BIG[1000:3000], **part(1000, 1999))
    assert_error(too_many, 422, "size_mismatch")
    assert DatasetFile.objects.get(sha256=sha(BIG)).received_bytes == 1000
    assert uploader.put("speech", version, "text/small.txt", SMALL + b"extra").status_code == 422
    for header in ["bytes 0-10/5", "bytes 5-1/300000", "bytes=0-10", f"bytes 0-{len(BIG)}/{len(BIG)}"]:
        assert_error(uploader.put("speech", version, "audio/big.flac", b"x", HTTP_CONTENT_RANGE=header), 422,
                     "invalid_range")


def test_a_version_can_not_be_read_before_it_is_complete(world, uploader, started):
    viewer = bearer(world.token(world.viewer, ["read"]))
    assert_error(viewer.get(f"/api/projects/lab/datasets/speech/versions/{started['id']}/files/text/small.txt"), 409,
                 "version_incomplete")


def test_ranged_downloads_for_resuming_transfers(world, uploader):
    uploader.create_dataset("speech")
    version = uploader.upload("speech", {"big.bin": BIG})
    url = f"/api/projects/lab/datasets/speech/versions/{version['id']}/files/big.bin"
    viewer = bearer(world.token(world.viewer, ["read"]))
    middle = viewer.get(url, HTTP_RANGE="bytes=1000-1999")
    assert middle.status_code == 206 and middle["Content-Range"] == f"bytes 1000-1999/{len(BIG)}"
    assert b"".join(middle.streaming_content) == BIG[1000:2000]
    rest = viewer.get(url, HTTP_RANGE="bytes=299000-")
    assert b"".join(rest.streaming_content) == BIG[299_000:] and rest["Content-Length"] == "1000"
    tail = viewer.get(url, HTTP_RANGE="bytes=-10")
    assert b"".join(tail.streaming_content) == BIG[-10:]
    beyond = viewer.get(url, HTTP_RANGE=f"bytes={len(BIG)}-")
    assert beyond.status_code == 416 and beyond["Content-Range"] == f"bytes */{len(BIG)}"
    whole = viewer.get(url, HTTP_RANGE="bytes=0-1,5-6")
    assert whole.status_code == 200 and hashlib.sha256(b"".join(whole.streaming_content)).hexdigest() == sha(BIG)


def test_the_digest_is_stable_and_the_same_files_make_no_new_version(uploader):
    uploader.create_dataset("speech")
    files = {"b/2.wav": b"two", "a/1.wav": b"one", "c.txt": b""}
    first = uploader.upload("speech", files)
    again = uploader.create_version("speech", list(reversed(manifest_of(files))))
    assert again.status_code == 200 and again.json()["id"] == first["id"] and again.json()["upload"] == []
    lines = "".join(f"{sha(files[p])} {len(files[p])} {p}\n" for p in sorted(files))
    assert first["digest"] == "sha256:" + hashlib.sha256(lines.encode()).hexdigest()
    listed = [results.OutputFile(path=f"out/{p}", size=len(d), sha256=sha(d)) for p, d in files.items()]
    declared = results.validate_result({"version": 2, "complete": True,
                                        "artifacts": [{"path": f.path, "sha256": f.sha256, "size": f.size}
                                                      for f in listed],
                                        "datasets": [{"datasetId": "speech", "path": "out"}]}, listed)
    assert declared.datasets[0]["digest"] == first["digest"], "a job declaring the same files gets the same digest"


def test_a_new_version_uploads_only_the_contents_the_project_does_not_have(uploader):
    uploader.create_dataset("speech")
    files = {f"clip{i}.wav": os.urandom(64) for i in range(20)}
    first = uploader.upload("speech", files)
    files["clip3.wav"] = b"re-recorded"
    files["copy-of-clip4.wav"] = files["clip4.wav"]
    second = uploader.create_version("speech", manifest_of(files))
    assert second.status_code == 201
    assert [item["path"] for item in second.json()["upload"]] == ["clip3.wav"]
    uploader.put("speech", second.json()["id"], "clip3.wav", b"re-recorded")
    done = uploader.complete("speech", second.json()["id"])
    assert done.json()["number"] == 2 and done.json()["file_count"] == 21 and done.json()["digest"] != first["digest"]
    assert DatasetVersion.objects.get(pk=first["id"]).number == 1


def test_an_unproven_size_claim_gives_way_and_its_version_cannot_complete(uploader):
    uploader.create_dataset("speech")
    lying = uploader.create_version("speech", [{"path": "a.bin", "sha256": sha(SMALL), "size": 999}]).json()
    honest = uploader.create_version("speech", manifest_of({"b.bin": SMALL})).json()
    assert honest["upload"][0]["size"] == len(SMALL)
    assert uploader.put("speech", honest["id"], "b.bin", SMALL).json()["complete"] is True
    assert uploader.complete("speech", honest["id"]).status_code == 200
    assert_error(uploader.complete("speech", lying["id"]), 409, "version_incomplete")
    late = uploader.create_version("speech", [{"path": "c.bin", "sha256": sha(SMALL), "size": 5}])
    assert "hash the file again" in assert_error(late, 422, "invalid_manifest")["error"]
