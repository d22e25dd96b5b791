"""Site jobs ask for a number of GPUs (gpu_count); SSH and Local jobs name GPU IDs (gpu_ids). Through
the real API, the New job form, the launcher's claim and `mado-tracking jobs create` (PostgreSQL).
No scheduler runs here: the rendered submit script runs with a stand-in sbatch/qsub that records its
argv (tests/sites/shell_kit.py), which is exactly what a real scheduler would receive."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from django.urls import reverse

from jobs.models import Job
from tests.conftest import assert_error, bearer
from tests.job_fixtures import gpu_box, job_request  # noqa: F401  (fixtures)
from tests.sites.conftest import host_keys  # noqa: F401  (fixture)
from tests.sites.shell_kit import calls, run, standin
from tests.sites.site_jobs import claim, launcher, lclient, no_expiry_throttle, registered, site_of  # noqa: F401
from worker_agent.researcher import main

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def site(world, host_keys, launcher, tmp_path):
    # The spec directories live under tmp_path so the rendered script can run here.
    return site_of(world.project_admin, host_keys, launcher, working_dir=str(tmp_path / "work"))


@pytest.fixture
def bob(world):
    return bearer(world.member_token(world.member))


def create(client, target, **extra):
    return client.post("/api/projects/lab/jobs", job_request(target, **extra), format="json")


# API ----------------------------------------------------------------------------------------------

def test_a_site_job_asks_for_a_gpu_count_and_the_body_shows_it(bob, site, gpu_box):
    created = create(bob, site, gpu_count=2)
    assert created.status_code == 201, created.content
    assert created.json()["gpu_count"] == 2 and created.json()["gpu_ids"] == []
    assert Job.objects.get(pk=created.json()["id"]).gpu_count == 2
    assert bob.get(f"/api/jobs/{created.json()['id']}").json()["gpu_count"] == 2
    # Without one a site job runs on CPU only; SSH/Local jobs have no count at all.
    assert create(bob, site).json()["gpu_count"] == 0
    ssh = create(bob, gpu_box, gpu_ids=["1"]).json()
    assert ssh["gpu_count"] is None and ssh["gpu_ids"] == ["1"]


@pytest.mark.parametrize("value", [65, -1, "two", 1.5, True, [2]])
def test_a_gpu_count_that_is_not_0_to_64_is_refused_with_what_to_give(bob, site, value):
    body = assert_error(create(bob, site, gpu_count=value), 422, "invalid_job")
    assert "whole number of GPUs from 0 to 64" in body["fields"]["gpu_count"][0]
    assert not Job.objects.exists()


def test_ssh_and_local_computers_refuse_gpu_count_and_say_to_use_gpu_ids(bob, gpu_box):
    body = assert_error(create(bob, gpu_box, gpu_count=1), 422, "invalid_job")
    assert "gpu_ids" in body["fields"]["gpu_count"][0] and "gpu-host-1 is not a site" in body["error"]


def test_sites_refuse_gpu_ids_and_say_to_use_gpu_count(bob, site):
    body = assert_error(create(bob, site, gpu_ids=["0"]), 422, "invalid_job")
    assert "gpu_count instead of gpu_ids" in body["fields"]["gpu_ids"][0]


def test_a_site_cluster_job_counts_gpus_per_replica_not_gpu_count(bob, site):
    body = assert_error(create(bob, site, cluster_size=2, gpu_count=2), 422, "invalid_job")
    assert "gpus_per_replica" in body["fields"]["gpu_count"][0]
    created = create(bob, site, cluster_size=2, gpus_per_replica=3)
    assert created.status_code == 201, created.content
    assert created.json()["gpus_per_replica"] == 3 and created.json()["gpu_count"] is None


# Launcher claim and the scheduler's argv ----------------------------------------------------------

def _submit_with_standin(tmp_path: Path, item: dict, command: str) -> list[str]:
    """Run the claimed script as the launcher would (its spec directories made first) with a stand-in
    scheduler command; returns the argv that command received."""
    for entry in item["jobs"]:
        Path(entry["spec_dir"]).mkdir(parents=True, mode=0o700)
    script = tmp_path / "submit.sh"
    script.write_text(item["script"])
    bin_dir = tmp_path / "bin"
    standin(bin_dir, command, stdout="4242\n" if command == "sbatch" else "4242.server\n")
    result = run(script, bin_dir)
    assert result.returncode == 0, result.stderr
    [call] = calls(bin_dir, command)
    return call["argv"]


def test_a_claimed_slurm_job_with_gpu_count_2_exports_it_and_sbatch_gets_gres(bob, site, lclient, tmp_path):
    job_id = create(bob, site, gpu_count=2).json()["id"]
    [item] = claim(lclient, site)
    assert item["job_ids"] == [job_id]
    assert "export MMT_GPU_COUNT=2" in item["script"]
    argv = _submit_with_standin(tmp_path, item, "sbatch")
    assert "--gres=gpu:2" in argv and argv[-1].endswith(f"/{job_id}/batch.sh")


def test_a_claimed_pbs_job_with_gpu_count_2_asks_qsub_for_ngpus(world, bob, host_keys, launcher, lclient, tmp_path):
    pbs = site_of(world.project_admin, host_keys, launcher, name="pbs-cluster", template="pbs",
                  working_dir=str(tmp_path / "work"), variables="")
    create(bob, pbs, gpu_count=2)
    [item] = claim(lclient, pbs)
    argv = _submit_with_standin(tmp_path, item, "qsub")
    assert any(re.fullmatch(r"select=1(:ncpus=\d+)?:ngpus=2", a) for a in argv), argv


def test_a_cpu_only_site_job_asks_for_no_gres(bob, site, lclient, tmp_path):
    create(bob, site)
    [item] = claim(lclient, site)
    assert "export MMT_GPU_COUNT=0" in item["script"]
    assert not any(a.startswith("--gres") for a in _submit_with_standin(tmp_path, item, "sbatch"))


# New job form -------------------------------------------------------------------------------------

def test_the_form_offers_gpus_for_sites_and_creates_a_job_with_gpu_count(client, world, site, gpu_box):
    client.force_login(world.member)
    url = reverse("job-create", args=["lab"])
    on_site = client.get(url, {"fragment": "computer", "computer": site.pk}, **HTMX).content.decode()
    assert '<div id="gpu-count-field" hx-swap-oob="true">' in on_site and 'name="gpu_count"' in on_site
    on_ssh = client.get(url, {"fragment": "computer", "computer": gpu_box.pk}, **HTMX).content.decode()
    assert '<div id="gpu-count-field" hx-swap-oob="true">' in on_ssh and 'name="gpu_count"' not in on_ssh
    assert 'name="gpu_ids"' in on_ssh
    # Without JavaScript the page reloads with the chosen computer and shows the field too.
    assert 'name="gpu_count"' in client.get(url, {"computer": site.pk}).content.decode()
    response = client.post(url, {"computer": site.pk, "runtime": "python", "command": "python train.py",
                                 "parameters": "{}", "gpu_count": "2"})
    job = Job.objects.get()
    assert response.status_code == 302 and job.gpu_count == 2 and job.gpu_ids == []
    page = client.get(reverse("job-detail", args=["lab", job.pk])).content.decode()
    assert re.search(r'id="job-gpus">2 GPUs, picked by the site', page)


def test_the_form_shows_a_gpu_count_over_64_under_the_field(client, world, site):
    client.force_login(world.member)
    page = client.post(reverse("job-create", args=["lab"]), {
        "computer": site.pk, "runtime": "python", "command": "python train.py", "gpu_count": "65"}).content.decode()
    assert not Job.objects.exists()
    assert re.search(r'data-field="gpu_count">.*?less than or equal to 64', page, re.DOTALL)


# CLI ----------------------------------------------------------------------------------------------

@pytest.fixture
def cli(world, live_server):
    token = world.token(world.member, ["read", "jobs:write"])

    def invoke(*args):
        return CliRunner().invoke(main, list(args), env={"MMT_API_URL": live_server.url, "MMT_API_TOKEN": token,
                                                         "MMT_API_TOKEN_FILE": None})
    return invoke


@pytest.mark.django_db(transaction=True)
def test_the_cli_sends_gpu_count_for_a_site_job(cli, site, gpu_box):
    result = cli("jobs", "create", "--computer", str(site.pk), "--gpu-count", "2", "--", "python", "train.py")
    assert result.exit_code == 0, result.output
    assert Job.objects.get().gpu_count == 2 and "on hpc-cluster" in result.output
    refused = cli("jobs", "create", "--computer", str(gpu_box.pk), "--gpu-count", "2", "--", "python", "x.py")
    assert refused.exit_code != 0 and "gpu_ids" in refused.output
    both = cli("jobs", "create", "--computer", str(site.pk), "--gpu", "0", "--gpu-count", "1", "--", "python", "x.py")
    assert both.exit_code == 2 and "not both" in both.output
    assert Job.objects.count() == 1
