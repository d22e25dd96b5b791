"""A job's result.json `datasets` declaration becomes a dataset version when the job finishes."""
from __future__ import annotations

import json

import pytest

from datasets.models import Dataset, DatasetVersion
from mado.choices import TokenKind
from tests.conftest import WORKER_SCOPES, assert_error, bearer
from tests.datasets.conftest import manifest_of, sha
from tests.job_fixtures import JobWorker, job_request

PREPARED = {f"prepared/clips/{i:03}.wav": f"clip {i}".encode() for i in range(30)}
PREPARED["prepared/index.csv"] = b"id\n" + b"\n".join(str(i).encode() for i in range(30))
REPORT = b"done\n"


@pytest.fixture
def registry_worker(world, media):
    token = world.token(world.service_account.user, [*WORKER_SCOPES, "registry:write"], kind=TokenKind.SERVICE)
    worker = JobWorker(token, "lab-worker-2")
    assert worker.hello().status_code == 200
    return worker


@pytest.fixture
def claimed(world, gpu_box, registry_worker):
    client = bearer(world.token(world.member, ["read", "jobs:write"]))
    assert client.post("/api/projects/lab/jobs", job_request(gpu_box), format="json").status_code == 201
    return registry_worker.claim()


def outputs(datasets: list[dict]) -> tuple[str, list[dict]]:
    files = {**PREPARED, "report.txt": REPORT}
    result = {"version": 2, "complete": True, "datasets": datasets,
              "artifacts": [{"path": p, "sha256": sha(d), "size": len(d)} for p, d in files.items()]}
    listing = [{"path": p, "size": len(d), "sha256": sha(d), "kind": "file"} for p, d in files.items()]
    return json.dumps(result), listing


def deliver(worker, item, datasets):
    text, listing = outputs(datasets)
    answer = worker.leased(item, "outputs", result=text, files=listing)
    assert answer.status_code == 200, answer.content
    files = {**PREPARED, "report.txt": REPORT}
    for path in answer.json()["upload"]:
        put = worker.client.put(f"/api/worker/jobs/{item['id']}/artifacts/{path}?worker_id={worker.worker_id}"
                                f"&lease_id={item['lease_id']}", data=files[path],
                                content_type="application/octet-stream")
        assert put.json()["complete"], put.content


def test_a_finished_job_registers_its_declared_directory_as_one_version(world, claimed, registry_worker, uploader):
    existing = uploader.create_dataset("reports").json()
    deliver(registry_worker, claimed, [{"datasetId": "prepared-audio", "path": "prepared/"},
                                       {"datasetId": existing["id"], "path": "report.txt"}])
    assert not DatasetVersion.objects.exists(), "nothing before the job finishes"
    assert registry_worker.complete(claimed).status_code == 200
    prepared = Dataset.objects.get(name="prepared-audio")
    version = prepared.versions.get()
    assert (version.number, version.status, version.job_id, version.file_count) == (1, "complete", claimed["id"], 31)
    assert version.created_by == world.member
    inside = {p.removeprefix("prepared/"): d for p, d in PREPARED.items()}
    assert version.manifest() == sorted(manifest_of(inside), key=lambda e: e["path"])
    viewer = bearer(world.token(world.viewer, ["read"]))
    download = viewer.get(f"/api/projects/lab/datasets/prepared-audio/versions/{version.pk}/files/clips/007.wav")
    assert b"".join(download.streaming_content) == b"clip 7"
    report = DatasetVersion.objects.get(dataset_id=existing["id"])
    assert report.manifest() == [{"path": "report.txt", "sha256": sha(REPORT), "size": len(REPORT)}]
    # The same files uploaded by hand give the same digest, and need no upload at all.
    uploader.create_dataset("by-hand")
    by_hand = uploader.create_version("by-hand", manifest_of(inside)).json()
    assert by_hand["digest"] == version.digest and by_hand["upload"] == []
    assert registry_worker.complete(claimed).status_code == 200, "a resent completion"
    assert prepared.versions.count() == 1


def test_a_failed_job_registers_nothing(world, claimed, registry_worker):
    deliver(registry_worker, claimed, [{"datasetId": "prepared-audio", "path": "prepared"}])
    assert registry_worker.complete(claimed, status="failed", exit_code=1).status_code == 200
    assert not DatasetVersion.objects.exists() and not Dataset.objects.exists()


def test_an_unknown_dataset_id_or_a_bad_name_is_refused_while_the_job_can_still_say_so(claimed, registry_worker):
    text, listing = outputs([{"datasetId": 424242, "path": "prepared"}])
    body = assert_error(registry_worker.leased(claimed, "outputs", result=text, files=listing), 422,
                        "unknown_dataset")
    assert "no dataset with id 424242" in body["error"]
    text, listing = outputs([{"datasetId": "bad name!", "path": "prepared"}])
    assert_error(registry_worker.leased(claimed, "outputs", result=text, files=listing), 422, "invalid_dataset_name")


def test_declaring_datasets_needs_registry_write(world, gpu_box, job_worker):
    client = bearer(world.token(world.member, ["read", "jobs:write"]))
    client.post("/api/projects/lab/jobs", job_request(gpu_box), format="json")
    item = job_worker.claim()
    text, listing = outputs([{"datasetId": "prepared-audio", "path": "prepared"}])
    assert_error(job_worker.leased(item, "outputs", result=text, files=listing), 422, "registry_write_required")
