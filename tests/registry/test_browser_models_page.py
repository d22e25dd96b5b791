"""In Chromium: the project's Models page lists a registered model's versions, the one a training job
registered linking to its source Run's job page, and Download saves exactly the stored weights."""
from __future__ import annotations

import json
import os

import pytest
from django.test import Client

from registry.models import RegisteredModel
from tests.browser import chromium_page, sign_in  # noqa: F401  (fixture)
from tests.registry.test_job_models import WEIGHTS, deliver, registry_worker, sha, submit  # noqa: F401
from tracking.models import Run

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = pytest.mark.browser


def test_models_page_lists_versions_with_source_runs_and_downloads_the_weights(
    transactional_db, live_server, world, gpu_box, registry_worker, chromium_page, tmp_path  # noqa: F811
):
    from playwright.sync_api import expect

    # v1: a training job declares its weights in result.json; the job's Run is the source.
    item = submit(world, gpu_box, registry_worker, run_kind="training")
    deliver(registry_worker, item, [{"path": "model/weights.bin", "modelId": "resnet"}])
    assert registry_worker.complete(item).status_code == 200
    job_run = Run.objects.get(job_id=item["id"])
    # v2: registered through the MLflow API from a notebook's standalone Run, its bytes stored elsewhere.
    mlflow = Client(headers={"authorization": "Bearer " + world.token(
        world.member, ["read", "runs:write", "registry:write"])})
    notebook = mlflow.post("/mlflow/api/2.0/mlflow/runs/create", json.dumps({"run_name": "notebook"}),
                           content_type="application/json").json()["run"]["info"]["run_id"]
    created = mlflow.post("/mlflow/api/2.0/mlflow/model-versions/create", json.dumps(
        {"name": "resnet", "source": "s3://bucket/resnet-v2", "run_id": notebook}), content_type="application/json")
    assert created.status_code == 200 and created.json()["model_version"]["version"] == "2", created.content
    model = RegisteredModel.objects.get(name="resnet")

    browser = chromium_page
    page = browser.page
    sign_in(browser, "carol", "carol-pass-123", next_path="/projects/lab/models/")
    section = page.locator(f"#model-{model.pk}")
    expect(section.locator("h2")).to_have_text("resnet")
    expect(section.locator("tbody tr")).to_have_count(2)
    expect(section.locator("tbody tr").first).to_have_attribute("data-version", "2")

    first = section.locator('tr[data-version="1"]')
    source = first.get_by_role("link", name=job_run.name)
    expect(source).to_have_attribute("href", f"/projects/lab/jobs/{item['id']}/")
    expect(first).to_contain_text(job_run.run_id)
    expect(first).to_contain_text(sha(WEIGHTS)[:12])
    second = section.locator('tr[data-version="2"]')
    expect(second).to_contain_text("notebook")
    expect(second).to_contain_text("s3://bucket/resnet-v2")
    expect(second.get_by_role("link", name="Download")).to_have_count(0)
    expect(second).to_contain_text("Stored elsewhere")

    with page.expect_download() as download_info:
        first.get_by_role("link", name="Download").click()
    download = download_info.value
    assert download.suggested_filename == "weights.bin"
    saved = tmp_path / "downloaded.bin"
    download.save_as(saved)
    assert saved.read_bytes() == WEIGHTS

    source.click()
    expect(page).to_have_url(f"{live_server.url}/projects/lab/jobs/{item['id']}/")
    assert not browser.js_errors, browser.js_errors
