"""The GPU watch's side of the server (issue 22 item 2, docs/gpus.md "The GPU watch"): a worker saying the
capability `gpu_watch` gets, with each hello, the computers whose GPUs it reads; `worker/computers/{id}/gpus`
stores one reading per registered GPU, updated in place, only for a computer that worker serves; the GPU
board shows a free GPU's fresh reading (utilisation, memory, processes outside Mado with pid and user), and a
held GPU's where its Job says nothing; a stale reading is not shown. Against PostgreSQL with real HTTP
calls through the worker API and Django's test client for the board."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from computers.models import ComputeTarget, GpuReading
from jobs import services as job_services
from jobs.gpu_board import READING_FRESH_SECONDS
from mado import services
from mado.choices import Role, TokenKind
from mado.services import Actor
from tests.computer_fixtures import ScriptedWorker
from tests.conftest import WORKER_SCOPES, assert_error
from tests.gpu.test_gpu_board import board, row
from tests.job_fixtures import JobWorker, gpu_computer, job_request
from worker_agent import gpu_remote

pytestmark = pytest.mark.django_db

BUSY = "Busy outside the app"
WATCHING = ("checks", "reads", "key_candidates", "jobs", "cluster_jobs", "gpu_watch")


def watcher(token, target_ids=None, worker_id="lab-worker-1") -> JobWorker:
    worker = JobWorker(token, worker_id, capabilities=WATCHING, target_ids=target_ids)
    assert worker.hello().status_code == 200
    return worker


def reading(gpu_id="0", utilization=37.0, used=1536.0, total=81559.0, outside=()) -> dict:
    return {"id": gpu_id, "utilization": utilization, "memory_used_mib": used, "memory_total_mib": total,
            "outside": [{"pid": pid, "user": user} for pid, user in outside]}


def send(worker, computer, gpus):
    return worker.post(f"/api/worker/computers/{computer.pk}/gpus", {"gpus": gpus})


def test_the_hello_lists_the_computers_to_watch_and_only_to_a_worker_that_watches(world):
    box = gpu_computer(world.global_admin, gpus=("0", "1"))
    other = gpu_computer(world.global_admin, name="gpu-host-2", gpus=("GPU-aaaa",))
    gpu_computer(world.global_admin, name="retired", gpus=("0",))
    ComputeTarget.objects.filter(name="retired").update(enabled=False)
    gpu_computer(world.project_admin, name="alices-private", gpus=("0",), visibility="private")
    ComputeTarget.objects.create(owner=world.global_admin, name="cpu-only", kind="ssh", visibility="public",
                                 enabled=True, gpu_ids=[], concurrency=1)

    answer = JobWorker(world.worker_token).hello().json()
    assert "gpu_watch" not in answer, "a worker without the capability is not sent the list"

    listed = JobWorker(world.worker_token, capabilities=WATCHING).hello().json()["gpu_watch"]
    assert [(c["id"], c["gpu_ids"]) for c in listed] == [(box.pk, ["0", "1"]), (other.pk, ["GPU-aaaa"])], \
        "enabled computers it serves with registered GPUs: not disabled, not another's private, not GPU-less"
    assert listed[0]["host"] == box.host and listed[0]["python_path"] == box.python_path, "how to reach it"

    narrowed = JobWorker(world.worker_token, capabilities=WATCHING, target_ids=[other.pk]).hello().json()
    assert [c["id"] for c in narrowed["gpu_watch"]] == [other.pk], "its MMT_WORKER_TARGET_IDS narrow the list"


def test_readings_are_stored_one_row_per_gpu_and_the_board_shows_a_free_gpus_readings(client, world):
    box = gpu_computer(world.global_admin, gpus=("0", "1"))
    worker = watcher(world.worker_token)
    response = send(worker, box, [reading("0", 12, 2048), reading("1", 81, 40000, outside=[(4242, "alice")]),
                                  reading("7")])
    assert response.status_code == 200, response.content
    assert response.json() == {"stored": 2, "ignored": ["7"]}, "a GPU the computer does not register is left out"
    assert send(worker, box, [reading("0", 15, 2100), reading("1", 90, 41000, outside=[(4242, "alice"),
                                                                                       (4343, "root")])]
                ).status_code == 200
    rows = list(GpuReading.objects.order_by("gpu_id").values_list("gpu_id", "utilization", "memory_used", "outside"))
    assert rows == [("0", 15.0, 2100.0, []),
                    ("1", 90.0, 41000.0, [{"pid": 4242, "user": "alice"}, {"pid": 4343, "user": "root"}])], \
        "one row per GPU, updated in place"

    page = board(client, world.viewer)
    free = row(page, "gpu-host-1", "0")
    assert "Free" in free and "15 %" in free and "2100 / 81559 MiB" in free and BUSY not in free
    busy = row(page, "gpu-host-1", "1")
    assert "Free" in busy and BUSY in busy and "pid 4242, user alice" in busy and "pid 4343, user root" in busy
    assert "90 %" in busy and "(the Job waits for it)" not in busy, "no Job waits: it is just in use"
    assert 'class="gpu-free gpu-outside"' in page

    # A reading older than READING_FRESH_SECONDS is not news: the worker or its way to the computer is gone.
    GpuReading.objects.filter(gpu_id="1").update(seen_at=timezone.now() - timedelta(seconds=READING_FRESH_SECONDS + 1))
    stale = row(board(client, world.viewer), "gpu-host-1", "1")
    assert "Free" in stale and BUSY not in stale and "90 %" not in stale and "4242" not in stale

    client.defaults["HTTP_ACCEPT_LANGUAGE"] = "ja"
    japanese = client.get(reverse("computer-detail", args=[box.pk])).content.decode()
    assert "90 秒より古い読み取り結果は表示されません。" in japanese


def test_a_held_gpu_takes_the_reading_where_its_job_says_nothing(client, world):
    box = gpu_computer(world.global_admin, gpus=("0", "1"))
    worker = watcher(world.worker_token)
    python_job = job_services.create_job(Actor(world.member), world.project, job_request(box, gpu_ids=["0"]))
    item = worker.claim()
    assert item["id"] == python_job.pk and worker.heartbeat(item, "running").status_code == 200
    docker_job = job_services.create_job(Actor(world.member), world.project,
                                         job_request(box, gpu_ids=["1"], runtime="docker", image="python:3.12"))
    second = worker.claim(active=[python_job.pk])
    assert second["id"] == docker_job.pk and worker.heartbeat(second, "running").status_code == 200
    assert send(worker, box, [reading("0", 55, 3000, outside=[(777, "bob")]),
                              reading("1", 66, 4000, outside=[(1, "root")])]).status_code == 200

    page = board(client, world.viewer)
    held = row(page, "gpu-host-1", "0")
    assert f"#{python_job.pk}" in held and "55 %" in held and "3000 / 81559 MiB" in held, "the reading as fallback"
    assert BUSY in held and "pid 777, user bob" in held
    docker = row(page, "gpu-host-1", "1")
    assert "66 %" in docker and BUSY not in docker, \
        "a Docker Job's own processes run as root in its container: they are not taken for outside ones"

    assert worker.leased(item, "metrics", metrics=[{"name": "system/gpu/0/utilization", "value": 99, "step": 1}]
                         ).status_code == 200
    assert "99 %" in row(board(client, world.viewer), "gpu-host-1", "0"), "the Job's own metric comes first"


def other_projects_worker(world) -> ScriptedWorker:
    """A worker of another project, whose service account mallory created: it serves Public computers and
    mallory's Private ones."""
    account = services.create_service_account(Actor(world.outsider), world.other_project, name="mallory-bot",
                                              role=Role.ADMIN)
    token = world.token(account.user, WORKER_SCOPES, project=world.other_project, kind=TokenKind.SERVICE)
    return watcher(token, worker_id="mallory-worker")


def test_a_computer_the_worker_does_not_serve_is_a_404(world):
    private = gpu_computer(world.global_admin, name="roots-private", gpus=("0",), visibility="private")
    public = gpu_computer(world.global_admin, name="public-box", gpus=("0",))
    disabled = gpu_computer(world.global_admin, name="disabled-box", gpus=("0",))
    ComputeTarget.objects.filter(pk=disabled.pk).update(enabled=False)
    foreign = other_projects_worker(world)
    body = [reading("0")]
    assert_error(send(foreign, private, body), 404, "not_found")
    assert send(foreign, public, body).status_code == 200, "a Public computer is served by every project's worker"

    ours = watcher(world.worker_token, target_ids=[private.pk])
    assert send(ours, private, body).status_code == 200
    assert_error(send(ours, public, body), 404, "not_found"), "outside its MMT_WORKER_TARGET_IDS"
    everywhere = watcher(world.worker_token, worker_id="lab-worker-2")
    assert_error(send(everywhere, disabled, body), 404, "not_found")
    missing = ours.post("/api/worker/computers/999999/gpus", {"gpus": body})
    assert_error(missing, 404, "not_found")
    assert set(GpuReading.objects.values_list("target__name", flat=True)) == {"public-box", "roots-private"}


def test_only_a_worker_token_that_said_hello_may_send_readings(world, client):
    box = gpu_computer(world.global_admin, gpus=("0",))
    worker = watcher(world.worker_token)
    job = job_services.create_job(Actor(world.member), world.project, job_request(box, gpu_ids=["0"]))
    item = worker.claim()
    assert item["id"] == job.pk
    job_client = ScriptedWorker(item["job_token"])
    assert_error(send(job_client, box, [reading("0")]), 403, "job_token_forbidden")
    member = ScriptedWorker(world.member_token(world.member))
    assert send(member, box, [reading("0")]).status_code == 403, "a member's token lacks worker:execute"
    stranger = ScriptedWorker(world.worker_token, "never-said-hello")
    assert_error(send(stranger, box, [reading("0")]), 422, "hello_required")
    assert not GpuReading.objects.exists()


@pytest.mark.parametrize("gpus, where", [
    ("0", "gpus"),
    ([reading(str(i)) for i in range(65)], "gpus"),
    ([7], "gpus[0]"),
    ([{**reading(), "id": "0 1"}], "gpus[0].id"),
    ([reading("0"), reading("0")], "gpus[1].id"),
    ([reading(utilization=101)], "gpus[0].utilization"),
    ([reading(utilization=True)], "gpus[0].utilization"),
    ([reading(used=-1)], "gpus[0].memory_used_mib"),
    ([reading(total="80 GiB")], "gpus[0].memory_total_mib"),
    ([reading(outside=[(i + 1, "a") for i in range(33)])], "gpus[0].outside"),
    ([{**reading(), "outside": {"pid": 1}}], "gpus[0].outside"),
    ([reading(outside=[(0, "alice")])], "gpus[0].outside[0].pid"),
    ([reading(outside=[("12", "alice")])], "gpus[0].outside[0].pid"),
    ([reading(outside=[(12, "a" * 65)])], "gpus[0].outside[0].user"),
    ([reading(outside=[(12, "")])], "gpus[0].outside[0].user"),
    ([reading(outside=[(12, "al\x07ice")])], "gpus[0].outside[0].user"),
    ([reading(outside=[(12, "al\nice")])], "gpus[0].outside[0].user"),
    ([reading(outside=[(12, None)])], "gpus[0].outside[0].user"),
])
def test_bad_readings_are_refused_whole_with_a_422_naming_the_place(world, gpus, where):
    box = gpu_computer(world.global_admin, gpus=("0",) + tuple(str(i) for i in range(1, 65)))
    worker = watcher(world.worker_token)
    body = assert_error(send(worker, box, gpus), 422, "invalid_gpu_readings")
    assert where in body["fields"], body
    assert where == "gpus" or body["error"].startswith("Fix these GPU readings:"), body
    assert not GpuReading.objects.exists(), "nothing of a refused body is stored"


@pytest.mark.parametrize("user, code", [("x\ud800y", "invalid_characters"), ("nul\x00here", "parse_error")])
def test_a_nul_or_lone_surrogate_in_a_user_is_refused_before_the_view(world, user, code):
    """As every JSON body of the API (mado.parsers.StrictJSONParser): a 400 saying what to fix."""
    box = gpu_computer(world.global_admin, gpus=("0",))
    worker = watcher(world.worker_token)
    text = json.dumps({"worker_id": worker.worker_id, "gpus": [reading(outside=[(12, user)])]})
    response = worker.client.post(f"/api/worker/computers/{box.pk}/gpus", text, content_type="application/json")
    body = assert_error(response, 400, code)
    assert "surrogate" in body["error"] or "NUL" in body["error"]
    assert not GpuReading.objects.exists()


def test_the_workers_body_is_what_the_server_takes(world):
    """worker_agent.gpu_remote.watch_readings from a real probe line: only registered GPUs, Mado's processes
    left out, what nvidia-smi could not say as null, users made printable, at most 32 processes per GPU."""
    box = gpu_computer(world.global_admin, gpus=("0", "GPU-00000001-0000-0000-0000-000000000000"))
    apps = "\n".join(f"GPU-00000001-0000-0000-0000-000000000000, {1000 + i}, 10" for i in range(40))
    line = json.dumps({
        "gpus": "0, GPU-00000000-0000-0000-0000-000000000000, [N/A], 1536, 81559, 45, [N/A]\n"
                "1, GPU-00000001-0000-0000-0000-000000000000, 81, 40000, 81559, 50, 300\n"
                "2, GPU-00000002-0000-0000-0000-000000000000, 5, 1, 81559, 30, 60",
        "apps": apps + "\nGPU-00000000-0000-0000-0000-000000000000, 77, 10",
        "owners": {**{str(1000 + i): ["bad\tname" if i == 0 else "alice", None] for i in range(40)},
                   "77": ["bob", "42"]}})
    gpus = gpu_remote.watch_readings(gpu_remote.parse_line(line), box.gpu_ids)
    assert [g["id"] for g in gpus] == ["0", "GPU-00000001-0000-0000-0000-000000000000"]
    assert gpus[0]["utilization"] is None and gpus[0]["outside"] == [], "pid 77 is job 42's"
    assert len(gpus[1]["outside"]) == 32 and gpus[1]["outside"][0] == {"pid": 1000, "user": "badname"}
    worker = watcher(world.worker_token)
    assert send(worker, box, gpus).json() == {"stored": 2, "ignored": []}
