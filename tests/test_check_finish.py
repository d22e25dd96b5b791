"""One guarded ending for both kinds of connection check (CheckBase.finish and .expire): a worker
checking an SSH computer (ConnectionCheck), and a site's launcher logging in (sites' SiteCheck). A
finished check keeps its first answer and takes the same one resent; an expired check refuses a late
answer without reading it; an answer that lands while the expiry runs wins; each kind expires by its
own deadline."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone
from rest_framework.test import APIClient

from computers import services as computer_services
from computers.models import ConnectionCheck
from mado.models import AuditEvent
from mado.services import Actor
from sites import checks
from sites.models import SiteCheck
from tests.computer_fixtures import ScriptedWorker, failed_result, good_result
from tests.conftest import assert_error
from tests.sites.conftest import host_keys  # noqa: F401
from tests.sites.site_jobs import launcher, lclient, no_expiry_throttle, registered, site_of  # noqa: F401

pytestmark = pytest.mark.django_db

ALREADY = "This check already ended as succeeded."


@pytest.fixture
def worker(world):
    w = ScriptedWorker(world.worker_token, "lab-worker-1")
    assert w.hello().status_code == 200
    return w


@pytest.fixture
def site(world, host_keys, launcher):  # noqa: F811
    return site_of(world.project_admin, host_keys, launcher)


def claimed_worker_check(world, computers, worker) -> dict:
    admin = APIClient()
    admin.force_login(world.global_admin)
    response = admin.post(f"/api/computers/{computers.admins_public.pk}/checks", {"worker_id": "lab-worker-1"},
                          format="json")
    assert response.status_code == 201, response.content
    return worker.claim_check()


def claimed_site_check(world, site, lclient) -> str:  # noqa: F811
    """The launcher's answer URL of a shared-account check it has been handed."""
    check = checks.request_site_check(Actor(world.project_admin), site, mine=False)
    assert [c["id"] for c in lclient.get("/api/launcher/config").json()["checks"]] == [check.pk]
    return f"/api/launcher/checks/{check.pk}/complete"


def stored(check_id, model=ConnectionCheck):
    return model.objects.get(pk=check_id)


class TestWorkerChecks:
    def test_a_finished_check_keeps_its_first_result(self, world, computers, worker):
        item = claimed_worker_check(world, computers, worker)
        assert worker.complete_check(item).status_code == 200
        refused = worker.complete_check(item, status="failed", result=failed_result())
        assert assert_error(refused, 409, "check_already_completed")["error"] == ALREADY
        check = stored(item["id"])
        assert (check.status, check.failure_reason, check.result["items"][0]["status"]) == ("succeeded", "", "ok")
        assert worker.complete_check(item).status_code == 200, "the same result resent is accepted"
        assert AuditEvent.objects.filter(action="computer.check.finish").count() == 1, "and recorded once"

    def test_an_expired_check_refuses_a_late_result_without_reading_it(self, world, computers, worker):
        item = claimed_worker_check(world, computers, worker)
        ConnectionCheck.objects.filter(pk=item["id"]).update(claimed_at=timezone.now() - timedelta(minutes=6))
        late = good_result()
        late["items"][0]["detail"] = "saw " + world.worker_token  # would be a 422 on an open check
        body = assert_error(worker.complete_check(item, result=late), 409, "check_expired")
        assert body["error"] == "This check expired before its result arrived; the user can start a new one."
        check = stored(item["id"])
        assert (check.status, check.failure_reason, check.result) == ("expired", "no_result", None)
        assert [e.after["status"] for e in AuditEvent.objects.filter(action="computer.check.finish")] == ["expired"]

    def test_a_result_that_lands_while_the_expiry_runs_wins(self, world, computers, worker):
        item = claimed_worker_check(world, computers, worker)
        as_the_expiry_read_it = stored(item["id"])
        assert as_the_expiry_read_it.status == "claimed"
        assert worker.complete_check(item).status_code == 200
        assert as_the_expiry_read_it.expire(timezone.now()) is False
        assert (stored(item["id"]).status, stored(item["id"]).failure_reason) == ("succeeded", "")


class TestSiteChecks:
    def test_a_finished_check_keeps_its_first_answer(self, world, site, lclient):  # noqa: F811
        url = claimed_site_check(world, site, lclient)
        assert lclient.post(url, {"ok": True, "duration_ms": 120}, format="json").json()["status"] == "succeeded"
        refused = lclient.post(url, {"ok": False, "error": "Permission denied (publickey)."}, format="json")
        assert assert_error(refused, 409, "check_already_completed")["error"] == ALREADY
        check = SiteCheck.objects.get(target=site)
        assert (check.status, check.failure_reason, check.result["duration_ms"]) == ("succeeded", "", 120)
        assert lclient.post(url, {"ok": True}, format="json").status_code == 200, "the same answer resent"
        assert AuditEvent.objects.filter(action="site.check.finish").count() == 1, "and recorded once"

    def test_an_expired_check_refuses_a_late_answer(self, world, site, lclient):  # noqa: F811
        url = claimed_site_check(world, site, lclient)
        SiteCheck.objects.filter(target=site).update(
            created_at=timezone.now() - checks.CHECK_TIMEOUT - timedelta(seconds=1))
        body = assert_error(lclient.post(url, {"ok": False, "error": "Connection refused"}, format="json"), 409,
                            "check_expired")
        assert body["error"] == "This check expired before its answer arrived; the user can start a new one."
        check = SiteCheck.objects.get(target=site)
        assert (check.status, check.failure_reason, check.result) == ("expired", "no_result", None)
        events = AuditEvent.objects.filter(action="site.check.finish")
        assert [e.after["status"] for e in events] == ["expired"], "the late answer left no trace"


def test_each_kind_expires_by_its_own_deadline_and_audit_action(world, computers, worker, site):
    """Six minutes unclaimed is past both deadlines; the workers' expiry ends only the worker's check,
    the sites' expiry the site's."""
    admin = APIClient()
    admin.force_login(world.global_admin)
    ssh = admin.post(f"/api/computers/{computers.admins_public.pk}/checks", {"worker_id": "lab-worker-1"},
                     format="json").json()["id"]
    launcher_check = checks.request_site_check(Actor(world.project_admin), site, mine=False).pk
    for model in (ConnectionCheck, SiteCheck):
        model.objects.update(created_at=timezone.now() - timedelta(minutes=6))
    computer_services.expire_stale(force=True)
    assert (stored(ssh).status, stored(ssh).failure_reason) == ("expired", "not_claimed")
    assert stored(launcher_check, SiteCheck).status == "queued"
    checks.expire_checks(force=True)
    site_check = stored(launcher_check, SiteCheck)
    assert (site_check.status, site_check.failure_reason) == ("expired", "not_claimed")
    finished = AuditEvent.objects.filter(action__endswith=".check.finish").order_by("id")
    assert [(e.action, e.after["check"], e.after["failure_reason"]) for e in finished] == [
        ("computer.check.finish", ssh, "not_claimed"), ("site.check.finish", launcher_check, "not_claimed")]


BEFORE_SPLIT = [("computers", "0005_compute_groups"), ("sites", "0005_launcher_allowed_hosts")]


def migrate_to(targets=None):
    """Migrate to `targets`, or back to the newest migration of every app (what the other tests expect)."""
    executor = MigrationExecutor(connection)
    targets = targets or executor.loader.graph.leaf_nodes()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_an_upgraded_lab_keeps_its_site_checks_under_their_ids():
    """Before the split both kinds shared ConnectionCheck; the upgrade moves the launcher's checks to
    SiteCheck with their ids (the check pages' addresses and the audit rows name them)."""
    try:
        old = migrate_to(BEFORE_SPLIT)
        owner = old.get_model("auth", "User").objects.create(username="olivia")
        Target, Check = old.get_model("computers", "ComputeTarget"), old.get_model("computers", "ConnectionCheck")
        box = Target.objects.create(name="box", owner=owner)
        hpc = Target.objects.create(name="hpc", owner=owner, kind="site")
        launcher = old.get_model("sites", "Launcher").objects.create(name="hpc-launcher", created_by=owner)
        worker_check = Check.objects.create(target=box, requested_by=owner, status="succeeded").pk
        shared = Check.objects.create(target=hpc, requested_by=owner, launcher=launcher, account_name="mmtshared",
                                      status="failed", failure_reason="check_failed", result={"items": []}).pk
        own = Check.objects.create(target=hpc, requested_by=owner, launcher=launcher, site_user=owner,
                                   account_name="olivia1").pk
    finally:
        migrate_to()
    assert list(ConnectionCheck.objects.values_list("pk", flat=True)) == [worker_check]
    moved = {c.pk: (c.status, c.site_user_id is not None, c.account_name) for c in SiteCheck.objects.all()}
    assert moved == {shared: ("failed", False, "mmtshared"), own: ("queued", True, "olivia1")}
    site = SiteCheck.objects.get(pk=shared).target
    assert SiteCheck.objects.create(target=site, launcher_id=SiteCheck.objects.get(pk=own).launcher_id,
                                    account_name="mmtshared").pk > own, "new checks never take a moved id"
