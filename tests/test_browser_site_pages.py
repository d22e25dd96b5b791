"""The site pages in real Chromium (issue 15): a job shell version opens in the dialog from the site's
details (item 3), the site form reports every wrong field in one Save (item 11), and after saving a
site the address names its details, so a reload keeps them (item 14)."""
from __future__ import annotations

import os
import re

import pytest

from computers.models import ComputeTarget
from mado.services import Actor
from sites import services
from tests.browser import chromium_page  # noqa: F401  (fixture)
from tests.sites import conftest as site_fixtures
from tests.sites.conftest import LOGIN_HOST

host_keys, launcher = site_fixtures.host_keys, site_fixtures.launcher  # fixtures of tests/sites
site_fields, make_site = site_fixtures.site_fields, site_fixtures.make_site

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = pytest.mark.browser


def sign_in(browser, username: str, password: str, path: str):
    from playwright.sync_api import expect

    page = browser.page
    browser.goto(f"/login/?next={path}")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("h1")).to_have_text("Computers")
    return page


def test_view_of_a_job_shell_version_opens_it_in_the_dialog_from_the_sites_details(
    transactional_db, live_server, world, chromium_page, make_site  # noqa: F811
):
    from playwright.sync_api import expect

    target = make_site(world.member, name="bobs-hpc")
    first = target.job_shells.get().content
    services.save_job_shell(Actor(world.member), target, first + "\n# version two\n")
    browser = chromium_page
    page = sign_in(browser, "bob", "bob-pass-123", f"/settings/computers/{target.pk}/")
    details = page.locator("#computer-details")
    expect(details.locator("#job-shell tr[data-version]")).to_have_count(2)
    page.evaluate("window.__sameDocument = true")
    details.locator('#job-shell tr[data-version="1"]').get_by_role("link", name="View").click()

    dialog = page.locator("dialog#dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator("#dialog-title")).to_have_text("Job shell version 1")
    expect(dialog.locator('pre.job-shell-content[data-version="1"]')).to_contain_text("mmt_submit")
    expect(dialog.locator('pre.job-shell-content[data-version="1"]')).not_to_contain_text("version two")
    dialog.locator("footer button[data-close-dialog]").click()
    expect(dialog).to_be_hidden()
    # The details are still there, and the dialog shell still works for the next version.
    details.locator('#job-shell tr[data-version="2"]').get_by_role("link", name="View").click()
    expect(dialog.locator('pre.job-shell-content[data-version="2"]')).to_contain_text("# version two")
    assert page.evaluate("window.__sameDocument") is True
    assert browser.js_errors == []


def test_the_site_form_reports_every_wrong_field_in_one_save(
    transactional_db, live_server, world, chromium_page, make_site, host_keys  # noqa: F811
):
    from playwright.sync_api import expect

    make_site(world.member, name="taken-name")
    browser = chromium_page
    page = sign_in(browser, "bob", "bob-pass-123", "/settings/computers/")
    page.get_by_role("link", name="Add computer").click()
    dialog = page.locator("dialog#dialog")
    expect(dialog.locator("#dialog-title")).to_have_text("Add computer")
    dialog.get_by_label("Manual (the requester runs mado-tracking submit)").check()
    expect(dialog.locator("#id_host")).to_have_count(0)
    dialog.locator("#id_name").fill("taken-name")
    dialog.locator("#id_working_dir").fill("work/mmt")
    dialog.locator("#id_runner_api_url").fill("https://tracking.example.org")
    dialog.locator("#id_variables").fill("PARTITION gpu")
    dialog.locator("#id_queue_timeout").fill("soon")
    dialog.get_by_role("button", name="Save").click()

    def error_of(field: str):
        return dialog.locator(f"#id_{field}").locator("xpath=ancestor::div[contains(@class, 'field')][1]").locator(
            ".errors")

    expect(error_of("queue_timeout")).to_contain_text("7d, 12h, 90m")
    expect(error_of("name")).to_be_visible()
    expect(error_of("working_dir")).to_contain_text("working directory")
    expect(error_of("variables")).to_be_visible()
    assert ComputeTarget.objects.filter(name="taken-name").count() == 1
    browser.screenshot("sites-form-every-error.png")
    assert browser.js_errors == []


def test_after_saving_a_site_the_address_names_its_details_and_a_reload_keeps_them(
    transactional_db, live_server, world, chromium_page, launcher, host_keys  # noqa: F811
):
    from playwright.sync_api import expect

    browser = chromium_page
    page = sign_in(browser, "bob", "bob-pass-123", "/settings/computers/")
    page.get_by_role("link", name="Add computer").click()
    dialog = page.locator("dialog#dialog")
    dialog.locator("#id_name").fill("bobs-cluster")
    dialog.locator("#id_launcher").select_option(str(launcher.pk))
    dialog.locator("#id_host").fill(LOGIN_HOST)
    dialog.locator("#id_known_hosts").fill(host_keys.login_line + "\n")
    dialog.locator("#id_ssh_user").fill("mmtshared")
    dialog.locator("#id_working_dir").fill("/work/mmt")
    dialog.locator("#id_runner_api_url").fill("https://tracking.example.org")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    target = ComputeTarget.objects.get(name="bobs-cluster")
    details = page.locator("#computer-details")
    expect(details).to_have_attribute("data-computer-id", str(target.pk))
    expect(page).to_have_url(re.compile(rf"/settings/computers/{target.pk}/$"))
    expect(page.locator('#computer-list tr[data-computer="bobs-cluster"]')).to_be_visible()  # the list refreshed
    expect(page).to_have_url(re.compile(rf"/settings/computers/{target.pk}/$"))

    page.reload()
    expect(page.locator("#computer-details")).to_have_attribute("data-computer-id", str(target.pk))
    expect(page.locator("#computer-details h2")).to_have_text("bobs-cluster")

    # Edit site from the details: saved, the address still names them.
    page.locator("#computer-details").get_by_role("link", name="Edit site").click()
    expect(dialog.locator("#dialog-title")).to_have_text("Edit site bobs-cluster")
    dialog.locator("#id_max_active_submissions").fill("3")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    expect(page).to_have_url(re.compile(rf"/settings/computers/{target.pk}/$"))
    page.reload()
    expect(page.locator("#computer-details")).to_contain_text("bobs-cluster")
    expect(page.locator("#computer-details")).to_contain_text("3")

    # Edit site from the list, on the Computers page without details: the same.
    browser.goto("/settings/computers/")
    expect(page.locator("#computer-details")).not_to_have_attribute("data-computer-id", str(target.pk))
    page.locator('#computer-list tr[data-computer="bobs-cluster"]').get_by_role("link", name="Edit site").click()
    expect(dialog.locator("#dialog-title")).to_have_text("Edit site bobs-cluster")
    dialog.locator("#id_max_active_submissions").fill("4")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    expect(page.locator("#computer-details")).to_have_attribute("data-computer-id", str(target.pk))
    expect(page).to_have_url(re.compile(rf"/settings/computers/{target.pk}/$"))
    page.reload()
    expect(page.locator("#computer-details")).to_have_attribute("data-computer-id", str(target.pk))
    target.site_settings.refresh_from_db()
    assert target.site_settings.max_active_submissions == 4
    assert browser.js_errors == []
