"""Refusals of the sites app in the user's language (issue 14, "Errors in the user's language"): the site
form, the API and mado-tracking submit's endpoints answer a Japanese reader in Japanese, with the same
`code` and fields as in English, and the English wording is unchanged."""
from __future__ import annotations

import html as htmllib

import pytest
from django.urls import reverse

from jobs.models import Job
from tests.conftest import assert_error, bearer
from tests.sites import conftest as site_fixtures

host_keys, launcher, site_fields, make_site = (site_fixtures.host_keys, site_fixtures.launcher,
                                               site_fixtures.site_fields, site_fixtures.make_site)

pytestmark = pytest.mark.django_db
JA = {"HTTP_ACCEPT_LANGUAGE": "ja"}


def test_the_sites_api_refuses_a_japanese_reader_in_japanese_with_the_same_code(world, site_fields):
    client = bearer(world.token(world.member, ["read", "admin"]))
    bad = site_fields(working_dir="work/mmt", variables="PARTITION gpu", queue_timeout_seconds=5, port=70000)
    english = assert_error(client.post("/api/sites", bad, format="json"), 422, "invalid_site")
    japanese = assert_error(client.post("/api/sites", bad, format="json", **JA), 422, "invalid_site")
    assert set(japanese["fields"]) == set(english["fields"]) == {"working_dir", "variables", "queue_timeout_seconds",
                                                                 "port"}
    assert english["fields"]["working_dir"][0].startswith("Enter the working directory as an absolute path")
    assert japanese["fields"]["working_dir"][0].startswith("作業ディレクトリを英字・数字")
    assert japanese["fields"]["variables"] == ["1行目: NAME=VALUEの形で書いてください。"]
    assert japanese["fields"]["queue_timeout_seconds"] == ["キュー待ちの時間切れは60秒から30日までです。"]
    assert japanese["error"].startswith("次の項目を直してください: ")


def test_the_site_form_shows_its_refusals_in_japanese(client, world, make_site):
    make_site(world.member, name="taken-name")
    client.force_login(world.member)
    page = client.post(reverse("computer-add"), {
        "kind": "site", "action": "save", "name": "bobs-pc", "visibility": "private", "submission": "manual",
        "working_dir": "/home/bob/mmt", "runner_python": "/usr/bin/python3",
        "runner_api_url": "https://tracking.example.org", "variables": "PARTITION=gpu $(id)",
        "template": "docker_host", "queue_timeout": "7d", "max_active_submissions": "10"}, HTTP_HX_REQUEST="true",
        **JA)
    text = htmllib.unescape(page.content.decode())
    assert "PARTITIONの値は、英字・数字・. _ -からなり、-で始まらない語か" in text


def test_manual_submission_refusals_reach_a_japanese_reader_in_japanese(world, make_site):
    target = make_site(world.project_admin, name="alices-pc", submission="manual", visibility="public",
                       template="docker_host", launcher=None, host="", known_hosts="", ssh_user="")
    Job.objects.create(project=world.project, created_by=world.member, target=target, command=["python", "x.py"],
                       status="waiting_manual")
    client = bearer(world.member_token(world.member))
    url = f"/api/sites/{target.pk}/submissions/claim"
    body = assert_error(client.post(url, {"all": True}, format="json", **JA), 403, "site_owner_required")
    assert body["error"].startswith("ほかの人のJobを投入できる（--all）のは、コンピュータの所有者だけです。")
    body = assert_error(client.post(url, {"all": True}, format="json"), 403, "site_owner_required")
    assert body["error"].startswith("Only the computer's owner submits other people's Jobs (--all)")
    body = assert_error(client.post(f"/api/sites/{target.pk}/checks", {"mine": False}, format="json", **JA), 422,
                        "site_check_not_applicable")
    assert body["error"] == ("alices-pcは手動投入なので、ランチャーはログインしません。代わりにそのコンピュータで"
                             "mado-tracking submit --dry-runを実行してください。")
