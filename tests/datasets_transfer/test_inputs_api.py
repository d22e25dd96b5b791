"""Input versions of a job on the server: what job creation accepts (clean_input_datasets), what the
claim carries (claim_payload), and the worker's reads of a job's inputs under its lease: only the
holding worker, only while the job is held, only that job's versions; Range works; a blob missing
from storage is 404."""
from __future__ import annotations

import pytest

from datasets import services
from datasets.models import DatasetVersion
from jobs import services as job_services
from mado.errors import ServiceError
from mado.services import Actor
from tests.datasets_transfer.conftest import make_version, manifest_of, sample_files  # noqa: F401
from tests.job_fixtures import gpu_box, job_request, job_worker  # noqa: F401
from tests.sites.conftest import host_keys, launcher, make_site, site_fields  # noqa: F401


@pytest.fixture
def files():
    return sample_files(5, 300 * 1024)


@pytest.fixture
def version(world, files, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return make_version(world.member, world.project, "speech", files)


def test_clean_accepts_complete_versions_of_the_project_in_order(world, version):
    other = make_version(world.member, world.project, "labels", {"a.txt": b"a"})
    assert services.clean_input_datasets(world.member, world.project, [other.pk, str(version.pk)]) == [other, version]
    assert services.clean_input_datasets(world.member, world.project, None) == []


@pytest.mark.parametrize("raw, message", [
    ("12", "lists dataset version ids"), ([True], "lists dataset version ids"), ([0], "lists dataset version ids"),
    ([99999], "has no dataset version 99999"), (list(range(1, 18)), "at most 16"),
])
def test_clean_refuses_bad_input_with_what_to_fix(world, version, raw, message):
    with pytest.raises(ServiceError) as refused:
        services.clean_input_datasets(world.member, world.project, raw)
    assert message in refused.value.message and "input_datasets" in refused.value.fields


def test_clean_refuses_twice_uploading_uri_and_other_projects(world, version, other_project):
    with pytest.raises(ServiceError, match="twice"):
        services.clean_input_datasets(world.member, world.project, [version.pk, version.pk])
    uploading, _ = services.create_version(Actor(world.member), version.dataset, manifest_of({"new.txt": b"x"}))
    with pytest.raises(ServiceError, match="still uploading"):
        services.clean_input_datasets(world.member, world.project, [uploading.pk])
    remote = DatasetVersion.objects.create(dataset=version.dataset, digest="sha256:" + "0" * 64, uri="s3://b/k",
                                           created_by=world.member, status="complete", number=9)
    with pytest.raises(ServiceError, match="stored elsewhere"):
        services.clean_input_datasets(world.member, world.project, [remote.pk])
    with pytest.raises(ServiceError, match="has no dataset version"):  # not the other project's versions
        services.clean_input_datasets(world.member, other_project, [version.pk])


@pytest.fixture
def other_project(world):
    from mado.models import Project
    return Project.objects.create(slug="elsewhere", name="Elsewhere")


@pytest.fixture
def claimed(world, version, gpu_box, job_worker):
    job = job_services.create_job(Actor(world.member), world.project,
                                  {**job_request(gpu_box), "input_datasets": [version.pk]})
    item = job_worker.claim()
    assert item["id"] == job.pk
    return job, item


def test_the_claim_carries_each_input_version(claimed, version):
    job, item = claimed
    [payload] = item["input_datasets"]
    assert payload == services.claim_payload(job)[0]
    assert payload["id"] == version.pk and payload["digest"] == version.digest
    assert payload["total_size"] == version.total_size and payload["dataset"]["name"] == "speech"
    assert payload["worker_files_url"] == f"/api/worker/jobs/{job.pk}/datasets/{version.pk}/files/"
    assert payload["files_url"].startswith(f"/api/projects/lab/datasets/{version.dataset_id}/versions/{version.pk}")


def lease(item, worker_id="lab-worker-1") -> dict:
    return {"worker_id": worker_id, "lease_id": item["lease_id"]}


def test_the_holding_worker_reads_manifest_and_ranges(claimed, version, files, job_worker):
    job, item = claimed
    [payload] = item["input_datasets"]
    manifest = job_worker.client.get(payload["worker_manifest_url"], lease(item))
    assert manifest.status_code == 200 and manifest.json()["items"] == manifest_of(files)
    url = payload["worker_files_url"] + "big/audio.bin"
    whole = job_worker.client.get(url, lease(item))
    assert b"".join(whole.streaming_content) == files["big/audio.bin"]
    part = job_worker.client.get(url, lease(item), HTTP_RANGE="bytes=1000-")
    assert part.status_code == 206 and b"".join(part.streaming_content) == files["big/audio.bin"][1000:]


def test_worker_reads_are_refused_outside_the_lease(claimed, version, world, job_worker, settings):
    job, item = claimed
    [payload] = item["input_datasets"]
    url = payload["worker_manifest_url"]
    assert job_worker.client.get(url, {**lease(item), "lease_id": "0" * 32}).status_code == 409
    assert job_worker.client.get(url, {"worker_id": "lab-worker-1"}).status_code == 400
    other = make_version(world.member, world.project, "labels", {"a.txt": b"a"})
    refused = job_worker.client.get(url.replace(f"/datasets/{version.pk}/", f"/datasets/{other.pk}/"), lease(item))
    assert refused.status_code == 404 and refused.json()["code"] == "not_an_input"
    entry = version.entries.select_related("file").get(path="big/audio.bin")
    (settings.MEDIA_ROOT / entry.file.file.name).unlink()
    gone = job_worker.client.get(payload["worker_files_url"] + "big/audio.bin", lease(item))
    assert gone.status_code == 404 and gone.json()["code"] == "file_missing"
    job_worker.complete(item)
    ended = job_worker.client.get(url, lease(item))
    assert ended.status_code == 409 and ended.json()["code"] == "job_ended"


def test_a_job_token_reads_the_inputs_through_the_project_api(claimed, files):
    from tests.conftest import bearer

    job, item = claimed
    [payload] = item["input_datasets"]
    client = bearer(item["job_token"])
    assert client.get(payload["manifest_url"]).json()["items"] == manifest_of(files)
    answer = client.get(payload["files_url"] + "labels/ラベル.json")
    assert answer.status_code == 200 and b"".join(answer.streaming_content) == files["labels/ラベル.json"]


def test_cache_usage_reports_are_checked(claimed, job_worker, world):
    job, item = claimed
    bad = job_worker.leased(item, "dataset-cache", usage={"used_bytes": -1})
    assert bad.status_code == 422 and "used_bytes" in bad.json()["error"]
    good = job_worker.leased(item, "dataset-cache", usage={"used_bytes": 5, "limit_bytes": 10, "complete_count": 1,
                                                           "pinned_count": 1})
    assert good.status_code == 200
    assert job.target.dataset_cache_report.used_bytes == 5


def test_a_site_job_with_input_datasets_is_refused_rather_than_run_without_them(world, version, make_site):  # noqa: F811
    """The site runner does not fetch datasets: creating such a Job says so instead of losing the inputs."""
    target = make_site(world.project_admin, visibility="public")
    with pytest.raises(ServiceError) as refused:
        job_services.create_job(Actor(world.project_admin), world.project,
                                {"computer": target.pk, "runtime": target.runtimes[0], "image": "img.sif",
                                 "command": ["python", "train.py"], "input_datasets": [version.pk]})
    assert "input datasets reach SSH and Local computers only" in refused.value.fields["input_datasets"][0]
