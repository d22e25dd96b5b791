"""Fixtures of the datasets tests: files on disk, a writer's token, and helpers to upload a manifest."""
from __future__ import annotations

import hashlib

import pytest

from tests.conftest import bearer

WRITER_SCOPES = ["read", "registry:write"]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_of(files: dict[str, bytes]) -> list[dict]:
    return [{"path": path, "sha256": sha(data), "size": len(data)} for path, data in files.items()]


class Uploader:
    """A member's API client with registry:write, speaking the datasets API of one project."""

    def __init__(self, token: str, project: str = "lab"):
        self.client = bearer(token)
        self.base = f"/api/projects/{project}/datasets"

    def create_dataset(self, name="speech", **extra):
        return self.client.post(self.base, {"name": name, **extra}, format="json")

    def create_version(self, dataset, manifest):
        return self.client.post(f"{self.base}/{dataset}/versions", {"manifest": manifest}, format="json")

    def put(self, dataset, version, path, data: bytes, **headers):
        return self.client.put(f"{self.base}/{dataset}/versions/{version}/files/{path}", data=data,
                               content_type="application/octet-stream", **headers)

    def complete(self, dataset, version):
        return self.client.post(f"{self.base}/{dataset}/versions/{version}/complete")

    def upload(self, dataset, files: dict[str, bytes]) -> dict:
        """A whole version: manifest, every asked-for file, complete."""
        created = self.create_version(dataset, manifest_of(files))
        assert created.status_code in (200, 201), created.content
        version = created.json()
        for item in version["upload"]:
            answer = self.put(dataset, version["id"], item["path"], files[item["path"]])
            assert answer.status_code == 200 and answer.json()["complete"], answer.content
        done = self.complete(dataset, version["id"])
        assert done.status_code == 200, done.content
        return done.json()


@pytest.fixture
def media(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT


@pytest.fixture
def uploader(world, media) -> Uploader:
    return Uploader(world.token(world.member, WRITER_SCOPES))
