"""Connection checks and directory reads driven by a scripted worker over HTTP."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from computers.models import ConnectionCheck, DirectoryRead
from mado.models import AuditEvent
from tests.computer_fixtures import ScriptedWorker, failed_result, good_result
from tests.conftest import assert_error
from tests.support import run_periodic, wait_for


def session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


@pytest.fixture
def worker(world):
    w = ScriptedWorker(world.worker_token, "lab-worker-1")
    assert w.hello().status_code == 200
    return w


class TestChecks:
    def test_a_check_naming_a_worker_is_claimed_only_by_that_worker(self, world, computers, worker):
        other = ScriptedWorker(world.worker_token, "lab-worker-2", target_ids=[computers.admins_public.pk])
        other.hello()
        admin = session(world.global_admin)
        check = admin.post(f"/api/computers/{computers.admins_public.pk}/checks", {"worker_id": "lab-worker-1"},
                           format="json").json()
        assert check["status"] == "queued" and check["requested_worker"] == "lab-worker-1"
        assert other.claim_check() is None
        item = worker.claim_check()
        assert item["id"] == check["id"] and item["computer"]["host"] == "gpu-host-1.example.internal"
        assert item["computer"]["ssh_key_path"].endswith("mmt_worker_ed25519")

    def test_a_check_naming_no_worker_goes_only_to_workers_handling_the_computer(self, world, computers, worker):
        """Target ids choose the worker; the computer's visibility still decides: alice's Private
        computer is checked by the worker of the service account alice created, not by root's."""
        private = computers.researchers_private.pk
        roots = ScriptedWorker(world.worker_token, "roots-handler", target_ids=[private])
        roots.hello()
        alices_token = world.token(world.alices_account.user, ["read", "worker:execute"], kind="service")
        handler = ScriptedWorker(alices_token, "handler", target_ids=[private])
        handler.hello()
        session(world.project_admin).post(f"/api/computers/{private}/checks", {}, format="json")
        assert worker.claim_check() is None, "a worker without target ids never takes unnamed checks"
        assert roots.claim_check() is None, "root's service account may not run jobs on alice's Private computer"
        assert handler.claim_check()["computer"]["id"] == private

    def test_the_result_lands_and_the_user_reads_it_with_resolutions(self, world, computers, worker):
        admin = session(world.global_admin)
        url = f"/api/computers/{computers.admins_public.pk}/checks"
        check = admin.post(url, {"worker_id": "lab-worker-1"}, format="json").json()
        item = worker.claim_check()
        assert admin.get(f"{url}/{check['id']}").json()["status_text"] == "The worker is checking the connection…"
        assert worker.complete_check(item).status_code == 200
        body = admin.get(f"{url}/{check['id']}").json()
        assert body["status"] == "succeeded" and body["status_text"] == "Connection verified"
        assert body["result"]["machine"]["arch"] == "amd64"
        assert [i["key"] for i in body["result"]["items"]][:2] == ["connection", "python"]
        assert body["result"]["items"][0]["label"] == "SSH connection"
        assert AuditEvent.objects.filter(action="computer.check.finish").count() == 1

    def test_a_failed_check_carries_the_resolution_of_each_failed_item(self, world, computers, worker):
        admin = session(world.global_admin)
        url = f"/api/computers/{computers.admins_public.pk}/checks"
        check = admin.post(url, {"worker_id": "lab-worker-1"}, format="json").json()
        worker.complete_check(worker.claim_check(), status="failed", result=failed_result())
        body = admin.get(f"{url}/{check['id']}").json()
        assert body["status"] == "failed" and body["failure_text"] == "Could not verify connection"
        first = body["result"]["items"][0]
        assert first["status"] == "failed" and "authorized_keys" in first["resolution"]

    def test_one_open_check_per_computer(self, world, computers, worker):
        admin = session(world.global_admin)
        url = f"/api/computers/{computers.admins_public.pk}/checks"
        assert admin.post(url, {"worker_id": "lab-worker-1"}, format="json").status_code == 201
        assert_error(admin.post(url, {}, format="json"), 409, "target_check_in_progress")

    def test_a_resent_claim_returns_the_same_check_with_the_same_lease(self, world, computers, worker):
        session(world.global_admin).post(f"/api/computers/{computers.admins_public.pk}/checks",
                                         {"worker_id": "lab-worker-1"}, format="json")
        first = worker.claim_check()
        assert worker.claim_check() == first

    def test_completion_is_idempotent_and_a_wrong_lease_is_409(self, world, computers, worker):
        session(world.global_admin).post(f"/api/computers/{computers.admins_public.pk}/checks",
                                         {"worker_id": "lab-worker-1"}, format="json")
        item = worker.claim_check()
        assert_error(worker.complete_check({**item, "lease_id": "00000000-0000-0000-0000-000000000000"}), 409,
                     "invalid_lease")
        assert worker.complete_check(item).status_code == 200
        assert worker.complete_check(item).status_code == 200
        assert_error(worker.complete_check(item, status="failed", result=failed_result()), 409,
                     "check_already_completed")

    @pytest.mark.parametrize("leak", ["key path", "known_hosts path", "token", "private key"])
    def test_a_result_holding_a_secret_is_refused_and_nothing_is_stored(self, world, computers, worker, leak):
        session(world.global_admin).post(f"/api/computers/{computers.admins_public.pk}/checks",
                                         {"worker_id": "lab-worker-1"}, format="json")
        item = worker.claim_check()
        result = good_result()
        result["items"][0]["detail"] = {
            "key path": "cannot read /home/worker/.ssh/mmt_worker_ed25519",
            "known_hosts path": "bad /home/worker/.ssh/mmt_known_hosts",
            "token": "saw " + world.worker_token,
            "private key": "-----BEGIN OPENSSH PRIVATE KEY-----",
        }[leak]
        assert_error(worker.complete_check(item, result=result), 422, "target_check_secret_in_result")
        check = ConnectionCheck.objects.get(pk=item["id"])
        assert check.result is None and check.status == "claimed"

    def test_an_unclaimed_check_expires_after_5_minutes_as_not_claimed(self, world, computers, worker):
        admin = session(world.global_admin)
        url = f"/api/computers/{computers.admins_public.pk}/checks"
        check = admin.post(url, {"worker_id": "lab-worker-1"}, format="json").json()
        ConnectionCheck.objects.filter(pk=check["id"]).update(created_at=timezone.now() - timedelta(minutes=5, seconds=1))
        assert admin.get(f"{url}/{check['id']}").json()["status"] == "queued", "a read applies no deadline"
        run_periodic()  # computers.expire_stale, as the periodic runner does
        body = admin.get(f"{url}/{check['id']}").json()
        assert body["status"] == "expired" and body["failure_reason"] == "not_claimed"
        assert body["failure_text"] == "The selected worker did not claim the check"
        assert admin.post(url, {"worker_id": "lab-worker-1"}, format="json").status_code == 201

    def test_a_claimed_check_without_result_expires_after_5_minutes_as_no_result(self, world, computers, worker):
        admin = session(world.global_admin)
        url = f"/api/computers/{computers.admins_public.pk}/checks"
        check = admin.post(url, {"worker_id": "lab-worker-1"}, format="json").json()
        item = worker.claim_check()
        ConnectionCheck.objects.filter(pk=check["id"]).update(claimed_at=timezone.now() - timedelta(minutes=6))
        run_periodic()
        assert admin.get(f"{url}/{check['id']}").json()["failure_reason"] == "no_result"
        assert_error(worker.complete_check(item), 409, "check_expired")

    def test_details_check_follows_a_reinstalled_worker_with_the_same_id(self, world, computers, worker):
        from datetime import timedelta

        from django.utils import timezone

        from workers.models import Worker

        admin = session(world.global_admin)
        url = f"/api/computers/{computers.admins_public.pk}/checks"
        admin.post(url, {"worker_id": "lab-worker-1"}, format="json")
        worker.complete_check(worker.claim_check())
        Worker.objects.update(last_seen_at=timezone.now() - timedelta(minutes=5))
        reinstalled = ScriptedWorker(world.token(world.service_account.user, ["read", "worker:execute"],
                                                 kind="service"), "lab-worker-1")
        reinstalled.hello()
        again = admin.post(url, {}, format="json").json()
        assert reinstalled.claim_check()["id"] == again["id"]

    def test_details_check_asks_the_worker_of_the_last_check_again(self, world, computers, worker):
        admin = session(world.global_admin)
        url = f"/api/computers/{computers.admins_public.pk}/checks"
        admin.post(url, {"worker_id": "lab-worker-1"}, format="json")
        worker.complete_check(worker.claim_check())
        again = admin.post(url, {}, format="json").json()
        assert again["requested_worker"] == "lab-worker-1"

@pytest.mark.django_db(transaction=True)
def test_a_long_poll_claim_returns_as_soon_as_a_check_is_requested(world, computers, worker, monkeypatch):
    """LISTEN/NOTIFY wakes the waiting claim: with every fallback wake-up moved past its 10 s wait, only
    the notification can hand it the check."""
    from django.db import connection

    from mado import longpoll

    monkeypatch.setattr(longpoll, "MISSED_NOTIFY_SECONDS", 60.0)
    monkeypatch.setattr(longpoll, "LISTENING_RECHECK_SECONDS", 60.0)
    admin = session(world.global_admin)
    found = {}

    def claim():
        started = time.monotonic()
        found["item"] = worker.claim_check(wait=10)
        found["seconds"] = time.monotonic() - started
        connection.close()

    thread = threading.Thread(target=claim)
    thread.start()
    wait_for(lambda: longpoll.hub().parked("mado_checks")[0], timeout=20, what="the claim parked in its long-poll")
    admin.post(f"/api/computers/{computers.admins_public.pk}/checks", {"worker_id": "lab-worker-1"}, format="json")
    thread.join(15)
    assert found["item"] is not None, "the notification woke it before its wait ran out"
    print(f"long-poll claim woke after {found['seconds']:.3f} s")


@pytest.mark.django_db(transaction=True)
def test_two_workers_racing_for_one_check_on_postgresql_exactly_one_wins(world, computers):
    """Real concurrent transactions: SKIP LOCKED hands the check to exactly one of them."""
    from django.db import connection

    w1 = ScriptedWorker(world.worker_token, "racer-1", target_ids=[computers.admins_public.pk])
    w2 = ScriptedWorker(world.worker_token, "racer-2", target_ids=[computers.admins_public.pk])
    w1.hello()
    w2.hello()
    session(world.global_admin).post(f"/api/computers/{computers.admins_public.pk}/checks", {}, format="json")
    results = {}
    barrier = threading.Barrier(2)

    def race(w):
        barrier.wait()
        results[w.worker_id] = w.claim_check()
        connection.close()

    threads = [threading.Thread(target=race, args=(w,)) for w in (w1, w2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    winners = [k for k, v in results.items() if v is not None]
    assert len(winners) == 1
    winner = w1 if winners[0] == "racer-1" else w2
    assert winner.claim_check()["lease_id"] == results[winners[0]]["lease_id"]


class TestReads:
    def test_a_read_round_trip_returns_names_and_kinds(self, world, computers, worker):
        admin = session(world.global_admin)
        url = f"/api/computers/{computers.admins_public.pk}/reads"
        read = admin.post(url, {"path": "/data/", "worker_id": "lab-worker-1"}, format="json").json()
        assert read["status"] == "queued"
        item = worker.claim_read()
        assert item["path"] == "/data/" and item["connection"]["ssh_user"] == "mmt"
        entries = [{"name": "mmt-jobs", "kind": "dir"}, {"name": ".cache", "kind": "dir"},
                   {"name": "run.sh", "kind": "exec"}]
        assert worker.complete_read(item, entries=entries).status_code == 200
        body = admin.get(f"{url}/{read['id']}").json()
        assert body["status"] == "done"
        assert body["entries"][0]["kind"] == "dir" and {e["name"] for e in body["entries"]} == {"mmt-jobs", ".cache",
                                                                                                 "run.sh"}

    @pytest.mark.parametrize("error,text", [
        ("not_found", "This directory does not exist"),
        ("permission_denied", "Cannot read this directory (permission denied)"),
        ("connect_failed", "The worker could not connect"),
        ("not_a_directory", "This is not a directory"),
    ])
    def test_read_errors_come_back_as_the_seeds_messages(self, world, computers, worker, error, text):
        admin = session(world.global_admin)
        url = f"/api/computers/{computers.admins_public.pk}/reads"
        read = admin.post(url, {"path": "/nope/", "worker_id": "lab-worker-1"}, format="json").json()
        worker.complete_read(worker.claim_read(), error=error)
        body = admin.get(f"{url}/{read['id']}").json()
        assert body["status"] == "failed" and body["error"] == error and body["error_text"] == text

    def test_entries_with_contents_or_paths_are_refused(self, world, computers, worker):
        session(world.global_admin).post(f"/api/computers/{computers.admins_public.pk}/reads",
                                         {"path": "/data/", "worker_id": "lab-worker-1"}, format="json")
        item = worker.claim_read()
        bad = worker.complete_read(item, entries=[{"name": "id_rsa", "kind": "file", "content": "secret"}])
        assert_error(bad, 422)
        assert_error(worker.complete_read(item, entries=[{"name": "a/b", "kind": "dir"}]), 422)

    def test_reads_need_an_online_worker_and_an_absolute_path(self, world, computers, worker):
        admin = session(world.global_admin)
        url = f"/api/computers/{computers.admins_public.pk}/reads"
        assert_error(admin.post(url, {"path": "data", "worker_id": "lab-worker-1"}, format="json"), 422, "invalid_path")
        body = assert_error(admin.post(url, {"path": "/data/", "worker_id": "ghost"}, format="json"), 400)
        assert "No online worker ghost" in body["error"]

    def test_reads_are_forgotten_after_10_minutes(self, world, computers, worker):
        admin = session(world.global_admin)
        url = f"/api/computers/{computers.admins_public.pk}/reads"
        read = admin.post(url, {"path": "/data/", "worker_id": "lab-worker-1"}, format="json").json()
        DirectoryRead.objects.filter(pk=read["id"]).update(created_at=timezone.now() - timedelta(minutes=11))
        run_periodic()
        assert_error(admin.get(f"{url}/{read['id']}"), 404)

    def test_a_read_is_only_handed_to_the_worker_it_names(self, world, computers, worker):
        other = ScriptedWorker(world.worker_token, "lab-worker-2")
        other.hello()
        session(world.global_admin).post(f"/api/computers/{computers.admins_public.pk}/reads",
                                         {"path": "/data/", "worker_id": "lab-worker-1"}, format="json")
        assert other.claim_read() is None
        assert worker.claim_read() is not None
