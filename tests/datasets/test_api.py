"""The datasets API: who may read and write, names, and what a manifest may hold."""
from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from datasets.models import DatasetVersion
from tests.conftest import assert_error, bearer
from tests.datasets.conftest import manifest_of, sha

FILES = {"train/a.wav": b"aaaa", "train/b.wav": b"bbbbbb", "labels.csv": b"a,1\nb,2\n"}


def session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


@pytest.fixture
def speech(uploader):
    dataset = uploader.create_dataset("speech", description="Read speech, 16 kHz").json()
    version = uploader.upload(dataset["id"], FILES)
    return dataset, version


def test_a_viewer_reads_datasets_versions_manifests_and_bytes(world, speech):
    dataset, version = speech
    viewer = bearer(world.token(world.viewer, ["read"]))
    listing = viewer.get("/api/projects/lab/datasets").json()["items"]
    assert [(d["name"], d["version_count"], d["latest_version"]["number"]) for d in listing] == [("speech", 1, 1)]
    assert viewer.get("/api/projects/lab/datasets/SPEECH").json()["id"] == dataset["id"], "names ignore case"
    versions = viewer.get(f"/api/projects/lab/datasets/{dataset['id']}/versions").json()["items"]
    assert [(v["number"], v["status"], v["file_count"], v["total_size"]) for v in versions] == [(1, "complete", 3, 18)]
    manifest = viewer.get(f"/api/projects/lab/datasets/speech/versions/{version['id']}/manifest").json()
    assert manifest["items"] == sorted(manifest_of(FILES), key=lambda e: e["path"])
    assert manifest["digest"] == version["digest"]
    download = viewer.get(f"/api/projects/lab/datasets/speech/versions/{version['id']}/files/train/b.wav")
    assert download.status_code == 200 and b"".join(download.streaming_content) == b"bbbbbb"
    assert download["ETag"] == f'"{sha(b"bbbbbb")}"'


def test_an_outsider_gets_404_and_a_viewer_cannot_write(world, speech):
    dataset, version = speech
    outsider = bearer(world.member_token(world.outsider, world.other_project))
    assert_error(session(world.outsider).get("/api/projects/lab/datasets"), 404)
    assert_error(session(world.outsider).get(f"/api/projects/lab/datasets/speech/versions/{version['id']}/files/"
                                             "labels.csv"), 404)
    assert_error(outsider.get("/api/projects/lab/datasets"), 404)
    viewer = session(world.viewer)
    assert_error(viewer.post("/api/projects/lab/datasets", {"name": "mine"}, format="json"), 403, "role_required")
    assert_error(viewer.post("/api/projects/lab/datasets/speech/versions", {"manifest": manifest_of(FILES)},
                             format="json"), 403, "role_required")


def test_a_member_token_without_registry_write_is_refused_with_the_scope_named(world, speech):
    member = bearer(world.token(world.member, ["read", "jobs:write", "runs:write"]))
    body = assert_error(member.post("/api/projects/lab/datasets", {"name": "mine"}, format="json"), 403,
                        "missing_scope")
    assert "registry:write" in body["error"]
    dataset, version = speech
    assert_error(member.put(f"/api/projects/lab/datasets/speech/versions/{version['id']}/files/labels.csv",
                            data=b"x", content_type="application/octet-stream"), 403, "missing_scope")
    assert member.get("/api/projects/lab/datasets").status_code == 200


def test_a_browser_session_member_writes_without_token_scopes(world, media):
    created = session(world.member).post("/api/projects/lab/datasets", {"name": "notes"}, format="json")
    assert created.status_code == 201, created.content


@pytest.mark.parametrize("name, problem", [
    ("", "1–100 letters"), ("-lead", "1–100 letters"), ("has space", "1–100 letters"), ("12345", "only digits"),
    ("x" * 101, "1–100 letters"), ("a/b", "1–100 letters"),
])
def test_dataset_names_are_checked(uploader, name, problem):
    assert problem in assert_error(uploader.create_dataset(name), 422, "invalid_dataset")["error"]


def test_names_are_unique_per_project_ignoring_case(world, uploader):
    assert uploader.create_dataset("Speech").status_code == 201
    assert "already has a dataset named" in assert_error(uploader.create_dataset("speech"), 409, "dataset_exists")[
        "error"]
    other = bearer(world.token(world.outsider, ["read", "registry:write"], project=world.other_project))
    assert other.post("/api/projects/other/datasets", {"name": "speech"}, format="json").status_code == 201


def test_unknown_datasets_and_versions_are_404_with_a_hint(uploader, speech):
    dataset, version = speech
    assert "check the name or id" in assert_error(uploader.client.get("/api/projects/lab/datasets/nope"), 404)["error"]
    assert_error(uploader.client.get("/api/projects/lab/datasets/speech/versions/999999"), 404)
    assert_error(uploader.put("speech", version["id"], "not/listed.bin", b"x"), 404, "not_in_manifest")


@pytest.mark.parametrize("path, problem", [
    ("/etc/passwd", "remove the leading '/'"),
    ("../outside", "'..'"),
    ("a/../../b", "'..'"),
    ("line\nbreak", "control characters"),
    ("win\\path", "write paths with '/'"),
    ("a//b", "empty or '.'"),
    ("./a", "empty or '.'"),
    ("dir/", "empty or '.'"),
    ("", "non-empty"),
    ("é" * 600, "at most 1024 bytes"),
])
def test_unsafe_paths_are_refused_with_the_entry_named(uploader, path, problem):
    uploader.create_dataset("speech")
    manifest = manifest_of({"ok.txt": b"ok"}) + [{"path": path, "sha256": sha(b"x"), "size": 1}]
    body = assert_error(uploader.create_version("speech", manifest), 422, "invalid_manifest")
    assert problem in body["error"] and "manifest[1].path" in body["fields"]
    assert not DatasetVersion.objects.exists()


def test_a_nul_in_a_path_is_refused_before_anything_is_read(uploader):
    uploader.create_dataset("speech")
    manifest = [{"path": "nul\x00byte", "sha256": sha(b"x"), "size": 1}]
    assert "NUL" in assert_error(uploader.create_version("speech", manifest), 400, "parse_error")["error"]
    assert not DatasetVersion.objects.exists()


def test_the_manifest_rules_refuse_nul_on_their_own():
    """The JSON parser already refuses NUL in API bodies; the rule still holds for any other caller."""
    from datasets.manifest import path_problem

    assert "control characters" in path_problem("nul\x00byte")


@pytest.mark.parametrize("entry, field", [
    ({"path": "a", "sha256": "zz", "size": 1}, "manifest[0].sha256"),
    ({"path": "a", "sha256": "0" * 64, "size": -1}, "manifest[0].size"),
    ({"path": "a", "sha256": "0" * 64, "size": True}, "manifest[0].size"),
    ({"path": "a", "sha256": "0" * 64, "size": 1.0}, "manifest[0].size"),
    ({"path": "a", "sha256": "0" * 64, "size": 1, "mode": 644}, "manifest[0]"),
    ("a.txt", "manifest[0]"),
])
def test_entries_need_a_sha256_and_a_size(uploader, entry, field):
    uploader.create_dataset("speech")
    assert field in assert_error(uploader.create_version("speech", [entry]), 422, "invalid_manifest")["fields"]


def test_duplicates_file_directory_clashes_and_empty_manifests_are_refused(uploader):
    uploader.create_dataset("speech")
    twice = manifest_of({"a.txt": b"1"}) * 2
    assert "listed twice" in assert_error(uploader.create_version("speech", twice), 422)["error"]
    clash = manifest_of({"a": b"1", "a/b": b"2"})
    assert "needs it to be a directory" in assert_error(uploader.create_version("speech", clash), 422)["error"]
    assert_error(uploader.create_version("speech", []), 422, "invalid_manifest")
    assert_error(uploader.client.post("/api/projects/lab/datasets/speech/versions", {}, format="json"), 422)
    same_sha_other_size = [{"path": "a", "sha256": sha(b"1"), "size": 1}, {"path": "b", "sha256": sha(b"1"), "size": 2}]
    assert_error(uploader.create_version("speech", same_sha_other_size), 422, "invalid_manifest")


def test_a_version_holds_at_most_100000_files(uploader):
    uploader.create_dataset("speech")
    manifest = [{"path": f"f{i}", "sha256": "0" * 64, "size": 0} for i in range(100_001)]
    body = assert_error(uploader.create_version("speech", manifest), 422, "too_many_files")
    assert "at most 100000 files" in body["error"] and "100001" in body["error"]
    assert not DatasetVersion.objects.exists()
