"""The archive of an input version (datasets.archive): one uncompressed tar of the whole version or
of the files named, each member with its manifest path and size, under the job's lease (the relay) or
for readers of the project (direct transfer, the job token); a stored file whose bytes no longer match
its sha256 never arrives as a complete member."""
from __future__ import annotations

import io
import json
import tarfile

import pytest

from tests.datasets_transfer.conftest import manifest_of
from tests.datasets_transfer.test_inputs_api import claimed, files, lease, version  # noqa: F401
from tests.job_fixtures import gpu_box, job_worker  # noqa: F401


def members(answer) -> dict[str, bytes]:
    assert answer.status_code == 200, getattr(answer, "content", b"")[:500]
    assert answer["Content-Type"] == "application/x-tar"
    out = {}
    with tarfile.open(fileobj=io.BytesIO(b"".join(answer.streaming_content)), mode="r|") as archive:
        for member in archive:
            assert member.isfile()
            out[member.name] = archive.extractfile(member).read()
            assert len(out[member.name]) == member.size
    return out


def test_the_whole_version_arrives_as_one_tar_in_manifest_order(claimed, files, job_worker):  # noqa: F811
    job, item = claimed
    [payload] = item["input_datasets"]
    answer = job_worker.client.get(payload["worker_archive_url"], lease(item))
    got = members(answer)
    assert got == files
    assert list(got) == [i["path"] for i in manifest_of(files)]
    assert answer["X-Archive-Files"] == str(len(files))


def test_only_the_files_asked_for_in_that_order(claimed, files, job_worker):  # noqa: F811
    job, item = claimed
    [payload] = item["input_datasets"]
    wanted = ["labels/ラベル.json", "big/audio.bin"]
    by_query = job_worker.client.get(payload["worker_archive_url"], {**lease(item), "files": wanted})
    assert list(members(by_query).items()) == [(p, files[p]) for p in wanted]
    by_body = job_worker.client.post(payload["worker_archive_url"] + "?worker_id=lab-worker-1&lease_id="
                                     + item["lease_id"], json.dumps({"files": wanted[::-1]}),
                                     content_type="application/json")
    assert list(members(by_body)) == wanted[::-1]


@pytest.mark.parametrize("body, code", [({"files": ["nope.txt"]}, "not_in_manifest"),
                                        ({"files": ["big/audio.bin", "big/audio.bin"]}, "invalid_files"),
                                        ({"files": "big/audio.bin"}, "invalid_files"), ({}, "invalid_files"),
                                        ({"files": ["\ud800"]}, "invalid_files"),
                                        ({"files": ["a\u0000b"]}, "invalid_files")])
def test_bad_file_lists_say_what_to_fix(claimed, job_worker, body, code):  # noqa: F811
    job, item = claimed
    [payload] = item["input_datasets"]
    answer = job_worker.client.post(payload["worker_archive_url"] + "?worker_id=lab-worker-1&lease_id="
                                    + item["lease_id"], json.dumps(body), content_type="application/json")
    assert answer.status_code in (404, 422) and answer.json()["code"] == code, answer.json()


def test_a_path_with_a_nul_in_the_query_is_refused_with_what_to_fix(claimed, job_worker):  # noqa: F811
    job, item = claimed
    [payload] = item["input_datasets"]
    answer = job_worker.client.get(payload["worker_archive_url"], {**lease(item), "files": ["a\x00b"]})
    assert answer.status_code == 422 and answer.json()["code"] == "invalid_files", answer.content


def test_outside_the_lease_and_missing_bytes_are_refused_before_any_byte(claimed, job_worker, version,  # noqa: F811
                                                                         settings):
    job, item = claimed
    [payload] = item["input_datasets"]
    url = payload["worker_archive_url"]
    assert job_worker.client.get(url, {**lease(item), "lease_id": "0" * 32}).status_code == 409
    entry = version.entries.select_related("file").get(path="big/audio.bin")
    (settings.MEDIA_ROOT / entry.file.file.name).unlink()
    gone = job_worker.client.get(url, lease(item))
    assert gone.status_code == 404 and gone.json()["code"] == "file_missing" and "big/audio.bin" in gone.json()["error"]


def test_stored_bytes_that_no_longer_match_are_never_a_complete_member(claimed, job_worker, version,  # noqa: F811
                                                                       files, settings):
    job, item = claimed
    [payload] = item["input_datasets"]
    entry = version.entries.select_related("file").get(path="big/audio.bin")
    stored = settings.MEDIA_ROOT / entry.file.file.name
    data = bytearray(stored.read_bytes())
    data[-1] ^= 0x01  # the very last byte: caught only once the whole file was hashed
    stored.write_bytes(bytes(data))
    answer = job_worker.client.get(payload["worker_archive_url"], lease(item))
    body = b"".join(answer.streaming_content)
    got = {}
    with pytest.raises(tarfile.ReadError):
        with tarfile.open(fileobj=io.BytesIO(body), mode="r|") as archive:
            for member in archive:
                got[member.name] = archive.extractfile(member).read()
    assert "big/audio.bin" not in got and len(body) < sum(map(len, files.values()))


def test_a_job_token_reads_the_archive_through_the_project_api(claimed, files):  # noqa: F811
    from tests.conftest import bearer

    job, item = claimed
    [payload] = item["input_datasets"]
    assert members(bearer(item["job_token"]).get(payload["archive_url"])) == files
