"""Many files in one request (PUT …/versions/{v}/archive): an uncompressed tar whose members the server
checks against the version's manifest (path, size, sha256) as they arrive; what it verified stays
stored when a later member is refused or the stream is cut, and asking for the version again lists only
the rest. Who may read and write archives: members with registry:write upload, job tokens never do; job
tokens read the archives of their own project only (seed 001: a job token reads within its project)."""
from __future__ import annotations

import io
import os
import tarfile
import uuid

import pytest

from datasets.models import DatasetFile
from jobs.models import Job
from mado import services as identity
from mado.choices import Role
from mado.models import JobToken, Membership
from tests.conftest import assert_error, bearer
from tests.datasets.conftest import WRITER_SCOPES, Uploader, manifest_of, sha

FILES = {f"clips/{i:03}.wav": os.urandom(100 + i) for i in range(30)}
FILES["big/features.bin"] = os.urandom(3 * 2**20 + 17)


def tar_of(files: dict[str, bytes], *, names: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path, data in files.items():
            info = tarfile.TarInfo((names or {}).get(path, path))
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def put_archive(client, version: int, body: bytes, dataset="speech"):
    return client.put(f"/api/projects/lab/datasets/{dataset}/versions/{version}/archive", data=body,
                      content_type="application/x-tar")


@pytest.fixture
def started(uploader) -> dict:
    uploader.create_dataset("speech")
    created = uploader.create_version("speech", manifest_of(FILES))
    assert created.status_code == 201, created.content
    return created.json()


def stored(files: dict[str, bytes]) -> set[str]:
    done = set(DatasetFile.objects.filter(complete=True).values_list("sha256", flat=True))
    return {path for path, data in files.items() if sha(data) in done}


def test_a_whole_version_in_one_archive_is_verified_and_completes(uploader, started):
    answer = put_archive(uploader.client, started["id"], tar_of(FILES))
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"confirmed": list(FILES), "stored_files": len(FILES),
                             "received_bytes": sum(map(len, FILES.values()))}
    done = uploader.complete("speech", started["id"])
    assert done.status_code == 200 and done.json()["number"] == 1
    for path, data in FILES.items():
        row = DatasetFile.objects.get(sha256=sha(data))
        assert open(row.file.path, "rb").read() == data and row.received_bytes == len(data), path
    # The version's own archive gives the same bytes back.
    back = uploader.client.get(f"/api/projects/lab/datasets/speech/versions/{started['id']}/archive")
    with tarfile.open(fileobj=io.BytesIO(b"".join(back.streaming_content)), mode="r|") as archive:
        assert {m.name: archive.extractfile(m).read() for m in archive} == FILES


def test_a_wrong_digest_names_the_file_keeps_the_files_before_and_the_version_asks_for_the_rest(uploader, started):
    wrong = dict(FILES)
    wrong["clips/010.wav"] = bytes([FILES["clips/010.wav"][0] ^ 1]) + FILES["clips/010.wav"][1:]
    body = assert_error(put_archive(uploader.client, started["id"], tar_of(wrong)), 422, "sha256_mismatch")
    assert "clips/010.wav" in body["error"] and "upload again" in body["error"] and body["fields"]["path"] == [
        "clips/010.wav"]
    assert stored(FILES) == {f"clips/{i:03}.wav" for i in range(10)}, "the ten files before it stay"
    again = uploader.create_version("speech", manifest_of(FILES)).json()
    assert [item["path"] for item in again["upload"]] == ["big/features.bin"] + [f"clips/{i:03}.wav"
                                                                                for i in range(10, 30)]
    rest = {p: FILES[p] for p in (item["path"] for item in again["upload"])}
    answer = put_archive(uploader.client, started["id"], tar_of(rest))
    assert answer.json()["stored_files"] == len(rest)
    assert uploader.complete("speech", started["id"]).status_code == 200


@pytest.mark.parametrize("change, code, words", [
    ({"names": {"clips/005.wav": "clips/elsewhere.wav"}}, "not_in_manifest", "clips/elsewhere.wav is not a file of"),
    ({"size": "clips/005.wav"}, "size_mismatch", "changed since it was hashed"),
])
def test_a_member_the_manifest_does_not_have_is_refused_by_name(uploader, started, change, code, words):
    files = dict(FILES)
    if "size" in change:
        files[change["size"]] += b"!"
    body = assert_error(put_archive(uploader.client, started["id"], tar_of(files, names=change.get("names"))), 422,
                        code)
    assert words in body["error"] and "files before it are stored" in body["error"]
    assert stored(FILES) == {f"clips/{i:03}.wav" for i in range(5)}


def test_links_are_refused_and_a_cut_archive_keeps_what_was_verified(uploader, started, media):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        link = tarfile.TarInfo("clips/000.wav")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.addfile(link)
    assert "regular files only" in assert_error(put_archive(uploader.client, started["id"], buffer.getvalue()), 422,
                                                "invalid_member")["error"]
    whole = tar_of(FILES)
    cut = whole[:len(whole) - 2 * 2**20]  # inside big/features.bin, the last member
    body = assert_error(put_archive(uploader.client, started["id"], cut), 400, "archive_truncated")
    assert "send the files it still lists" in body["error"]
    assert stored(FILES) == set(FILES) - {"big/features.bin"}
    assert not list((media / "partial" / "datasets").glob("upload-*")), "the cut member's bytes are gone"
    again = uploader.create_version("speech", manifest_of(FILES)).json()
    assert [item["path"] for item in again["upload"]] == ["big/features.bin"]


def test_contents_already_stored_are_read_past_and_an_archive_needs_a_length(uploader, started):
    first = put_archive(uploader.client, started["id"], tar_of(FILES))
    assert first.json()["stored_files"] == len(FILES)
    again = put_archive(uploader.client, started["id"], tar_of(FILES))
    assert again.json() == {"confirmed": list(FILES), "stored_files": 0, "received_bytes": 0}
    no_length = uploader.client.put(f"/api/projects/lab/datasets/speech/versions/{started['id']}/archive",
                                    data=b"", content_type="application/x-tar", CONTENT_LENGTH="")
    assert_error(no_length, 411, "length_required")


def test_who_may_upload_an_archive(world, uploader, started, media):
    body = tar_of(FILES)
    reader = bearer(world.token(world.member, ["read"]))
    assert_error(put_archive(reader, started["id"], body), 403, "missing_scope")
    demoted = bearer(world.token(world.project_admin, WRITER_SCOPES))
    Membership.objects.filter(user=world.project_admin, project=world.project).update(role=Role.VIEWER)
    assert put_archive(demoted, started["id"], body).status_code == 403, "a viewer now: members write"
    outsider = Uploader(world.token(world.outsider, WRITER_SCOPES, project=world.other_project))
    assert put_archive(outsider.client, started["id"], body).status_code == 404
    job_token, _ = job_token_of(world, world.project, world.member)
    assert_error(put_archive(bearer(job_token), started["id"], body), 403)
    assert stored(FILES) == set()


# -- reading archives with job tokens and personal tokens ------------------------------------------

@pytest.fixture
def complete(uploader, started) -> dict:
    put_archive(uploader.client, started["id"], tar_of(FILES))
    return uploader.complete("speech", started["id"]).json()


def job_token_of(world, project, user) -> tuple[str, object]:
    token, plaintext = identity.issue_job_token(job_id=Job.objects.count() + 1000 + JobToken.objects.count(),
                                                lease_id=uuid.uuid4(), project=project, user=user)
    return plaintext, token


def test_a_job_token_reads_its_projects_archives_whole_and_in_part(world, complete):
    plaintext, _ = job_token_of(world, world.project, world.member)
    url = f"/api/projects/lab/datasets/speech/versions/{complete['id']}/archive"
    whole = bearer(plaintext).get(url)
    assert whole.status_code == 200 and whole["X-Archive-Files"] == str(len(FILES))
    part = bearer(plaintext).post(url, {"files": ["big/features.bin"]}, format="json")
    assert part.status_code == 200, part.content  # the POST is a read: job tokens may send it
    with tarfile.open(fileobj=io.BytesIO(b"".join(part.streaming_content)), mode="r|") as archive:
        assert [(m.name, archive.extractfile(m).read()) for m in archive] == [("big/features.bin",
                                                                               FILES["big/features.bin"])]


def test_archives_are_refused_outside_the_tokens_project_and_after_the_job(world, complete):
    url = f"/api/projects/lab/datasets/speech/versions/{complete['id']}/archive"
    other, _ = job_token_of(world, world.other_project, world.outsider)  # a job of another project
    assert bearer(other).get(url).status_code == 404
    assert bearer(other).post(url, {"files": ["big/features.bin"]}, format="json").status_code == 404
    outsider = bearer(world.token(world.outsider, ["read"], project=world.other_project))
    assert outsider.get(url).status_code == 404, "a personal token needs read on the project"
    ended, token = job_token_of(world, world.project, world.member)
    identity.revoke_job_tokens(token.job_id)
    assert_error(bearer(ended).get(url), 401)
    no_read = bearer(world.token(world.member, ["registry:write"]))
    assert_error(no_read.post(url, {"files": ["big/features.bin"]}, format="json"), 403, "missing_scope")
