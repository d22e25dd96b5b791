"""The seeds' Japanese wording on the main pages, with the browser asking for Japanese."""
from __future__ import annotations

import pytest

from tests.job_fixtures import gpu_computer


@pytest.fixture
def ja_client(client):
    client.defaults["HTTP_ACCEPT_LANGUAGE"] = "ja"
    return client


def test_the_jobs_page_speaks_the_seeds_japanese(world, ja_client):
    box = gpu_computer(world.global_admin)
    ja_client.force_login(world.member)
    ja_client.post("/projects/lab/jobs/new", {"computer": box.pk, "runtime": "python", "command": "python x.py"})
    page = ja_client.get("/projects/lab/jobs/").content.decode()
    for term in ["停止を要求", "作成者", "操作", "Jobを作成"]:
        assert term in page, term


def test_the_computers_page_speaks_the_seeds_japanese(world, ja_client):
    ja_client.force_login(world.global_admin)
    page = ja_client.get("/settings/computers/").content.decode()
    assert "コンピュータを追加" in page and "全体設定" in page


def test_a_failed_job_is_not_called_ng_like_a_failed_check_item(world):
    from django.utils import translation

    from computers.choices import ItemStatus
    from jobs.choices import JobStatus

    with translation.override("ja"):
        assert str(JobStatus.FAILED.label) == "失敗"
        assert str(ItemStatus.FAILED.label) == "NG"
