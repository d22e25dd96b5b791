"""result.json outputs, artifact uploads (whole and in parts) and source archives."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile

import pytest
from rest_framework.test import APIClient

from django.db import transaction

from jobs import outputs
from jobs.models import Artifact, Job, Metric
from mado.errors import ServiceError
from tests.conftest import assert_error, bearer
from tests.job_fixtures import job_request
from tests.support import tar_gz


def session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


WEIGHTS = b"\x00\x01weights" * 1000
REPORT = b"accuracy 0.93\n"


def declaration(**extra) -> tuple[str, list[dict]]:
    result = {"version": 2, "complete": True,
              "artifacts": [{"path": "model/weights.bin", "sha256": sha(WEIGHTS), "size": len(WEIGHTS)},
                            {"path": "report.txt", "sha256": sha(REPORT), "size": len(REPORT)}],
              "metrics": [{"name": "eval.accuracy", "value": 0.93, "step": 10}], **extra}
    files = [{"path": "model/weights.bin", "size": len(WEIGHTS), "sha256": sha(WEIGHTS), "kind": "file"},
             {"path": "report.txt", "size": len(REPORT), "sha256": sha(REPORT), "kind": "file"},
             {"path": "result.json", "size": 10, "sha256": "0" * 64, "kind": "file"}]
    return json.dumps(result), files


@pytest.fixture
def claimed(world, gpu_box, job_worker):
    session(world.member).post("/api/projects/lab/jobs", job_request(gpu_box), format="json")
    return job_worker.claim()


def put(worker, item, path, data, **headers):
    return worker.client.put(f"/api/worker/jobs/{item['id']}/artifacts/{path}?worker_id={worker.worker_id}"
                             f"&lease_id={item['lease_id']}", data=data, content_type="application/octet-stream",
                             **headers)


def test_a_valid_declaration_stores_metrics_and_asks_for_the_artifacts(world, claimed, job_worker, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    text, files = declaration()
    response = job_worker.leased(claimed, "outputs", result=text, files=files, manifest=None)
    assert response.status_code == 200, response.content
    assert sorted(response.json()["upload"]) == ["model/weights.bin", "report.txt"]
    assert Metric.objects.get(job_id=claimed["id"]).value == 0.93
    assert job_worker.leased(claimed, "outputs", result=text, files=files).json()["upload"], "resent: same answer"


def test_an_invalid_declaration_is_refused_with_what_to_fix_and_stores_nothing(world, claimed, job_worker):
    text, files = declaration()
    files = files[1:]  # the weights are declared but missing
    body = assert_error(job_worker.leased(claimed, "outputs", result=text, files=files), 422)
    assert "model/weights.bin" in body["error"]
    assert not Artifact.objects.exists() and not Metric.objects.exists()


def test_models_need_registry_write(world, claimed, job_worker):
    text, files = declaration(models=[{"path": "model/weights.bin"}])
    assert_error(job_worker.leased(claimed, "outputs", result=text, files=files), 422, "registry_write_required")


def test_artifacts_upload_verify_and_download_then_the_job_finishes(world, claimed, job_worker, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    text, files = declaration()
    job_worker.leased(claimed, "outputs", result=text, files=files)
    assert_error(job_worker.complete(claimed), 409, "artifacts_incomplete")
    assert put(job_worker, claimed, "report.txt", REPORT).json()["complete"] is True
    half = len(WEIGHTS) // 2
    first = put(job_worker, claimed, "model/weights.bin", WEIGHTS[:half],
                HTTP_CONTENT_RANGE=f"bytes 0-{half - 1}/{len(WEIGHTS)}")
    assert first.json() == {"path": "model/weights.bin", "received_bytes": half, "complete": False}
    wrong_offset = put(job_worker, claimed, "model/weights.bin", WEIGHTS[half:],
                       HTTP_CONTENT_RANGE=f"bytes 10-{len(WEIGHTS) - 1}/{len(WEIGHTS)}")
    assert f"from byte {half}" in assert_error(wrong_offset, 409, "range_mismatch")["error"]
    rest = put(job_worker, claimed, "model/weights.bin", WEIGHTS[half:],
               HTTP_CONTENT_RANGE=f"bytes {half}-{len(WEIGHTS) - 1}/{len(WEIGHTS)}")
    assert rest.json()["complete"] is True
    assert job_worker.complete(claimed).status_code == 200
    listing = session(world.viewer).get(f"/api/jobs/{claimed['id']}/artifacts").json()["items"]
    assert {a["path"]: a["sha256"] for a in listing} == {"model/weights.bin": sha(WEIGHTS), "report.txt": sha(REPORT)}
    download = session(world.viewer).get(f"/api/jobs/{claimed['id']}/artifacts/model/weights.bin")
    assert b"".join(download.streaming_content) == WEIGHTS
    assert_error(session(world.outsider).get(f"/api/jobs/{claimed['id']}/artifacts/report.txt"), 404)


def test_bytes_that_do_not_match_the_sha256_are_refused_and_forgotten(world, claimed, job_worker, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    text, files = declaration()
    job_worker.leased(claimed, "outputs", result=text, files=files)
    forged = b"accuracy 0.99\n"
    put(job_worker, claimed, "report.txt", forged[:5], HTTP_CONTENT_RANGE=f"bytes 0-4/{len(forged)}")
    assert Artifact.objects.get(path="report.txt").received_bytes == 5
    assert_error(put(job_worker, claimed, "report.txt", forged[5:],
                     HTTP_CONTENT_RANGE=f"bytes 5-{len(forged) - 1}/{len(forged)}"), 422, "sha256_mismatch")
    artifact = Artifact.objects.get(path="report.txt")
    assert artifact.complete is False and artifact.received_bytes == 0
    assert_error(put(job_worker, claimed, "report.txt", REPORT + b"more"), 422, "size_mismatch")
    assert_error(put(job_worker, claimed, "undeclared.bin", b"x"), 404, "artifact_not_declared")


def test_a_source_archive_is_uploaded_once_used_by_a_job_and_fetched_by_its_worker(world, gpu_box, job_worker,
                                                                                     settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    archive = tar_gz({"train.py": b"print('hi')\n"})
    client = bearer(world.token(world.member, ["read", "jobs:write"]))
    uploaded = client.put("/api/projects/lab/sources", data=archive, content_type="application/gzip")
    assert uploaded.status_code == 201, uploaded.content
    again = client.put("/api/projects/lab/sources", data=archive, content_type="application/gzip").json()
    assert again["id"] == uploaded.json()["id"] and again["sha256"] == sha(archive)
    job = client.post("/api/projects/lab/jobs", job_request(gpu_box, source={"kind": "archive",
                                                                             "id": again["id"]}), format="json")
    assert job.status_code == 201, job.content
    item = job_worker.claim()
    assert item["source"]["sha256"] == sha(archive)
    fetched = job_worker.client.get(f"{item['source']['download']}?worker_id={job_worker.worker_id}"
                                    f"&lease_id={item['lease_id']}")
    assert b"".join(fetched.streaming_content) == archive
    wrong = job_worker.client.get(f"{item['source']['download']}?worker_id={job_worker.worker_id}"
                                  f"&lease_id=00000000-0000-0000-0000-000000000000")
    assert_error(wrong, 409, "invalid_lease")


def test_a_source_that_is_not_gzip_or_of_another_project_is_refused(world, gpu_box, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    client = bearer(world.token(world.member, ["read", "jobs:write"]))
    assert_error(client.put("/api/projects/lab/sources", data=b"plain text", content_type="application/gzip"), 422,
                 "source_not_gzip")
    body = assert_error(client.post("/api/projects/lab/jobs", job_request(gpu_box, source={"kind": "archive", "id": 99}),
                                    format="json"), 422, "invalid_job")
    assert "source" in body["fields"]
    git = client.post("/api/projects/lab/jobs", job_request(gpu_box, source={"kind": "git", "url": "https://x/r.git"}),
                      format="json")
    assert git.json()["source"] == {"kind": "git", "url": "https://x/r.git", "ref": "HEAD"}
    assert Job.objects.count() == 1


def test_a_source_over_the_limit_gets_413(world, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    settings.MAX_SOURCE_BYTES = 1000
    client = bearer(world.token(world.member, ["read", "jobs:write"]))
    big = gzip.compress(bytes(range(256)) * 100, compresslevel=0)
    assert_error(client.put("/api/projects/lab/sources", data=big, content_type="application/gzip"), 413,
                 "source_too_large")
    assert not list((tmp_path / "incoming").glob("*"))


# -- how many output files: the worker's MMT_WORKER_MAX_OUTPUT_FILES, up to MADO_MAX_OUTPUT_FILES (issue 14) ------

ONE = b"1"


def many_outputs(count: int) -> dict:
    """A declaration of `count` one-byte files through an artifacts manifest, as a worker posts it."""
    paths = [f"f/{i:05d}" for i in range(count)]
    manifest = "".join(json.dumps({"path": p, "sha256": sha(ONE), "size": 1}) + "\n" for p in paths)
    files = [{"path": p, "size": 1, "sha256": sha(ONE), "kind": "file"} for p in paths]
    files.append({"path": "artifacts.jsonl", "size": len(manifest.encode()), "sha256": sha(manifest.encode()),
                  "kind": "file"})
    result = json.dumps({"version": 2, "complete": True, "artifactsManifest": "artifacts.jsonl"})
    return {"result": result, "files": files, "manifest": manifest}


def test_a_raised_worker_limit_under_the_server_maximum_is_honoured(world, claimed, job_worker):
    """10 001 files: over seed 001's default of 10 000, which a worker raised with MMT_WORKER_MAX_OUTPUT_FILES
    (it says so with its declaration); the server's maximum is higher, so the server takes them all."""
    answer = job_worker.leased(claimed, "outputs", max_files=20_000, **many_outputs(10_001))
    assert answer.status_code == 200, answer.content[:500]
    assert len(answer.json()["upload"]) == 10_001
    assert Artifact.objects.filter(job_id=claimed["id"]).count() == 10_001


def test_a_worker_allowing_more_than_the_server_maximum_is_capped_naming_mado_max_output_files(
        world, claimed, job_worker, settings):
    settings.MAX_OUTPUT_FILES = 4
    body = assert_error(job_worker.leased(claimed, "outputs", max_files=10_000, **many_outputs(5)), 422,
                        "too_many_files")
    assert "the limit is 4" in body["error"], body
    assert "MADO_MAX_OUTPUT_FILES" in body["error"] and "raise MMT_WORKER_MAX_OUTPUT_FILES" not in body["error"], body
    assert not Artifact.objects.exists()
    settings.MAX_OUTPUT_FILES = 5
    assert job_worker.leased(claimed, "outputs", max_files=10_000, **many_outputs(5)).status_code == 200


def record(claimed, declaration: dict, worker_max_files) -> list[str]:
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=claimed["id"])
        return outputs.record_outputs(job, result_text=declaration["result"], files=declaration["files"],
                                      manifest_text=declaration["manifest"], token_scopes=frozenset(),
                                      worker_max_files=worker_max_files)


def test_the_message_names_the_setting_that_decided_the_limit(world, claimed, settings):
    """The limit is the lower of the worker's setting (as the worker reported it) and the server's maximum;
    the message names that one."""
    settings.MAX_OUTPUT_FILES = 6
    with pytest.raises(ServiceError) as refused:
        record(claimed, many_outputs(5), worker_max_files=4)
    assert refused.value.code == "too_many_files" and "the limit is 4" in refused.value.message
    assert "raise MMT_WORKER_MAX_OUTPUT_FILES on the worker" in refused.value.message
    with pytest.raises(ServiceError) as refused:
        record(claimed, many_outputs(7), worker_max_files=8)
    assert "the limit is 6" in refused.value.message and "MADO_MAX_OUTPUT_FILES" in refused.value.message
    with pytest.raises(ServiceError) as refused:
        record(claimed, many_outputs(5), worker_max_files=0)
    assert refused.value.code == "invalid"
    assert len(record(claimed, many_outputs(6), worker_max_files=8)) == 6
