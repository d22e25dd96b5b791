"""Project → Datasets: datasets with their versions, and a version's files a page at a time."""
from __future__ import annotations

import pytest

from datasets.models import DatasetVersion
from jobs.models import Job
from tests.datasets.conftest import manifest_of
from tests.job_fixtures import gpu_computer


@pytest.fixture
def corpus(uploader):
    uploader.create_dataset("speech", description="Read speech")
    first = uploader.upload("speech", {f"clips/{i:03}.wav": f"clip {i}".encode() for i in range(150)})
    second = uploader.create_version("speech", manifest_of({"one.wav": b"x" * 2048}))
    return first, second.json()


def test_the_datasets_page_lists_versions_with_counts_sizes_digests_and_producing_jobs(world, client, corpus):
    first, uploading = corpus
    job = Job.objects.create(project=world.project, created_by=world.member, target=gpu_computer(world.global_admin),
                             name="prepare-audio")
    produced = DatasetVersion.objects.get(pk=first["id"])
    produced.job = job
    produced.save()
    client.force_login(world.viewer)
    home = client.get("/projects/lab/").content.decode()
    assert 'href="/projects/lab/datasets/"' in home
    page = client.get("/projects/lab/datasets/").content.decode()
    assert "speech" in page and "Read speech" in page
    assert f'href="/projects/lab/datasets/{produced.dataset_id}/versions/{first["id"]}/">v1</a>' in page
    assert "150" in page and first["digest"].removeprefix("sha256:")[:12] in page
    assert f'href="/projects/lab/jobs/{job.pk}/">prepare-audio</a>' in page
    assert "Uploading" in page and f"ID {uploading['id']}</small>" in page, "an unfinished upload shows by its id"
    assert "mado-tracking datasets upload" not in page, "viewers cannot upload"


def test_the_version_page_shows_its_files_a_page_at_a_time(world, client, corpus):
    first, _ = corpus
    version = DatasetVersion.objects.get(pk=first["id"])
    client.force_login(world.member)
    url = f"/projects/lab/datasets/{version.dataset_id}/versions/{version.pk}/"
    page = client.get(url).content.decode()
    assert "clips/000.wav" in page and "clips/099.wav" in page and "clips/100.wav" not in page
    assert "Page 1 of 2" in page and version.digest in page
    assert f"/api/projects/lab/datasets/{version.dataset_id}/versions/{version.pk}/files/clips/000.wav" in page
    second_page = client.get(url + "?page=2").content.decode()
    assert "clips/149.wav" in second_page and "clips/000.wav" not in second_page


def test_outsiders_do_not_see_datasets(world, client, corpus):
    first, _ = corpus
    client.force_login(world.outsider)
    assert client.get("/projects/lab/datasets/").status_code == 404
    version = DatasetVersion.objects.get(pk=first["id"])
    assert client.get(f"/projects/lab/datasets/{version.dataset_id}/versions/{version.pk}/").status_code == 404
