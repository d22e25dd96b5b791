"""A job shows the dataset versions it reads: `input_datasets` in its API body (in the order given)
and a list of links to the version pages in the job page's Details (PostgreSQL, Django test client)."""
from __future__ import annotations

import pytest
from django.urls import reverse

from jobs import services as job_services
from mado.services import Actor
from tests.conftest import bearer
from tests.datasets_transfer.conftest import make_version
from tests.job_fixtures import gpu_box, job_request  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db


@pytest.fixture
def versions(world, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    speech = make_version(world.member, world.project, "speech", {"a.wav": b"a" * 10})
    labels = make_version(world.member, world.project, "labels", {"l.txt": b"l"})
    return labels, speech


@pytest.fixture
def job(world, gpu_box, versions):
    labels, speech = versions
    return job_services.create_job(Actor(world.member), world.project,
                                   {**job_request(gpu_box), "input_datasets": [speech.pk, labels.pk]})


def summary(version) -> dict:
    return {"id": version.pk, "dataset": {"id": version.dataset_id, "name": version.dataset.name},
            "number": version.number, "digest": version.digest}


def test_the_job_body_lists_its_input_versions_in_the_order_given(world, job, versions):
    labels, speech = versions
    viewer = bearer(world.member_token(world.viewer))
    body = viewer.get(f"/api/jobs/{job.pk}").json()
    assert body["input_datasets"] == [summary(speech), summary(labels)]
    assert body["input_datasets"][0]["digest"].startswith("sha256:") and body["input_datasets"][0]["number"] == 1
    [listed] = viewer.get("/api/projects/lab/jobs").json()["items"]
    assert listed["input_datasets"] == body["input_datasets"]


def test_a_job_without_inputs_has_an_empty_list(world, gpu_box):
    created = bearer(world.member_token(world.member)).post("/api/projects/lab/jobs", job_request(gpu_box),
                                                             format="json")
    assert created.status_code == 201 and created.json()["input_datasets"] == []


def test_the_job_page_links_each_input_to_its_version_page(client, world, job, versions):
    labels, speech = versions
    client.force_login(world.viewer)
    page = client.get(reverse("job-detail", args=["lab", job.pk])).content.decode()
    links = [reverse("dataset-version", args=["lab", v.dataset_id, v.pk]) for v in (speech, labels)]
    assert all(f'href="{link}"' in page for link in links)
    assert page.index(links[0]) < page.index(links[1])
    assert f'{links[0]}">speech v1</a>' in page and speech.digest_prefix in page
    # The links lead somewhere the viewer can open.
    assert client.get(links[0]).status_code == 200


def test_the_job_page_of_a_job_without_inputs_has_no_inputs_entry(client, world, gpu_box):
    job = job_services.create_job(Actor(world.member), world.project, job_request(gpu_box))
    client.force_login(world.member)
    assert 'id="job-inputs"' not in client.get(reverse("job-detail", args=["lab", job.pk])).content.decode()


def test_a_list_that_prefetches_the_inputs_reads_them_without_a_query_per_job(world, job, versions,
                                                                               django_assert_num_queries):
    from datasets.services import PREFETCH_JOB_INPUTS, job_inputs_summary
    from jobs.models import Job

    [fetched] = Job.objects.filter(pk=job.pk).prefetch_related(PREFETCH_JOB_INPUTS)
    with django_assert_num_queries(0):
        assert job_inputs_summary(fetched) == [summary(versions[1]), summary(versions[0])]
