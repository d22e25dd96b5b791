"""The pages of tracking (issue 16, item 6): the Run panel of the job page (parameters, tags, a chart per
metric series that follows the running job, the code's artifacts beside result.json's), the project's
Runs list (filters, chosen columns), the comparison of 2–5 Runs, a standalone Run's page, who sees them,
Japanese, and the downsampling of a 100,000-point series."""
from __future__ import annotations

import re

import pytest
from django.test import Client

from jobs.models import Artifact
from mado.services import Actor
from tracking import services
from tracking.artifacts import root_of
from tracking.charts import COLUMNS
from tracking.models import Experiment, LatestMetric, Metric, Run
from tests.tracking_pages.conftest import log, log_params, set_tags, standalone_run

pytestmark = pytest.mark.django_db


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def polyline_points(svg_html: str) -> list[tuple[float, float]]:
    found = re.findall(r'<polyline[^>]*points="([^"]*)"', svg_html)
    return [tuple(map(float, pair.split(","))) for line in found for pair in line.split()]


def figure(html: str, metric: str) -> str:
    match = re.search(rf'<figure class="chart-card" data-metric="{re.escape(metric)}".*?</figure>', html, re.S)
    assert match, f"no chart of {metric}"
    return match.group(0)


def test_the_job_page_shows_its_runs_parameters_tags_charts_and_artifacts(world, running_job, settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path)
    job, _item, _worker = running_job
    run = job.run
    log_params(run, world.member, lr="0.01", batch_size=64)
    set_tags(run, world.member, team="vision")
    log(run, world.member, "loss", [1.0, 0.5, 0.25])
    log(run, world.member, "accuracy", [0.5, 0.75])
    (root_of(run) / "plots").mkdir(parents=True)
    (root_of(run) / "plots" / "confusion.txt").write_text("tp fp\nfn tn\n")
    Artifact.objects.create(job=job, path="model.pt", size=3, sha256="a" * 64, complete=True)

    page = client_for(world.viewer).get(f"/projects/lab/jobs/{job.pk}/")
    html = page.content.decode()
    assert page.status_code == 200
    assert 'id="run-panel"' in html and "Run train-resnet" in html and "Training" in html
    assert re.search(r'data-param="lr".*?0\.01', html, re.S) and re.search(r'data-param="batch_size".*?64', html, re.S)
    assert re.search(r'data-tag="team".*?vision', html, re.S)
    assert 'data-tag="mlflow.user"' not in html  # the client's bookkeeping stays out of the tags
    loss = figure(html, "loss")
    assert 'data-points="3"' in loss and "last 0.25 at step 2 · 3 points" in loss
    assert len(polyline_points(loss)) == 3
    assert len(polyline_points(figure(html, "accuracy"))) == 2
    # The code's artifact beside result.json's, and it downloads.
    assert 'data-artifact="plots/confusion.txt"' in html and 'data-artifact="model.pt"' in html
    download = client_for(world.viewer).get(f"/projects/lab/runs/{run.run_id}/artifacts/plots/confusion.txt")
    assert download.status_code == 200 and b"".join(download.streaming_content) == b"tp fp\nfn tn\n"
    assert "attachment" in download["Content-Disposition"]
    assert client_for(world.viewer).get(f"/projects/lab/runs/{run.run_id}/artifacts/../../x").status_code == 404


def test_the_job_pages_poll_brings_new_points_and_stops_when_the_job_ends(world, running_job):
    job, item, worker = running_job
    run = job.run
    client = client_for(world.member)
    log(run, world.member, "loss", [1.0, 0.5])
    html = client.get(f"/projects/lab/jobs/{job.pk}/").content.decode()
    version = re.search(r'hx-get="[^"]*/poll\?after=\d+&amp;v=(\w+)', html).group(1)
    assert len(polyline_points(figure(html, "loss"))) == 2

    quiet = client.get(f"/projects/lab/jobs/{job.pk}/poll", {"after": 0, "v": version})
    assert quiet.status_code == 200 and 'id="run-panel"' not in quiet.content.decode()  # nothing new

    log(run, world.member, "loss", [0.25, 0.125], first_step=2)
    fresh = client.get(f"/projects/lab/jobs/{job.pk}/poll", {"after": 0, "v": version})
    body = fresh.content.decode()
    assert fresh.status_code == 200 and re.search(r'id="run-panel"[^>]*hx-swap-oob="true"', body)
    assert len(polyline_points(figure(body, "loss"))) == 4

    assert worker.complete(item).status_code == 200
    last = client.get(f"/projects/lab/jobs/{job.pk}/poll", {"after": 0, "v": version})
    assert last.status_code == 286  # htmx stops polling
    assert re.search(r'id="run-status">Finished<', last.content.decode())


def test_the_runs_list_filters_and_shows_the_chosen_columns(world, running_job):
    job, _item, _worker = running_job
    job_run = job.run
    log_params(job_run, world.member, lr="0.01", batch="32")
    log(job_run, world.member, "loss", [0.9, 0.3])
    other_experiment = Experiment.objects.create(project=world.project, name="sweeps")
    notebook = standalone_run(world.project_admin, world.project, "notebook-eval", kind="evaluation",
                              experiment_id=other_experiment.pk)
    log_params(notebook, world.project_admin, lr="0.1")
    standalone_run(world.outsider, world.other_project, "elsewhere")
    client = client_for(world.viewer)

    def shown(**query) -> list[str]:
        page = client.get("/projects/lab/runs/", query)
        assert page.status_code == 200
        return re.findall(r'<tr data-run="(\w+)"', page.content.decode())

    assert set(shown()) == {job_run.run_id, notebook.run_id}  # never another project's
    assert shown(experiment=other_experiment.pk) == [notebook.run_id]
    services.update_run(Actor(world.project_admin), None, notebook, status="FINISHED")
    assert shown(status="FINISHED") == [notebook.run_id]
    assert notebook.run_id not in shown(status="RUNNING")
    assert shown(kind="training") == [job_run.run_id]
    assert shown(kind="evaluation") == [notebook.run_id]
    assert shown(creator="alice") == [notebook.run_id]
    assert shown(creator="bob") == [job_run.run_id]

    page = client.get("/projects/lab/runs/", {"params": "lr,batch", "metrics": "loss"}).content.decode()
    assert re.search(r'<th class="param-col" data-param="lr">lr</th><th class="param-col" data-param="batch">', page)
    assert '<th class="metric-col" data-metric="loss">loss</th>' in page
    job_row = re.search(rf'<tr data-run="{job_run.run_id}">.*?</tr>', page, re.S).group(0)
    assert "<code>0.01</code>" in job_row and "<code>32</code>" in job_row and '<td class="metric-col">0.3</td>' in job_row
    assert f'href="/projects/lab/jobs/{job.pk}/"' in job_row  # a job's Run links to its job page
    notebook_row = re.search(rf'<tr data-run="{notebook.run_id}">.*?</tr>', page, re.S).group(0)
    assert "<code>0.1</code>" in notebook_row and f'href="/projects/lab/runs/{notebook.run_id}/"' in notebook_row


def test_compare_overlays_the_metrics_of_two_to_five_runs(world, running_job):
    job, _item, _worker = running_job
    first = job.run
    second = standalone_run(world.member, world.project, "baseline")
    log(first, world.member, "loss", [1.0, 0.6, 0.3])
    log(second, world.member, "loss", [1.2, 0.9])
    log(second, world.member, "val_loss", [1.3])
    log_params(first, world.member, lr="0.01")
    log_params(second, world.member, lr="0.1")
    client = client_for(world.viewer)

    page = client.get("/projects/lab/runs/compare", {"run": [first.run_id, second.run_id]})
    html = page.content.decode()
    assert page.status_code == 200
    loss = figure(html, "loss")
    assert 'data-runs="2"' in loss and len(re.findall(r"<polyline", loss)) == 2
    assert 'data-runs="1"' in figure(html, "val_loss")
    assert re.search(r'data-param="lr" class="differs">.*?0\.01.*?0\.1', html, re.S)
    assert f'href="/projects/lab/jobs/{job.pk}/"' in html and f'href="/projects/lab/runs/{second.run_id}/"' in html

    one = client.get("/projects/lab/runs/compare", {"run": [first.run_id]})
    assert one.status_code == 400 and "Select from 2 to 5 Runs to compare; you selected 1." in one.content.decode()
    many = [standalone_run(world.member, world.project, f"r{i}").run_id for i in range(6)]
    assert client.get("/projects/lab/runs/compare", {"run": many}).status_code == 400
    elsewhere = standalone_run(world.outsider, world.other_project, "elsewhere")
    assert client.get("/projects/lab/runs/compare", {"run": [first.run_id, elsewhere.run_id]}).status_code == 404


def test_a_standalone_runs_page_polls_until_the_run_ends(world):
    run = standalone_run(world.member, world.project, "laptop-notebook", kind="evaluation")
    log(run, world.member, "acc", [0.5, 0.7])
    client = client_for(world.viewer)
    page = client.get(f"/projects/lab/runs/{run.run_id}/")
    html = page.content.decode()
    assert page.status_code == 200 and "laptop-notebook" in html and 'data-polling="true"' in html
    version = re.search(r'data-version="(\w+)"', html).group(1)
    assert client.get(f"/projects/lab/runs/{run.run_id}/panel", {"v": version}).status_code == 204
    log(run, world.member, "acc", [0.8], first_step=2)
    fresh = client.get(f"/projects/lab/runs/{run.run_id}/panel", {"v": version})
    assert fresh.status_code == 200 and len(polyline_points(figure(fresh.content.decode(), "acc"))) == 3
    Run.objects.filter(pk=run.pk).update(status="FINISHED", end_time=run.start_time + 1000)
    last = client.get(f"/projects/lab/runs/{run.run_id}/panel", {"v": version})
    assert last.status_code == 286 and 'data-polling="false"' in last.content.decode()


def test_a_job_runs_page_is_its_job_page(world, running_job):
    job, _item, _worker = running_job
    page = client_for(world.viewer).get(f"/projects/lab/runs/{job.run.run_id}/")
    assert page.status_code == 302 and page["Location"] == f"/projects/lab/jobs/{job.pk}/"


def test_someone_outside_the_project_gets_404_everywhere(world, running_job, settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path)
    job, _item, _worker = running_job
    run = standalone_run(world.member, world.project, "private")
    root_of(run).mkdir(parents=True)
    (root_of(run) / "secret.txt").write_text("x")
    outsider = client_for(world.outsider)
    for path in ("/projects/lab/runs/", f"/projects/lab/runs/{run.run_id}/", f"/projects/lab/runs/{run.run_id}/panel",
                 f"/projects/lab/runs/{run.run_id}/artifacts/secret.txt",
                 f"/projects/lab/runs/compare?run={run.run_id}&run={job.run.run_id}"):
        assert outsider.get(path).status_code == 404, path
    # A Run of lab under another project's address is not found either.
    assert outsider.get(f"/projects/other/runs/{run.run_id}/").status_code == 404
    assert client_for(world.viewer).get("/projects/lab/runs/").status_code == 200
    assert Client().get("/projects/lab/runs/").status_code == 302  # to the login page


def test_the_pages_speak_japanese(world, running_job):
    job, _item, _worker = running_job
    log(job.run, world.member, "loss", [1.0])
    client = client_for(world.viewer)
    runs = client.get("/projects/lab/runs/", HTTP_ACCEPT_LANGUAGE="ja").content.decode()
    assert "選んだRunを比較" in runs and "すべての実験" in runs and "Runの状態" in runs and "学習" in runs
    page = client.get(f"/projects/lab/jobs/{job.pk}/", HTTP_ACCEPT_LANGUAGE="ja").content.decode()
    assert "コードが記録したArtifact" in page and "最新値 1（step 0）· 1点" in page and "タグ" in page
    error = client.get("/projects/lab/runs/compare", {"run": [job.run.run_id]}, HTTP_ACCEPT_LANGUAGE="ja")
    assert "2〜5件のRunを選んで比較してください（選んだのは1件）。" in error.content.decode()
    home = client.get("/projects/lab/", HTTP_ACCEPT_LANGUAGE="ja").content.decode()
    assert 'href="/projects/lab/runs/">Runs</a>' in home


def test_a_100000_point_series_is_drawn_downsampled_min_max_per_pixel_column(world):
    run = standalone_run(world.member, world.project, "long")
    n = 100_000
    # A slow fall with one spike at step 77,777: min/max per column keeps it visible.
    values = [1.0 - i / n for i in range(n)]
    values[77_777] = 50.0
    Metric.objects.bulk_create([Metric(run=run, key="loss", value=v, timestamp=1, step=i) for i, v in enumerate(values)],
                               batch_size=10_000)
    LatestMetric.objects.create(run=run, key="loss", value=values[-1], timestamp=1, step=n - 1)
    html = client_for(world.viewer).get(f"/projects/lab/runs/{run.run_id}/").content.decode()
    chart = figure(html, "loss")
    assert 'data-points="100000"' in chart
    points = polyline_points(chart)
    assert COLUMNS < len(points) <= 2 * COLUMNS
    per_column: dict[int, int] = {}
    for x, _y in points:
        per_column[int(x)] = per_column.get(int(x), 0) + 1
    assert max(per_column.values()) <= 3  # two per bucket; a bucket edge may share a pixel with the next
    top = min(y for _x, y in points)  # SVG y grows downwards: the spike is the smallest y
    assert top < 20


def test_a_point_at_an_earlier_step_reaches_the_open_page_and_a_quiet_poll_reads_no_history(world):
    """A late point (step 1 after step 9: the series' latest point stays the same) still changes the
    panel, so the open page gets it; a poll when nothing changed answers 204 without reading the
    metric points, which an open job page would otherwise count once a second."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    run = standalone_run(world.member, world.project, "late-points")
    log(run, world.member, "acc", [0.1])
    log(run, world.member, "acc", [0.2] * 8, first_step=2)  # steps 2-9; step 1 comes late
    client = client_for(world.viewer)
    version = re.search(r'data-version="(\w+)"', client.get(f"/projects/lab/runs/{run.run_id}/").content.decode())
    with CaptureQueriesContext(connection) as queries:
        assert client.get(f"/projects/lab/runs/{run.run_id}/panel", {"v": version.group(1)}).status_code == 204
    assert not [q["sql"] for q in queries.captured_queries if Metric._meta.db_table + '"' in q["sql"]]

    log(run, world.member, "acc", [0.9], first_step=1)
    fresh = client.get(f"/projects/lab/runs/{run.run_id}/panel", {"v": version.group(1)})
    assert fresh.status_code == 200 and 'data-points="10"' in fresh.content.decode()
