"""The kind of a Job's Run (training, fine-tuning, inference, evaluation, preprocessing, other), chosen on
the New job form and in the API's job creation (issue 16, item 1): tracking reads the create_job option
`run_kind` through jobs.hooks."""
from __future__ import annotations

import re
from html import unescape

import pytest
from django.conf import settings
from django.urls import reverse

from jobs.models import Job
from tests.conftest import assert_error, bearer
from tests.job_fixtures import job_request
from tracking.models import Run

pytestmark = pytest.mark.django_db


def _select(response, name: str) -> dict[str, str]:
    """value → label of the options of the select `name`, as the page shows them."""
    page = response.content.decode()
    block = re.search(rf'<select name="{name}"[^>]*>(.*?)</select>', page, re.DOTALL)
    assert block, f"no select {name} on the page"
    return {value: unescape(label).strip()
            for value, label in re.findall(r'<option value="([^"]*)"[^>]*>(.*?)</option>', block.group(1))}


def test_the_api_sets_the_kind_of_the_jobs_run(world, gpu_box):
    client = bearer(world.token(world.member, ["read", "jobs:write"]))
    response = client.post("/api/projects/lab/jobs", job_request(gpu_box, run_kind="evaluation"), format="json")
    assert response.status_code == 201, response.content
    assert Run.objects.get(job_id=response.json()["id"]).kind == "evaluation"
    plain = client.post("/api/projects/lab/jobs", job_request(gpu_box), format="json")
    assert Run.objects.get(job_id=plain.json()["id"]).kind == "other"


def test_an_unknown_kind_is_refused_naming_the_field_and_no_job_is_created(world, gpu_box):
    client = bearer(world.token(world.member, ["read", "jobs:write"]))
    body = assert_error(client.post("/api/projects/lab/jobs", job_request(gpu_box, run_kind="baking"),
                                    format="json"), 422)
    assert "run_kind" in body.get("fields", {}), body
    assert "fine-tuning" in body["error"]
    assert not Job.objects.exists()


def test_the_new_job_form_offers_the_kinds_in_japanese_and_sets_the_runs_kind(client, world, gpu_box):
    client.force_login(world.member)
    url = reverse("job-create", args=["lab"])
    english = _select(client.get(url), "run_kind")
    assert list(english) == ["training", "fine-tuning", "inference", "evaluation", "preprocessing", "other"]
    assert english["fine-tuning"] == "Fine-tuning"
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "ja"
    page = client.get(url)
    assert _select(page, "run_kind") == {"training": "学習", "fine-tuning": "ファインチューニング",
                                         "inference": "推論", "evaluation": "評価", "preprocessing": "前処理",
                                         "other": "その他"}
    assert "Runの種類" in page.content.decode()
    response = client.post(url, {"computer": gpu_box.pk, "runtime": "python", "command": "python train.py",
                                 "parameters": "{}", "run_kind": "training"})
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert Run.objects.get(job=Job.objects.get()).kind == "training"


def test_the_form_shows_an_unknown_kind_under_its_field(client, world, gpu_box):
    client.force_login(world.member)
    response = client.post(reverse("job-create", args=["lab"]), {
        "computer": gpu_box.pk, "runtime": "python", "command": "python train.py", "parameters": "{}",
        "run_kind": "baking"})
    assert response.status_code == 200
    field = re.search(r'data-field="run_kind">(.*?)</div>\s*(?=<div class="field|<footer|<fieldset)',
                      response.content.decode(), re.DOTALL)
    assert field and 'class="errors"' in field.group(1) and "baking" in unescape(field.group(1))
    assert not Job.objects.exists()
