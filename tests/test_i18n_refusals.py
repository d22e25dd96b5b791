"""Refusals, waiting reasons and connection-check details in the reader's language (issue 14), and
cluster Jobs that could never start refused at creation with why (issue 15 item 7).

The browser (or API client) asks for Japanese with Accept-Language, as tests/test_i18n.py does. The
check details come from the real probe run on this machine (worker_agent.probe.run_check on a Local
computer, and an SSH connection to a closed port), sent to the server through the worker API as a
worker would, and read on the computer's page."""
from __future__ import annotations

import os
import re
import socket

import paramiko
import pytest
from django.utils import translation
from rest_framework.test import APIClient

from computers import check_details
from computers import services as computer_services
from computers.models import ComputeTarget
from jobs.models import Job
from mado.services import Actor
from tests.computer_fixtures import ScriptedWorker
from tests.conftest import assert_error
from tests.job_fixtures import gpu_computer
from worker_agent.probe import run_check
from worker_agent.ssh import ConnectionPool
from workers.models import Worker

pytestmark = pytest.mark.django_db

JA = {"HTTP_ACCEPT_LANGUAGE": "ja"}
EN = {"HTTP_ACCEPT_LANGUAGE": "en"}
NEVER_FITS_EN = ("Needs 3 replicas × 2 GPUs; gpu-host-1 can hold at most 2 (by GPUs and concurrent jobs), so it "
                 "cannot start. Ask for fewer replicas or GPUs, or choose another computer.")
NEVER_FITS_JA = ("レプリカ 3 個 × GPU 2 個が必要です。gpu-host-1 には（GPUと同時実行数から）最大 2 個までしか入らないため、"
                 "開始できません。レプリカかGPUの数を減らすか、別のコンピュータを選んでください。")


def signed_in(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def create_job(client, language: dict, **fields):
    body = {"runtime": "python", "command": ["python", "train.py"], **fields}
    return client.post("/api/projects/lab/jobs", body, format="json", **language)


# Refusals of jobs -----------------------------------------------------------------------------------

def test_a_cluster_job_that_could_never_start_is_refused_in_the_callers_language(world):
    box = gpu_computer(world.global_admin)
    client = signed_in(world.member)
    body = assert_error(create_job(client, JA, computer=box.pk, cluster_size=3, gpus_per_replica=2), 422,
                        "invalid_job")
    assert body["fields"]["cluster_size"] == [NEVER_FITS_JA] and body["error"] == NEVER_FITS_JA
    body = assert_error(create_job(client, EN, computer=box.pk, cluster_size=3, gpus_per_replica=2), 422,
                        "invalid_job")
    assert body["fields"]["cluster_size"] == [NEVER_FITS_EN]
    assert not Job.objects.exists()


def test_the_new_job_form_shows_the_refusal_in_japanese(world, client):
    box = gpu_computer(world.global_admin)
    client.force_login(world.member)
    response = client.post("/projects/lab/jobs/new", {
        "computer": box.pk, "runtime": "python", "command": "python train.py", "parameters": "{}",
        "cluster_mode": "single-node", "cluster_size": "3", "gpus_per_replica": "2"}, **JA)
    page = response.content.decode()
    assert response.status_code == 200 and not Job.objects.exists()
    field = re.search(r'<div class="field invalid" data-field="cluster_size">(.*?)</div>\s*</div>', page, re.DOTALL)
    assert field and NEVER_FITS_JA in field.group(1), page


def test_other_refusals_of_jobs_speak_japanese_and_keep_their_codes(world):
    box = gpu_computer(world.global_admin, "old-box")
    ComputeTarget.objects.filter(pk=box.pk).update(enabled=False)
    client = signed_in(world.member)
    body = assert_error(create_job(client, JA, computer=box.pk), 422, "computer_disabled")
    assert body["error"] == "コンピュータ old-box は無効です。別のコンピュータを選ぶか、所有者に有効にするよう依頼してください。"
    assert body["fields"] == {"computer": ["無効です。"]}

    ComputeTarget.objects.filter(pk=box.pk).update(enabled=True)
    body = assert_error(create_job(client, JA, computer=box.pk, env={"MMT_X": "1"}, runtime="docker"), 422,
                        "invalid_job")
    assert body["fields"]["env"] == ["MMT_X はMadoが設定します。別の名前にしてください。"]
    assert body["fields"]["image"] == ["docker のJobにはイメージが必要です。"]

    job = create_job(client, EN, computer=box.pk).json()
    assert client.post(f"/api/jobs/{job['id']}/stop", **JA).status_code == 200
    body = assert_error(client.post(f"/api/jobs/{job['id']}/stop", **JA), 409, "job_ended")
    assert body["error"] == "このJobはすでに終了しています（canceled）。"
    body = assert_error(client.post(f"/api/jobs/{job['id']}/stop", **EN), 409, "job_ended")
    assert body["error"] == "This job already ended (canceled)."


# Why a cluster Job waits ----------------------------------------------------------------------------

def test_a_cluster_jobs_waiting_reason_speaks_japanese(world, client):
    box = gpu_computer(world.global_admin, gpus=("0", "1", "2", "3", "4", "5"))
    job = create_job(signed_in(world.member), EN, computer=box.pk, cluster_size=3, gpus_per_replica=2).json()
    ComputeTarget.objects.filter(pk=box.pk).update(gpu_ids=["0", "1", "2", "3"])  # its owner took two GPUs out

    expected = ("レプリカ 3 個 × GPU 2 個が必要です。gpu-host-1 には（GPUと同時実行数から）最大 2 個までしか入らないため、"
                "開始できません。停止して、レプリカかGPUの数を減らして作り直してください。")
    assert signed_in(world.member).get(f"/api/jobs/{job['id']}", **JA).json()["queued_reason"] == expected
    client.force_login(world.member)
    page = client.get(f"/projects/lab/jobs/{job['id']}/", **JA).content.decode()
    assert expected in page
    english = client.get(f"/projects/lab/jobs/{job['id']}/", **EN).content.decode()
    assert "Needs 3 replicas × 2 GPUs; gpu-host-1 can hold at most 2" in english and expected not in english

    ComputeTarget.objects.filter(pk=box.pk).update(gpu_ids=["0", "1", "2", "3", "4", "5"])
    assert signed_in(world.member).get(f"/api/jobs/{job['id']}", **JA).json()["queued_reason"] == (
        "レプリカ 3 個 × GPU 2 個が必要です。gpu-host-1 を担当するworkerが受け取るのを待っています。")


# Connection-check details -------------------------------------------------------------------------

def fake_nvidia_smi(tmp_path) -> dict:
    """An environment whose nvidia-smi fails as a broken driver does (no GPUs on these machines)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver' >&2\n"
                   "exit 9\n")
    smi.chmod(0o755)
    return dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")


def checked_by_the_real_probe(world, target, pool: ConnectionPool):
    """A check requested by the administrator, run by the real probe, reported through the worker API."""
    worker = ScriptedWorker(world.worker_token, "lab-worker-1")
    assert worker.hello().status_code == 200
    computer_services.request_check(Actor(world.global_admin), target, worker=Worker.objects.get())
    item = worker.claim_check()
    status, result = run_check(item["computer"], pool, api_url=item["api_url"])
    assert worker.complete_check(item, status=status, result=result).status_code == 200
    return result


def tool_output(item: dict) -> bool:
    """A detail that is a program's own output (a version line), not a sentence of the worker."""
    return item["status"] == "ok" and item["key"] in ("python", "pip", "git", "docker", "apptainer", "singularity")


def test_a_check_on_a_local_computer_shows_its_details_in_japanese(world, client, tmp_path):
    local = ComputeTarget.objects.create(owner=world.global_admin, name="here", kind="local", visibility="public",
                                         enabled=True, working_dir=str(tmp_path / "jobs"), gpu_ids=["0"])
    result = checked_by_the_real_probe(world, local, ConnectionPool(allow_local=True,
                                                                    local_env=fake_nvidia_smi(tmp_path)))
    details = {item["key"]: item["detail"] for item in result["items"]}
    # Every sentence the worker wrote is one the server knows (else it would stay English).
    assert [d for i in result["items"] if not tool_output(i) and (d := i["detail"])
            and check_details.match(d) is None] == []

    client.force_login(world.global_admin)
    page = client.get(f"/settings/computers/{local.pk}/", **JA).content.decode()
    rows = dict(re.findall(r'<tr data-item="(\w+)"[^>]*>(.*?)</tr>', page, re.DOTALL))
    assert "このマシンでコマンドを実行できます" in rows["command_execution"]
    assert "nvidia-smiが失敗しました: NVIDIA-SMI has failed" in rows["gpu"]
    assert "このコンピュータにはGPU IDが設定されています" in rows["gpu"]
    assert f"{tmp_path}/jobs はまだありませんが、{tmp_path} の中に作成できます。空き " in rows["work_directory"]
    assert "GPU IDs are set" not in page and "does not exist yet" not in page

    english = client.get(f"/settings/computers/{local.pk}/", **EN).content.decode()
    assert details["gpu"] in english.replace("&#x27;", "'") and "Commands run on this machine" in english


def test_a_refused_ssh_connection_and_a_worker_without_local_computers_say_why_in_japanese(world, client,
                                                                                           tmp_path):
    key = tmp_path / "id_rsa"
    paramiko.RSAKey.generate(2048).write_private_key_file(str(key))
    key.chmod(0o600)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ssh = ComputeTarget.objects.create(owner=world.global_admin, name="closed", kind="ssh", visibility="public",
                                       enabled=True, host="127.0.0.1", port=port, ssh_user="mmt",
                                       ssh_key_path=str(key), known_hosts_path=str(known_hosts))
    result = checked_by_the_real_probe(world, ssh, ConnectionPool())
    assert result["items"][0]["detail"].startswith(f"The connection to 127.0.0.1:{port} was refused")

    client.force_login(world.global_admin)
    page = client.get(f"/settings/computers/{ssh.pk}/", **JA).content.decode()
    rows = dict(re.findall(r'<tr data-item="(\w+)"[^>]*>(.*?)</tr>', page, re.DOTALL))
    assert (f"127.0.0.1:{port} への接続が拒否されました。HostとPort、コンピュータでsshdが動いていることを確かめてください。"
            in rows["connection"])
    assert "接続できることが必要です。" in rows["python"]

    # The same texts from a worker that refuses Local computers, translated on display.
    status, refused = run_check({"id": 9, "kind": "local"}, ConnectionPool(allow_local=False))
    with translation.override("ja"):
        shown = [check_details.translate(item["detail"]) for item in refused["items"]]
    assert shown[0].startswith("このworkerではLocalのコンピュータが無効です。")
    assert set(shown[1:]) == {"接続できることが必要です。"}


def test_details_the_server_does_not_know_are_shown_as_they_came():
    """An older or newer worker's wording: never lost, never garbled."""
    with translation.override("ja"):
        assert check_details.translate("connected as mmt") == "connected as mmt"
        assert check_details.translate("") == ""
        assert check_details.translate("git is not installed.") == "git はインストールされていません。"
        # Values are put back as they came, even when they look like the sentence's own words.
        assert check_details.translate("/srv/a is writable is writable") == "/srv/a is writable に書き込めます"
