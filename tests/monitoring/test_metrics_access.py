"""Who reads /metrics: a global administrator's token with metrics:read (or their signed-in browser), and
the addresses of METRICS_ALLOWED_ADDRESSES; everyone else is refused with a sentence saying what to do."""
from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from rest_framework.test import APIClient

from jobs.models import Job
from mado import services
from mado.choices import Scope, TokenKind
from mado.errors import ServiceError
from mado.models import ApiToken, JobToken
from notifications.models import Delivery, NotificationRule
from tests.conftest import assert_error, bearer
from tests.job_fixtures import gpu_computer
from tests.monitoring.conftest import scrape
from workers.models import Worker

PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")  # what Prometheus 2.x sends


def test_a_global_administrators_token_with_metrics_read_scrapes(world, metrics_client):
    figures = scrape(metrics_client)
    assert "mado_jobs" in figures.families and "mado_workers_online" in figures.families


def test_prometheus_gets_openmetrics_when_it_asks(world, metrics_client):
    response = metrics_client.get("/metrics", HTTP_ACCEPT=PROMETHEUS_ACCEPT)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/openmetrics-text")
    names = {family.name for family in openmetrics_families(response.content.decode())}
    assert {"mado_job_claims", "mado_job_dispatch_latency_seconds", "mado_gpu_reservations"} <= names


def test_without_a_token_the_scrape_is_refused_with_what_to_send(world):
    body = assert_error(APIClient().get("/metrics"), 401, "not_authenticated")
    assert "metrics:read" in body["error"] and "MADO_METRICS_ALLOWED_ADDRESSES" in body["error"]
    response = APIClient().get("/metrics", HTTP_ACCEPT="text/plain")  # refusals stay JSON, never 406
    assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer")


def test_the_refusal_speaks_the_callers_language(world):
    body = assert_error(APIClient().get("/metrics", HTTP_ACCEPT_LANGUAGE="ja"), 401, "not_authenticated")
    assert "metrics:read の scope を持つトークン" in body["error"]


def test_a_token_without_the_scope_is_refused(world, api):
    body = assert_error(api(world.token(world.global_admin, ["read"])).get("/metrics"), 403, "missing_scope")
    assert "metrics:read" in body["error"]
    assert_error(api(world.member_token(world.member)).get("/metrics"), 403, "missing_scope")
    assert_error(api(world.worker_token).get("/metrics"), 403, "missing_scope")


def test_a_job_token_is_refused(world, api):
    job = Job.objects.create(project=world.project, created_by=world.member, runtime="python",
                             target=gpu_computer(world.global_admin), command=["python", "x.py"])
    _, plaintext = services.issue_job_token(job_id=job.pk, lease_id="00000000-0000-4000-8000-000000000001",
                                            project=world.project, user=world.member)
    assert JobToken.objects.filter(job_id=job.pk).exists()
    assert_error(api(plaintext).get("/metrics"), 403, "missing_scope")


def test_a_launcher_token_is_refused(world, api):
    launcher = world.token(world.global_admin, ["launcher:execute"], kind=TokenKind.LAUNCHER)
    assert_error(api(launcher).get("/metrics"), 403, "launcher_token_forbidden")


def test_only_a_global_administrator_is_offered_metrics_read(world):
    assert Scope.METRICS_READ in services.allowed_scopes(world.global_admin, world.project, TokenKind.PERSONAL)
    for user in (world.project_admin, world.member, world.service_account.user):
        kind = TokenKind.SERVICE if user == world.service_account.user else TokenKind.PERSONAL
        assert Scope.METRICS_READ not in services.allowed_scopes(user, world.project, kind)
    with pytest.raises(ServiceError) as refused:
        world.token(world.project_admin, ["read", "metrics:read"])
    assert refused.value.code == "scope_not_allowed"


def test_the_token_dialog_offers_metrics_read_to_a_global_administrator_only(world, client):
    url = reverse("personal-token-create", args=["lab"])
    client.force_login(world.global_admin)
    assert 'value="metrics:read"' in client.get(url).content.decode()
    client.force_login(world.project_admin)
    assert 'value="metrics:read"' not in client.get(url).content.decode()


def test_a_token_whose_holder_is_no_longer_global_administrator_is_refused(world, metrics_client):
    world.global_admin.is_superuser = False
    world.global_admin.save(update_fields=["is_superuser"])
    body = assert_error(metrics_client.get("/metrics"), 403, "global_admin_required")
    assert "global administrator" in body["error"]


def test_a_signed_in_global_administrator_reads_it_in_the_browser_and_nobody_else(world, client):
    client.force_login(world.global_admin)
    assert client.get("/metrics").status_code == 200
    client.force_login(world.project_admin)
    assert_error(client.get("/metrics"), 403, "global_admin_required")


@override_settings(METRICS_ALLOWED_ADDRESSES=["10.20.0.0/16", "192.0.2.7", "fd00:1::/64"])
def test_listed_addresses_scrape_without_a_token(world):
    for address in ("10.20.3.4", "192.0.2.7", "fd00:1::9", "::ffff:10.20.3.4"):
        response = APIClient(REMOTE_ADDR=address).get("/metrics")
        assert response.status_code == 200, (address, response.content)
        assert b"# TYPE mado_jobs gauge" in response.content
    for address in ("10.21.0.1", "192.0.2.8", "127.0.0.1", "fd00:2::1"):
        assert_error(APIClient(REMOTE_ADDR=address).get("/metrics"), 401, "not_authenticated")


def test_no_address_is_listed_by_default(world):
    assert_error(APIClient(REMOTE_ADDR="127.0.0.1").get("/metrics"), 401, "not_authenticated")


@override_settings(METRICS_ALLOWED_ADDRESSES=["10.20.0.0/16"], BEHIND_PROXY=True)
def test_behind_the_proxy_the_address_the_proxy_appended_counts(world):
    proxy = {"REMOTE_ADDR": "127.0.0.1"}
    assert APIClient(**proxy, HTTP_X_FORWARDED_FOR="203.0.113.9, 10.20.1.1").get("/metrics").status_code == 200
    # What the client itself wrote in front is not believed.
    assert_error(APIClient(**proxy, HTTP_X_FORWARDED_FOR="10.20.1.1, 203.0.113.9").get("/metrics"), 401)


def test_an_unreadable_address_list_stops_manage_py_check(world):
    with override_settings(METRICS_ALLOWED_ADDRESSES=["10.0.0.0/8", "10.0.0.300"]):
        with pytest.raises(SystemCheckError) as failed:
            call_command("check")
    assert "'10.0.0.300' is neither an IP address nor a network" in str(failed.value)
    assert "MADO_METRICS_ALLOWED_ADDRESSES" in str(failed.value)


def test_the_scrape_needs_a_fixed_number_of_queries_however_many_rows(world, metrics_token,
                                                                      django_assert_max_num_queries):
    def queries() -> int:
        client = bearer(metrics_token)
        with CaptureQueriesContext(connection) as captured:
            scrape(client)
        return len(captured)

    queries()  # the token's first use writes last_used_at; later ones within a minute do not
    small = queries()
    _a_bigger_lab(world)
    assert queries() == small
    # The token's lookup (its last use is written at most once a minute) and the collector's eight aggregates.
    with django_assert_max_num_queries(9):
        scrape(bearer(metrics_token))


def _a_bigger_lab(world):
    computers = [gpu_computer(world.global_admin, f"more-{i}") for i in range(5)]
    token = ApiToken.objects.get(prefix=world.worker_token[:12])
    Worker.objects.bulk_create([Worker(token=token, account=token.user, project=world.project,
                                       worker_id=f"extra-{i}") for i in range(20)])
    jobs = Job.objects.bulk_create([Job(project=world.project, created_by=world.member, target=computers[i % 5],
                                        runtime="python", command=["python", "x.py"]) for i in range(50)])
    for job in jobs[:5]:
        job.events.create(kind="claimed", message="Claimed")
        job.log_chunks.create(stream="stdout", offset=0, data="hello\n")
        job.artifacts.create(path="a.bin", size=10, sha256="0" * 64, received_bytes=10)
        job.gpu_reservations.create(target=job.target, gpu_id="0")
    rule = NotificationRule.objects.create(project=world.project, name="r", events=["job.failed"],
                                           channel="email", email_to="a@example.org", created_by=world.member)
    Delivery.objects.bulk_create([Delivery(rule=rule, event="job.failed", source=f"s{i}", payload={},
                                           status=["pending", "delivered", "failed"][i % 3]) for i in range(9)])


def test_metrics_stays_out_of_the_api_schema():
    """/metrics is no JSON API path: listing it would move the schema's common prefix off /api/ and rename
    every operationId in docs/openapi.yaml."""
    from drf_spectacular.generators import SchemaGenerator

    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]
    assert all(path.startswith("/api/") for path in paths), [p for p in paths if not p.startswith("/api/")]
    assert paths["/api/health"]["get"]["operationId"] == "health_retrieve"
