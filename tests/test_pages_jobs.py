"""The Jobs pages through Django's test client: the project's Jobs list, the New job form, a job's page
(live logs that stop polling with 286, SVG metric charts, artifacts, timeline) and the Request stop
dialog, with and without HTMX, for each role, in English and Japanese."""
from __future__ import annotations

import hashlib
import json
import re
from datetime import timedelta

import pytest
from django.core.files.base import ContentFile
from django.urls import reverse
from django.utils import timezone, translation

from jobs import charts
from jobs.forms import parse_walltime
from jobs.models import Artifact, Job, LogChunk, Metric
from jobs.views import LOG_PAGE
from mado.services import Actor
from tests.job_fixtures import JobWorker, gpu_computer

HTMX = {"HTTP_HX_REQUEST": "true"}

pytestmark = pytest.mark.django_db


def signed_in(client, user):
    client.force_login(user)
    return client


def html(response) -> str:
    return response.content.decode()


def make_job(world, target, user=None, **extra) -> Job:
    from jobs import services

    data = {"computer": target.pk, "runtime": "python", "command": ["python", "train.py"], **extra}
    return services.create_job(Actor(user or world.member), world.project, data)


def running_job(world, target, worker: JobWorker, user=None, **extra) -> tuple[Job, dict]:
    job = make_job(world, target, user, **extra)
    item = worker.claim()
    assert item["id"] == job.pk
    assert worker.heartbeat(item, "running").status_code == 200
    job.refresh_from_db()
    assert job.status == "running"
    return job, item


def send_logs(worker: JobWorker, item: dict, *texts: str, stream="stdout", start=0) -> None:
    offset = start
    chunks = []
    for text in texts:
        chunks.append({"stream": stream, "offset": offset, "data": text})
        offset += len(text.encode())
    response = worker.leased(item, "logs", chunks=chunks)
    assert response.status_code == 200, response.content


def row_of(page: str, job: Job) -> str:
    match = re.search(rf'<tr data-job="{job.pk}">(.*?)</tr>', page, re.DOTALL)
    assert match, page
    return match.group(1)


def field_errors(page: str, field: str) -> str:
    """The text of the errors shown under one field of the New job form."""
    start = page.find(f'data-field="{field}"')
    assert start >= 0, f"no field {field} in the page"
    ends = [i for i in (page.find('data-field="', start + 1), page.find("<footer", start)) if i >= 0]
    block = page[start:min(ends)]
    errors = re.findall(r'class="errors" role="alert">(.*?)</div>', block, re.DOTALL)
    return re.sub(r"<[^>]+>", " ", " ".join(errors))


def urls(job: Job) -> dict[str, str]:
    slug = job.project.slug
    return {
        "list": reverse("jobs", args=[slug]),
        "new": reverse("job-create", args=[slug]),
        "detail": reverse("job-detail", args=[slug, job.pk]),
        "poll": reverse("job-poll", args=[slug, job.pk]) + "?after=0",
        "log": reverse("job-log-text", args=[slug, job.pk]),
        "stop": reverse("job-stop", args=[slug, job.pk]),
    }


# Who sees what ----------------------------------------------------------------------------------

class TestPermissions:
    def test_a_viewer_sees_the_jobs_list_and_a_jobs_page_but_no_create_button(self, client, world, gpu_box):
        job = make_job(world, gpu_box, name="resnet-baseline", gpu_ids=["0", "1"])
        signed_in(client, world.viewer)
        page = html(client.get(urls(job)["list"]))
        row = row_of(page, job)
        assert "resnet-baseline" in row and "bob" in row and "gpu-host-1" in row and "0, 1" in row
        assert "Queued" in row
        assert "Create job" not in page
        detail = client.get(urls(job)["detail"])
        assert detail.status_code == 200
        assert "resnet-baseline" in html(detail) and "python train.py" in html(detail)

    def test_someone_outside_the_project_gets_404_on_every_jobs_page(self, client, world, gpu_box):
        job = make_job(world, gpu_box)
        signed_in(client, world.outsider)
        for name, url in urls(job).items():
            assert client.get(url).status_code == 404, name
        assert client.post(urls(job)["stop"]).status_code == 404
        assert Job.objects.get(pk=job.pk).stop_requested_at is None

    def test_signed_out_visitors_are_sent_to_the_login_page(self, client, world, gpu_box):
        job = make_job(world, gpu_box)
        response = client.get(urls(job)["list"])
        assert response.status_code == 302 and response["Location"].startswith(reverse("login"))

    def test_a_job_is_not_found_under_another_projects_address(self, client, world, gpu_box):
        job = make_job(world, gpu_box)
        signed_in(client, world.global_admin)
        assert client.get(reverse("job-detail", args=["other", job.pk])).status_code == 404

    def test_a_viewer_cannot_stop_a_job_and_sees_why_in_the_actions_column(self, client, world, gpu_box):
        job = make_job(world, gpu_box)
        signed_in(client, world.viewer)
        row = row_of(html(client.get(urls(job)["list"])), job)
        assert "Request stop" not in row
        assert "Only the creator and Project admins can stop this Job" in row
        assert client.get(urls(job)["stop"], **HTMX).status_code == 403
        assert client.post(urls(job)["stop"], **HTMX).status_code == 403
        job.refresh_from_db()
        assert job.status == "queued" and job.stop_requested_at is None

    def test_a_member_can_stop_their_own_job_but_not_someone_elses(self, client, world, gpu_box):
        own = make_job(world, gpu_box, name="mine")
        others = make_job(world, gpu_box, user=world.project_admin, name="alices")
        signed_in(client, world.member)
        page = html(client.get(urls(own)["list"]))
        assert "Request stop" in row_of(page, own)
        assert "Request stop" not in row_of(page, others)
        assert "Only the creator and Project admins can stop this Job" in row_of(page, others)
        assert client.get(urls(others)["stop"]).status_code == 403

    def test_a_project_admin_can_stop_anyones_job(self, client, world, gpu_box):
        job = make_job(world, gpu_box)
        signed_in(client, world.project_admin)
        assert "Request stop" in row_of(html(client.get(urls(job)["list"])), job)
        assert client.get(urls(job)["stop"], **HTMX).status_code == 200

    def test_a_viewer_cannot_open_the_new_job_form(self, client, world, gpu_box):
        signed_in(client, world.viewer)
        assert client.get(reverse("job-create", args=["lab"])).status_code == 403
        assert client.post(reverse("job-create", args=["lab"]), {"computer": gpu_box.pk}).status_code == 403
        assert not Job.objects.exists()

    def test_a_member_cannot_create_a_job_on_someone_elses_private_computer(self, client, world, gpu_box):
        private = gpu_computer(world.global_admin, "root-box", visibility="private")
        signed_in(client, world.member)
        form = html(client.get(reverse("job-create", args=["lab"])))
        assert "gpu-host-1" in form and "root-box" not in form
        response = client.post(reverse("job-create", args=["lab"]), {
            "computer": private.pk, "runtime": "python", "command": "python train.py", "parameters": "{}"})
        assert response.status_code == 200
        assert "not available to you" in field_errors(html(response), "computer")
        assert not Job.objects.exists()


@pytest.mark.parametrize("parameters,text", [
    ('{"lr": 1e999}', "beyond the range"),
    ('{"lr": "\\ud800"}', "lone surrogate"),
    ("[" * 5000 + "]" * 5000, "more than 64 levels"),
])
def test_parameters_the_database_cannot_hold_are_a_form_error_not_a_500(client, world, gpu_box, parameters, text):
    signed_in(client, world.member)
    response = client.post(reverse("job-create", args=["lab"]), {
        "computer": gpu_box.pk, "runtime": "python", "command": "python train.py", "parameters": parameters})
    assert response.status_code == 200
    assert text in field_errors(html(response), "parameters")
    assert not Job.objects.exists()


# The New job form -------------------------------------------------------------------------------

class TestNewJobForm:
    def test_the_form_offers_only_enabled_computers_the_user_may_use(self, client, world, gpu_box):
        gpu_computer(world.member, "bobs-box", visibility="private", gpus=("0",))
        gpu_computer(world.project_admin, "alices-box", visibility="private")
        disabled = gpu_computer(world.global_admin, "old-box")
        disabled.enabled = False
        disabled.save()
        signed_in(client, world.member)
        page = html(client.get(reverse("job-create", args=["lab"])))
        options = re.findall(r'<option value="(\d*)"[^>]*>([^<]+)</option>', page)
        assert [name for _, name in options] == ["—", "bobs-box", "gpu-host-1"]
        assert "alices-box" not in page and "old-box" not in page
        assert "Choose a computer to see its runtimes and GPUs." in page

    def test_choosing_a_computer_reloads_its_runtimes_and_gpu_checkboxes_with_htmx(self, client, world, gpu_box):
        other = gpu_computer(world.global_admin, "gpu-host-2", gpus=("4", "5"), runtimes=("python", "apptainer"))
        signed_in(client, world.member)
        page = html(client.get(reverse("job-create", args=["lab"])))
        assert 'hx-get="/projects/lab/jobs/new"' in page and 'hx-target="#computer-fields"' in page
        response = client.get(reverse("job-create", args=["lab"]),
                              {"fragment": "computer", "computer": other.pk, "command": "python x.py"}, **HTMX)
        fragment = html(response)
        assert fragment.lstrip().startswith("<div id=\"computer-fields\">") and "<html" not in fragment
        assert re.findall(r'name="gpu_ids" value="([^"]+)"', fragment) == ["4", "5"]
        assert re.findall(r'<option value="([a-z]+)"', fragment) == ["python", "apptainer"]
        assert 'name="image"' in fragment  # apptainer is a container runtime
        first = html(client.get(reverse("job-create", args=["lab"]), {"fragment": "computer",
                                                                        "computer": gpu_box.pk}, **HTMX))
        assert re.findall(r'name="gpu_ids" value="([^"]+)"', first) == ["0", "1", "2", "3"]

    def test_without_javascript_the_form_reloads_as_a_page_with_the_chosen_computer(self, client, world, gpu_box):
        signed_in(client, world.member)
        page = html(client.get(reverse("job-create", args=["lab"]), {"computer": gpu_box.pk, "command": "python a.py"}))
        assert "<noscript>" in page and 'formmethod="get"' in page
        assert f'<option value="{gpu_box.pk}" selected>' in page
        assert 'value="python a.py"' in page
        assert re.findall(r'name="gpu_ids" value="([^"]+)"', page) == ["0", "1", "2", "3"]

    def test_a_valid_form_creates_the_job_and_opens_its_page(self, client, world, gpu_box):
        signed_in(client, world.member)
        response = client.post(reverse("job-create", args=["lab"]), {
            "name": "lr-sweep-1", "computer": gpu_box.pk, "runtime": "python",
            "command": "python train.py --note 'two words' --lr 0.01", "requirements": "numpy==2.0.1\n",
            "parameters": '{"lr": 0.01, "layers": [64, 64]}', "gpu_ids": ["1", "3"], "walltime": "2h30m"})
        job = Job.objects.get()
        assert response.status_code == 302 and response["Location"] == reverse("job-detail", args=["lab", job.pk])
        assert job.name == "lr-sweep-1" and job.created_by == world.member and job.target == gpu_box
        assert job.command == ["python", "train.py", "--note", "two words", "--lr", "0.01"]
        assert job.gpu_ids == ["1", "3"] and job.parameters == {"lr": 0.01, "layers": [64, 64]}
        assert job.walltime_seconds == 9000 and job.requirements == "numpy==2.0.1" and job.status == "queued"

    def test_a_container_job_keeps_its_image(self, client, world, gpu_box):
        signed_in(client, world.member)
        client.post(reverse("job-create", args=["lab"]), {
            "computer": gpu_box.pk, "runtime": "docker", "image": "pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime",
            "command": "python train.py", "parameters": ""})
        job = Job.objects.get()
        assert job.runtime == "docker" and job.image.startswith("pytorch/pytorch") and job.parameters == {}

    def test_typing_mistakes_are_shown_under_their_fields(self, client, world, gpu_box):
        signed_in(client, world.member)
        response = client.post(reverse("job-create", args=["lab"]), {
            "computer": gpu_box.pk, "runtime": "python", "command": "python train.py --note 'open",
            "parameters": '{"lr": 0.01,}', "walltime": "soon"})
        page = html(response)
        assert response.status_code == 200
        assert "Close the quotes" in field_errors(page, "command")
        assert "not valid JSON" in field_errors(page, "parameters")
        assert "90m" in field_errors(page, "walltime")
        assert 'value="python train.py --note &#x27;open"' in page  # what was typed stays
        assert not Job.objects.exists()

    def test_parameters_must_be_a_json_object(self, client, world, gpu_box):
        signed_in(client, world.member)
        page = html(client.post(reverse("job-create", args=["lab"]), {
            "computer": gpu_box.pk, "runtime": "python", "command": "python train.py", "parameters": "[1, 2]"}))
        assert "JSON object" in field_errors(page, "parameters")

    def test_refusals_of_the_service_are_shown_under_the_fields_they_concern(self, client, world, gpu_box):
        signed_in(client, world.member)
        page = html(client.post(reverse("job-create", args=["lab"]), {
            "computer": gpu_box.pk, "runtime": "singularity", "command": "python train.py", "gpu_ids": ["7"]}))
        assert "gpu-host-1 supports python, docker" in field_errors(page, "runtime")
        assert "has no GPU 7" in field_errors(page, "gpu_ids")
        assert not Job.objects.exists()

    def test_a_container_runtime_without_an_image_is_refused_under_the_image_field(self, client, world, gpu_box):
        signed_in(client, world.member)
        page = html(client.post(reverse("job-create", args=["lab"]), {
            "computer": gpu_box.pk, "runtime": "docker", "command": "python train.py"}))
        assert "needs an image" in field_errors(page, "image")

    def test_a_disabled_computer_is_refused_with_its_name(self, client, world, gpu_box):
        gpu_box.enabled = False
        gpu_box.save()
        signed_in(client, world.member)
        page = html(client.post(reverse("job-create", args=["lab"]), {
            "computer": gpu_box.pk, "runtime": "python", "command": "python train.py"}))
        assert "gpu-host-1 is disabled" in field_errors(page, "computer")
        assert "No enabled computer is available to you" in page

    def test_a_missing_command_and_computer_are_required(self, client, world, gpu_box):
        signed_in(client, world.member)
        page = html(client.post(reverse("job-create", args=["lab"]), {"computer": "", "command": ""}))
        assert "required" in field_errors(page, "command") and "required" in field_errors(page, "computer")

    def test_walltimes_are_read_in_the_usual_forms(self):
        assert parse_walltime("5400") == 5400
        assert parse_walltime("90m") == 5400
        assert parse_walltime("2h30m") == 9000
        assert parse_walltime("1d 12h") == 129600
        assert parse_walltime("01:30:00") == 5400
        assert parse_walltime("01:30") == 5400
        assert parse_walltime("1:75") is None
        assert parse_walltime("soon") is None
        assert parse_walltime("2 hours") is None


# The Jobs list ----------------------------------------------------------------------------------

class TestJobsList:
    def test_a_job_without_heartbeat_for_60_seconds_shows_not_responding(self, client, world, gpu_box, job_worker):
        job, _ = running_job(world, gpu_box, job_worker, gpu_ids=["0"])
        signed_in(client, world.member)
        assert "No response" not in row_of(html(client.get(urls(job)["list"])), job)
        Job.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=61))
        row = row_of(html(client.get(urls(job)["list"])), job)
        assert "No response" in row and "Running" in row  # shown, never acted on
        assert "No response" in html(client.get(urls(job)["detail"]))
        job.refresh_from_db()
        assert job.status == "running" and list(job.gpu_reservations.values_list("gpu_id", flat=True)) == ["0"]

    def test_the_list_polls_every_2_seconds_only_while_a_job_is_active(self, client, world, gpu_box):
        job = make_job(world, gpu_box)
        signed_in(client, world.member)
        page = html(client.get(urls(job)["list"]))
        assert 'hx-trigger="every 2s, jobsChanged from:body"' in page
        fragment = html(client.get(urls(job)["list"] + "?fragment=list", **HTMX))
        assert fragment.lstrip().startswith('<div id="job-list"') and "<html" not in fragment
        Job.objects.filter(pk=job.pk).update(status="finished")
        fragment = html(client.get(urls(job)["list"] + "?fragment=list", **HTMX))
        assert 'hx-trigger="jobsChanged from:body"' in fragment and "every 2s" not in fragment

    def test_the_list_shows_creator_computer_gpus_age_and_an_ended_jobs_reason(self, client, world, gpu_box):
        job = make_job(world, gpu_box, gpu_ids=["2"])
        Job.objects.filter(pk=job.pk).update(created_at=timezone.now() - timedelta(minutes=5), status="canceled")
        cpu = make_job(world, gpu_box, user=world.project_admin)
        signed_in(client, world.member)
        page = html(client.get(urls(job)["list"]))
        for header in ("Status", "Creator", "Computer", "GPUs", "Age", "Actions"):
            assert f"<th>{header}</th>" in page
        row = row_of(page, job)
        assert "Canceled" in row and "5\xa0minutes ago" in row and ">2<" in row
        assert "Already ended" in row
        assert "CPU only" in row_of(page, cpu) and "alice" in row_of(page, cpu)

    def test_a_project_without_jobs_says_so_and_offers_create_job_to_members(self, client, world):
        signed_in(client, world.member)
        page = html(client.get(reverse("jobs", args=["lab"])))
        assert "No Jobs yet." in page and 'href="/projects/lab/jobs/new"' in page


# Request stop -----------------------------------------------------------------------------------

class TestRequestStop:
    def test_the_dialog_names_the_run_creator_and_computer_and_what_will_happen(self, client, world, gpu_box,
                                                                                 job_worker):
        job, _ = running_job(world, gpu_box, job_worker, name="resnet-50")
        signed_in(client, world.member)
        dialog = html(client.get(urls(job)["stop"] + "?from=list", **HTMX))
        assert '<h2 id="dialog-title">Request stop</h2>' in dialog and "<html" not in dialog
        assert "resnet-50" in dialog and "bob" in dialog and "gpu-host-1" in dialog
        assert ("The worker sends SIGTERM to the running process, stops it with SIGKILL if it does not end within "
                "10 seconds, and then ends the Job as Canceled.") in dialog
        assert re.search(r'<button type="submit" class="danger">Stop</button>', dialog)

    def test_stopping_a_running_job_asks_the_worker_and_closes_the_dialog(self, client, world, gpu_box, job_worker):
        job, item = running_job(world, gpu_box, job_worker)
        signed_in(client, world.member)
        response = client.post(urls(job)["stop"], {"from": "list"}, **HTMX)
        assert response.status_code == 204
        assert json.loads(response["HX-Trigger"]) == {"jobsChanged": True, "closeDialog": True}
        job.refresh_from_db()
        assert job.status == "running" and job.stop_requested_by == world.member  # the worker ends it
        assert job_worker.heartbeat(item).json()["cancel_requested"] is True
        row = row_of(html(client.get(urls(job)["list"])), job)
        assert "Stop requested" in row and "Request stop" not in row

    def test_a_queued_job_is_canceled_at_once_also_without_javascript(self, client, world, gpu_box):
        job = make_job(world, gpu_box)
        signed_in(client, world.member)
        page = html(client.get(urls(job)["stop"]))
        assert "<html" in page and "hx-disable" in page  # the dialog as a whole page
        assert "This Job has not started yet: it is canceled at once and never runs." in page
        response = client.post(urls(job)["stop"], {"from": "list"})
        assert response.status_code == 302 and response["Location"] == urls(job)["list"]
        job.refresh_from_db()
        assert job.status == "canceled" and job.end_reason == "canceled"
        detail = client.post(urls(make_job(world, gpu_box))["stop"])
        assert detail["Location"].startswith("/projects/lab/jobs/") and detail["Location"].endswith("/")

    def test_an_ended_job_offers_no_stop_button_in_the_dialog(self, client, world, gpu_box):
        job = make_job(world, gpu_box)
        Job.objects.filter(pk=job.pk).update(status="finished")
        signed_in(client, world.member)
        dialog = html(client.get(urls(job)["stop"], **HTMX))
        assert "Already ended" in dialog and 'class="danger">Stop<' not in dialog
        response = client.post(urls(job)["stop"], **HTMX)
        assert response.status_code == 200 and "already ended" in html(response)


# The job page: logs, charts, artifacts ----------------------------------------------------------

class TestJobPage:
    def test_the_page_shows_the_logs_so_far_and_polls_every_second_from_the_last_chunk(self, client, world, gpu_box,
                                                                                        job_worker):
        job, item = running_job(world, gpu_box, job_worker, parameters={"lr": 0.01})
        send_logs(job_worker, item, "epoch 1\n", "epoch 2\n")
        send_logs(job_worker, item, "warning: <slow>\n", stream="stderr")
        signed_in(client, world.viewer)
        page = html(client.get(urls(job)["detail"]))
        last = LogChunk.objects.filter(job=job).order_by("-id").first().pk
        assert "epoch 1\n</span>" in page and '<span class="stderr"' in page and "&lt;slow&gt;" in page
        assert f'?after={last}&amp;v=' in page and 'hx-trigger="every 1s"' in page
        assert "worker-host" not in page and "lab-worker-1" in page  # the worker's id
        assert "&quot;lr&quot;: 0.01" in page
        assert "Started" in page and "Claimed" in page  # timeline

    def test_a_poll_sends_only_the_chunks_after_the_last_one_and_the_next_poller(self, client, world, gpu_box,
                                                                                   job_worker):
        job, item = running_job(world, gpu_box, job_worker)
        send_logs(job_worker, item, "one\n")
        first = LogChunk.objects.get(job=job).pk
        send_logs(job_worker, item, "two\n", start=4)
        signed_in(client, world.member)
        response = client.get(reverse("job-poll", args=["lab", job.pk]) + f"?after={first}", **HTMX)
        body = html(response)
        assert response.status_code == 200
        assert "two\n" in body and "one\n" not in body
        assert 'hx-swap-oob="beforeend:#log-output"' in body
        assert f"?after={first + 1}&amp;v=" in body and 'hx-trigger="every 1s"' in body
        assert 'id="job-head" class="page-header job-head" hx-swap-oob="true"' in body  # no version given

    def test_panels_are_sent_again_only_when_something_in_them_changed(self, client, world, gpu_box, job_worker):
        job, item = running_job(world, gpu_box, job_worker)
        signed_in(client, world.member)
        first = html(client.get(reverse("job-poll", args=["lab", job.pk]) + "?after=0", **HTMX))
        version = re.search(r"v=([0-9a-f]{16})", first).group(1)
        again = html(client.get(reverse("job-poll", args=["lab", job.pk]) + f"?after=0&v={version}", **HTMX))
        assert "hx-swap-oob" not in again
        job_worker.leased(item, "metrics", metrics=[{"name": "loss", "value": 0.5, "step": 1}])
        changed = html(client.get(reverse("job-poll", args=["lab", job.pk]) + f"?after=0&v={version}", **HTMX))
        # The Job's Run panel (tracking) brings the new point; jobs' own Metrics panel is not sent as well.
        assert re.search(r'id="run-panel"[^>]*hx-swap-oob="true"', changed)
        assert re.search(r'data-metric="loss"[^>]*>.*?<polyline', changed, re.DOTALL)
        assert 'id="job-metrics"' not in changed

    def test_polling_ends_with_286_once_the_job_ended_and_every_chunk_was_shown(self, client, world, gpu_box,
                                                                               job_worker):
        job, item = running_job(world, gpu_box, job_worker)
        send_logs(job_worker, item, "done\n")
        assert job_worker.complete(item).status_code == 200
        signed_in(client, world.member)
        poll = reverse("job-poll", args=["lab", job.pk])
        response = client.get(poll + "?after=0", **HTMX)
        assert response.status_code == 286
        body = html(response)
        assert "done\n" in body and "Finished" in body
        assert 'data-polling="false"' in body and "hx-trigger" not in body.split('id="log-poller"')[1].split(">")[0]
        last = LogChunk.objects.get(job=job).pk
        assert client.get(poll + f"?after={last}", **HTMX).status_code == 286
        page = html(client.get(urls(job)["detail"]))
        assert 'data-polling="false"' in page and 'hx-trigger="every 1s"' not in page

    def test_a_long_log_of_an_ended_job_is_sent_in_pages_before_polling_stops(self, client, world, gpu_box,
                                                                             job_worker):
        job, item = running_job(world, gpu_box, job_worker)
        LogChunk.objects.bulk_create(
            [LogChunk(job=job, stream="stdout", offset=i * 8, data=f"line{i:03d}\n") for i in range(LOG_PAGE + 10)])
        job_worker.complete(item)
        signed_in(client, world.member)
        poll = reverse("job-poll", args=["lab", job.pk])
        first = client.get(poll + "?after=0", **HTMX)
        assert first.status_code == 200 and html(first).count("<span class=\"stdout\"") == LOG_PAGE
        after = re.search(r"after=(\d+)", html(first)).group(1)
        second = client.get(poll + f"?after={after}", **HTMX)
        assert second.status_code == 286 and html(second).count("<span class=\"stdout\"") == 10

    def test_the_whole_log_is_a_text_download(self, client, world, gpu_box, job_worker):
        job, item = running_job(world, gpu_box, job_worker)
        send_logs(job_worker, item, "a\n", "b\n")
        send_logs(job_worker, item, "err\n", stream="stderr")
        signed_in(client, world.viewer)
        response = client.get(urls(job)["log"])
        assert response["Content-Type"].startswith("text/plain")
        assert b"".join(response.streaming_content) == b"a\nb\nerr\n"

    def test_metrics_are_drawn_once_as_one_svg_line_chart_per_name(self, client, world, gpu_box):
        from jobs import services

        job = make_job(world, gpu_box)
        services.add_metrics(job, [{"name": "loss", "value": 1 / (s + 1), "step": s} for s in range(20)]
                             + [{"name": "accuracy", "value": 0.5, "step": 0}])
        signed_in(client, world.viewer)
        page = html(client.get(urls(job)["detail"]))
        # One chart per series, in the Job's Run panel; jobs' own Metrics panel would draw them twice.
        assert page.count('<svg class="chart"') == 2 and 'id="job-metrics"' not in page
        loss = re.search(r'data-metric="loss"[^>]*>(.*?)</figure>', page, re.DOTALL).group(1)
        points = re.search(r'<polyline[^>]*points="([^"]+)"', loss).group(1).split()
        assert len(points) == 20
        xs = [float(p.split(",")[0]) for p in points]
        ys = [float(p.split(",")[1]) for p in points]
        assert xs == sorted(xs) and ys == sorted(ys)  # steps left to right; loss falls, so y grows downwards
        assert "last 0.05 at step 19" in loss
        assert '<polyline' in re.search(r'data-metric="accuracy"[^>]*>(.*?)</figure>', page, re.DOTALL).group(1)

    def test_a_job_without_a_run_keeps_its_own_metrics_panel_and_its_polling(self, client, world, gpu_box,
                                                                            job_worker):
        """A Job from before Runs existed has no Run panel: jobs' Metrics panel draws its series and the
        poll sends it again when a point arrives."""
        job, item = running_job(world, gpu_box, job_worker)
        job.run.delete()
        Metric.objects.bulk_create([Metric(job=job, name="loss", value=1 / (s + 1), step=s) for s in range(5)])
        signed_in(client, world.member)
        page = html(client.get(urls(job)["detail"]))
        assert 'id="job-metrics"' in page and 'id="run-panel"' not in page
        assert re.search(r'id="job-metrics".*?data-metric="loss">.*?<polyline', page, re.DOTALL)
        version = re.search(r"v=([0-9a-f]{16})", page).group(1)
        job_worker.leased(item, "metrics", metrics=[{"name": "loss", "value": 0.1, "step": 5}])
        changed = html(client.get(reverse("job-poll", args=["lab", job.pk]) + f"?after=0&v={version}", **HTMX))
        assert 'id="job-metrics" class="panel" hx-swap-oob="true"' in changed and "6 points" in changed

    def test_a_job_with_100000_points_shows_them_downsampled_in_its_run_panel(self, client, world, gpu_box):
        from tracking.charts import COLUMNS
        from tracking.models import LatestMetric
        from tracking.models import Metric as RunMetric

        job = make_job(world, gpu_box)
        n = 100_000
        RunMetric.objects.bulk_create([RunMetric(run=job.run, key="loss", value=1 - s / n, timestamp=1, step=s)
                                       for s in range(n)], batch_size=10_000)
        LatestMetric.objects.create(run=job.run, key="loss", value=1 / n, timestamp=1, step=n - 1)
        signed_in(client, world.viewer)
        page = html(client.get(urls(job)["detail"]))
        chart = re.search(r'<figure[^>]*data-metric="loss"[^>]*>.*?</figure>', page, re.DOTALL).group(0)
        assert 'data-points="100000"' in chart and f"last 1e-05 at step {n - 1}" in chart
        points = re.search(r'<polyline[^>]*points="([^"]+)"', chart).group(1).split()
        assert COLUMNS < len(points) <= 2 * COLUMNS  # min and max per pixel column, every point considered
        assert page.count('data-metric="loss"') == 1

    def test_a_chart_escapes_the_metric_name_and_thins_long_series_keeping_spikes(self):
        svg = charts.line_chart('<script>alert(1)</script>', [(0, 1.0), (1, 2.0)])
        assert "<script>" not in svg and "&lt;script&gt;" in svg
        points = [(s, 0.0) for s in range(10_000)]
        points[5_000] = (5_000, 99.0)
        thinned = charts.thin(points)
        assert len(thinned) <= charts.MAX_POINTS and (5_000, 99.0) in thinned
        assert [s for s, _ in thinned] == sorted(s for s, _ in thinned)

    def test_artifacts_show_size_and_sha256_and_download_for_viewers(self, client, world, gpu_box, settings,
                                                                     tmp_path):
        settings.MEDIA_ROOT = tmp_path
        job = make_job(world, gpu_box)
        data = b"weights" * 100
        artifact = Artifact(job=job, path="models/model.pt", size=len(data), sha256=hashlib.sha256(data).hexdigest(),
                            received_bytes=len(data), complete=True, mime_type="text/html")
        artifact.file.save("model.pt", ContentFile(data), save=False)
        artifact.save()
        partial = Artifact.objects.create(job=job, path="big.bin", size=10**9, sha256="0" * 64,
                                          received_bytes=10**6, complete=False)
        signed_in(client, world.viewer)
        page = html(client.get(urls(job)["detail"]))
        assert "models/model.pt" in page and "700\xa0bytes" in page and artifact.sha256 in page
        link = reverse("job-artifact", args=["lab", job.pk, artifact.pk])
        assert f'href="{link}"' in page and "Uploading…" in page
        response = client.get(link)
        assert response.status_code == 200 and b"".join(response.streaming_content) == data
        assert response["Content-Type"] == "application/octet-stream"
        assert 'attachment; filename="model.pt"' in response["Content-Disposition"]
        assert client.get(reverse("job-artifact", args=["lab", job.pk, partial.pk])).status_code == 404
        signed_in(client, world.outsider)
        assert client.get(link).status_code == 404


# Japanese ---------------------------------------------------------------------------------------

class TestJapanese:
    def test_the_jobs_pages_follow_the_browsers_language(self, client, world, gpu_box):
        job = make_job(world, gpu_box)
        signed_in(client, world.member)
        page = html(client.get(urls(job)["list"], HTTP_ACCEPT_LANGUAGE="ja"))
        assert '<html lang="ja">' in page
        assert "<th>操作</th>" in page  # Actions, from the catalogue
        with translation.override("ja"):
            expected = [translation.pgettext("jobs page", "Jobs")]
            expected += [translation.gettext(text) for text in ("Creator", "Request stop", "Create job")]
        for text in expected:
            assert text in page
        dialog = html(client.get(urls(job)["stop"], HTTP_ACCEPT_LANGUAGE="ja", **HTMX))
        assert "キャンセル" in dialog  # Cancel, from the catalogue
        with translation.override("ja"):
            assert translation.gettext("Stop") in dialog and translation.gettext("Run name") in dialog
        form = html(client.get(urls(job)["new"], HTTP_ACCEPT_LANGUAGE="ja"))
        assert "GPU ID" in form
