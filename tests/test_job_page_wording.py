"""What the Jobs pages say, through Django's test client (issue 15, items 9, 10, 12, 13 and 14): the Jobs
pages' own words in Japanese (Jobs, 状態) while the Workers table keeps the seed's 接続状態 and 担当Job数;
timeline lines as one sentence in the reader's language, a failed Job 失敗 on its badge and in its
timeline; the Parameters help naming MMT_PARAMETERS_FILE; the command as it was typed; a failed site
Job naming who claimed it; "No artifacts" once a Job has ended; whole-number step ticks on charts."""
from __future__ import annotations

import re
import shlex
from html import unescape

import pytest
from django.conf import settings
from django.urls import reverse

from jobs import charts, services
from mado.services import Actor
from sites import services as site_services
from tests.conftest import bearer
from tests.job_fixtures import job_request
from tests.sites import conftest as site_fixtures

host_keys = site_fixtures.host_keys  # fixture of tests/sites

pytestmark = pytest.mark.django_db


def japanese(client):
    """The language the user chose in the top bar's menu: Django's language cookie."""
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "ja"
    return client


def text(response) -> str:
    """The page's text with tags removed and spaces collapsed, as a reader sees it."""
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", response.content.decode(), flags=re.DOTALL)
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", body)))


def section(response, element_id: str) -> str:
    page = response.content.decode()
    match = re.search(rf'<(\w+)[^>]*\bid="{element_id}"[^>]*>(.*?)</\1>', page, re.DOTALL)
    assert match, f"no #{element_id} in the page"
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", match.group(2)))).strip()


def timeline_lines(response) -> list[str]:
    block = re.search(r'<ol class="timeline">(.*?)</ol>', response.content.decode(), re.DOTALL).group(1)
    items = re.findall(r"<li[^>]*>(.*?)</li>", block, re.DOTALL)
    return [re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", item))).strip() for item in items]


def ended_job(world, target, worker, status="failed", exit_code=1, **extra):
    job = services.create_job(Actor(world.member), world.project, job_request(target, **extra))
    item = worker.claim()
    assert worker.heartbeat(item, "running").status_code == 200
    assert worker.complete(item, status=status, exit_code=exit_code).status_code == 200
    job.refresh_from_db()
    return job


def detail_url(job) -> str:
    return reverse("job-detail", args=[job.project.slug, job.pk])


# Item 9: the Jobs pages' own words -------------------------------------------------------------

def test_the_jobs_pages_say_jobs_and_status_in_japanese_while_the_workers_table_keeps_its_columns(
    client, world, gpu_box, job_worker
):
    job = services.create_job(Actor(world.member), world.project, job_request(gpu_box))
    japanese(client).force_login(world.member)

    listing = client.get(reverse("jobs", args=["lab"]))
    heading = re.search(r"<h1>(.*?)</h1>", listing.content.decode()).group(1)
    crumbs = re.search(r'<p class="crumbs">(.*?)</p>', listing.content.decode(), re.DOTALL).group(1)
    columns = re.findall(r"<th>(.*?)</th>", listing.content.decode())
    assert heading == "Jobs" and crumbs.rstrip().endswith("› Jobs"), (heading, crumbs)
    assert "状態" in columns and "接続状態" not in columns and "担当Job数" not in text(listing), columns
    # The top bar's project switcher is labelled in Japanese too.
    assert re.search(r'<label for="project-switch">プロジェクト</label>', listing.content.decode())

    page = client.get(detail_url(job))
    assert "担当Job数" not in text(page) and "› Jobs ›" in text(page)
    dialog = client.get(reverse("job-stop", args=["lab", job.pk]))
    assert "<dt>状態</dt>" in dialog.content.decode() and "接続状態" not in text(dialog)

    # The Workers table of Compute keeps the seed's column names (接続状態, 担当Job数).
    workers = client.get(reverse("project-compute", args=["lab"])).content.decode()
    head = re.search(r'<table class="list workers">\s*<thead>(.*?)</thead>', workers, re.DOTALL).group(1)
    assert "<th>接続状態</th>" in head and "<th>担当Job数</th>" in head


def test_each_timeline_line_is_one_japanese_sentence_and_a_failed_job_reads_shippai_as_its_badge(
    client, world, gpu_box, job_worker
):
    job = ended_job(world, gpu_box, job_worker, status="failed", exit_code=1)
    japanese(client).force_login(world.member)
    page = client.get(detail_url(job))
    lines = timeline_lines(page)
    assert len(lines) == 4, lines
    sentences = [line.split(" ", 1)[1] for line in lines]  # after the time
    assert sentences == ["bobが作成しました", "worker lab-worker-1が受け取りました", "開始", "失敗（終了コード 1）"], sentences
    for sentence in sentences:
        assert not re.search(r"\b(by|exit code|Claimed|Created|Failed)\b", sentence), sentence
    assert "NG" not in section(page, "job-timeline")
    badge = re.search(r'<span class="status status-failed">(.*?)</span>', page.content.decode()).group(1)
    assert badge == "失敗"


def test_the_english_timeline_reads_as_the_events_were_written(client, world, gpu_box, job_worker):
    job = ended_job(world, gpu_box, job_worker, status="finished", exit_code=0)
    client.force_login(world.member)
    sentences = [line.split(" ", 1)[1] for line in timeline_lines(client.get(detail_url(job)))]
    assert sentences == ["Created by bob", "Claimed by worker lab-worker-1", "Started", "Finished (exit code 0)"]


# Item 10: the Parameters help ------------------------------------------------------------------

def test_the_parameters_help_names_mmt_parameters_file_in_both_languages(client, world, gpu_box):
    client.force_login(world.member)
    english = section(client.get(reverse("job-create", args=["lab"])), "id_parameters_help")
    assert "MMT_PARAMETERS_FILE" in english and not re.search(r"MMT_PARAMETERS\b(?!_FILE)", english), english
    ja = section(japanese(client).get(reverse("job-create", args=["lab"])), "id_parameters_help")
    assert "MMT_PARAMETERS_FILE" in ja and "JSON" in ja and "The Job" not in ja, ja


# Item 12: the command as typed -----------------------------------------------------------------

@pytest.mark.parametrize("typed", [
    """python -c "print('hello')" --lr 0.01""",
    """python train.py --name 'run 1' --note "it's fine" """.strip(),
])
def test_the_job_page_shows_the_command_as_it_was_typed(client, world, gpu_box, typed):
    client.force_login(world.member)
    response = client.post(reverse("job-create", args=["lab"]), {
        "computer": gpu_box.pk, "runtime": "python", "command": typed, "parameters": "{}"})
    assert response.status_code == 302, response.content.decode()[-2000:]
    shown = section(client.get(response["Location"]), "job-command")
    assert shown == typed and "'\"'\"'" not in shown


@pytest.mark.parametrize("argv", [
    ["python", "train.py"], ["echo", "it's \"quoted\" \\ here"], ["echo", "$HOME's"], ["a b", ""],
    ["x", "line\nbreak's"],
])
def test_the_shown_command_splits_back_into_the_same_arguments(argv):
    from jobs.models import readable_command

    line = readable_command(argv)
    assert shlex.split(line) == argv and "'\"'\"'" not in line


# Item 13: a failed site Job's page -------------------------------------------------------------

@pytest.fixture
def manual_pc(world, host_keys):
    """bob's own PC, a Public manual site: its Jobs are claimed by `mado-tracking submit`."""
    return site_services.create_site(Actor(world.member), {
        "name": "bobs-pc", "submission": "manual", "account": "shared", "host": "", "port": 22, "ssh_user": "",
        "jump_hosts": [], "known_hosts": "", "working_dir": "/home/bob/mmt", "runner_python": "/usr/bin/python3",
        "runner_api_url": "https://tracking.example.org", "variables": "", "template": "slurm",
        "visibility": "public"})


SCHEDULER_ERROR = "sbatch: error: Batch job submission failed\nsbatch: error: invalid partition specified: gpu"


def failed_site_job(world, pc):
    bob = bearer(world.member_token(world.member))
    created = bob.post("/api/projects/lab/jobs", job_request(pc), format="json")
    assert created.status_code == 201, created.content
    job_id = created.json()["id"]
    claimed = bob.post(f"/api/sites/{pc.pk}/submissions/claim", {"limit": 1}, format="json")
    assert claimed.json()["items"][0]["job_ids"] == [job_id], claimed.content
    reported = bob.post(f"/api/sites/{pc.pk}/submissions/report",
                        {"job_ids": [job_id], "outcome": "failed", "error": SCHEDULER_ERROR}, format="json")
    assert reported.json()["jobs"][0]["status"] == "failed", reported.content
    from jobs.models import Job

    return Job.objects.get(pk=job_id)


def test_a_failed_site_job_names_who_claimed_it_as_its_timeline_does(client, world, manual_pc):
    job = failed_site_job(world, manual_pc)
    client.force_login(world.member)
    page = client.get(detail_url(job))
    claimer = section(page, "job-claimer")
    assert claimer == "bob with mado-tracking submit", claimer
    assert "Not claimed yet" not in text(page)
    assert any("Claimed by bob with mado-tracking submit" in line for line in timeline_lines(page))
    # The scheduler's lines stay lines in the Error block (its CSS keeps them: tests/test_browser_job_page.py).
    error = re.search(r'<dd class="errors job-error" id="job-error">(.*?)</dd>', page.content.decode(),
                      re.DOTALL).group(1)
    assert "failed\nsbatch: error: invalid partition" in unescape(error)

    ja = japanese(client).get(detail_url(job))
    assert section(ja, "job-claimer") == "bobのmado-tracking submit"
    assert any("bobがmado-tracking submitで受け取りました" in line for line in timeline_lines(ja))


def test_a_job_canceled_in_the_queue_was_never_claimed(client, world, gpu_box):
    job = services.create_job(Actor(world.member), world.project, job_request(gpu_box))
    client.force_login(world.member)
    assert section(client.get(detail_url(job)), "job-claimer") == "Not claimed yet"
    services.request_stop(Actor(world.member), job)
    assert section(client.get(detail_url(job)), "job-claimer") == "Never claimed"


# Item 14: ended Jobs, chart ticks --------------------------------------------------------------

def test_a_finished_job_has_no_artifacts_while_a_running_one_has_none_yet(client, world, gpu_box, job_worker):
    running = services.create_job(Actor(world.member), world.project, job_request(gpu_box))
    item = job_worker.claim()
    assert job_worker.heartbeat(item, "running").status_code == 200
    client.force_login(world.member)
    before = client.get(detail_url(running))
    assert section(before, "job-artifacts").endswith("No artifacts yet.")
    assert section(before, "run-charts") == "No metrics yet."  # the Job's Run panel holds its metrics
    assert job_worker.complete(item).status_code == 200
    page = client.get(detail_url(running))
    assert section(page, "job-artifacts").endswith("No artifacts.")
    assert section(page, "run-charts") == "No metrics." and 'id="job-metrics"' not in page.content.decode()
    assert 'data-empty="No output."' in page.content.decode()
    ja = japanese(client).get(detail_url(running))
    assert "まだ" not in section(ja, "job-artifacts") and "Artifactはありません。" in section(ja, "job-artifacts")
    assert section(ja, "run-charts") == "メトリクスはありません。"


@pytest.mark.parametrize("steps", [range(1, 11), range(0, 4), range(3, 4), range(0, 1001, 7)])
def test_chart_step_ticks_are_whole_numbers(steps):
    svg = charts.line_chart("loss", [(step, 1 / (step + 1)) for step in steps])
    ticks = re.findall(rf'<text class="tick"[^>]*y="{charts.HEIGHT - 8}"[^>]*>([^<]*)</text>', svg)
    assert len(ticks) >= 2, ticks
    assert all(re.fullmatch(r"-?\d+", tick) for tick in ticks), ticks
