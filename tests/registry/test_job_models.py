"""result.json `models` (issue 16 item 5): a finished training job's declared weights become model
versions with their artifact, digest and source Run; another kind of Run is refused at declaration;
the Models page lists them, in English and Japanese."""
from __future__ import annotations

import hashlib
import json

import pytest
from django.test import Client

from mado.choices import TokenKind
from registry.models import ModelVersion, RegisteredModel
from tests.conftest import WORKER_SCOPES, assert_error, bearer
from tests.job_fixtures import JobWorker, job_request
from tracking.models import Run

WEIGHTS = b"\x00\x01 trained weights " * 100
LOG = b"epoch 1 loss 0.1\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def registry_worker(world, media):
    token = world.token(world.service_account.user, [*WORKER_SCOPES, "registry:write"], kind=TokenKind.SERVICE)
    worker = JobWorker(token, "lab-worker-2")
    assert worker.hello().status_code == 200
    return worker


def submit(world, gpu_box, worker, **extra):
    client = bearer(world.token(world.member, ["read", "jobs:write"]))
    created = client.post("/api/projects/lab/jobs", job_request(gpu_box, name="train-resnet", **extra), format="json")
    assert created.status_code == 201, created.content
    return worker.claim()


def declare(worker, item, models):
    files = {"model/weights.bin": WEIGHTS, "train.log": LOG}
    result = {"version": 2, "complete": True, "models": models,
              "artifacts": [{"path": p, "sha256": sha(d), "size": len(d)} for p, d in files.items()]}
    listing = [{"path": p, "size": len(d), "sha256": sha(d), "kind": "file"} for p, d in files.items()]
    return worker.leased(item, "outputs", result=json.dumps(result), files=listing), files


def deliver(worker, item, models):
    answer, files = declare(worker, item, models)
    assert answer.status_code == 200, answer.content
    for path in answer.json()["upload"]:
        put = worker.client.put(f"/api/worker/jobs/{item['id']}/artifacts/{path}?worker_id={worker.worker_id}"
                                f"&lease_id={item['lease_id']}", data=files[path],
                                content_type="application/octet-stream")
        assert put.json()["complete"], put.content


def test_a_training_jobs_declared_weights_become_versions_on_the_models_page(world, gpu_box, registry_worker):
    item = submit(world, gpu_box, registry_worker, run_kind="training")
    deliver(registry_worker, item, [{"path": "model/weights.bin", "modelId": "resnet"},
                                    {"path": "train.log"}])
    assert not ModelVersion.objects.exists(), "nothing before the job finishes"
    assert registry_worker.complete(item).status_code == 200
    run = Run.objects.get(job_id=item["id"])
    named = ModelVersion.objects.get(model__name="resnet")
    assert (named.version, named.run_id, named.digest, named.size) == (1, run.run_id, sha(WEIGHTS), len(WEIGHTS))
    by_run = ModelVersion.objects.get(model__name="train-resnet")  # no modelId: the Run's name
    assert by_run.digest == sha(LOG)
    assert registry_worker.complete(item).status_code == 200, "a resent completion"
    assert ModelVersion.objects.count() == 2

    browser = Client()
    browser.force_login(world.viewer)
    page = browser.get("/projects/lab/models/")
    html = page.content.decode()
    assert page.status_code == 200 and "resnet" in html and "train-resnet" in html
    assert f'href="/projects/lab/jobs/{item["id"]}/"' in html, "the source Run links to its job"
    assert sha(WEIGHTS)[:12] in html and "Download" in html
    download = browser.get(f"/projects/lab/models/{named.model_id}/versions/1/download")
    assert download.status_code == 200 and b"".join(download.streaming_content) == WEIGHTS
    japanese = Client(headers={"accept-language": "ja"})
    japanese.force_login(world.viewer)
    html = japanese.get("/projects/lab/models/").content.decode()
    assert "モデル" in html and "ダウンロード" in html and "resnet" in html
    home = browser.get("/projects/lab/").content.decode()
    assert 'href="/projects/lab/models/"' in home


def test_an_inference_run_declaring_models_is_refused_with_why(world, gpu_box, registry_worker):
    item = submit(world, gpu_box, registry_worker, run_kind="inference")
    answer, _files = declare(registry_worker, item, [{"path": "model/weights.bin"}])
    body = assert_error(answer, 422, "models_not_allowed")
    assert "training and fine-tuning" in body["error"] and "Inference" in body["error"], body
    assert not RegisteredModel.objects.exists()

