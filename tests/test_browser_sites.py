"""Add computer with Type Site in real Chromium against the live server: a researcher adds a manual
site (the launcher's fields go away when Manual is chosen) and sees its details with the commands to
submit; a global administrator chooses Site in Type, adds an automatic Slurm site with pasted
known_hosts and checks the fingerprint shown against the one ssh-keygen printed."""
from __future__ import annotations

import os

import pytest

from computers.models import ComputeTarget
from tests.browser import chromium_page  # noqa: F401  (fixture)
from tests.sites import conftest as site_fixtures
from tests.sites.conftest import LOGIN_HOST

host_keys, launcher = site_fixtures.host_keys, site_fixtures.launcher  # fixtures of tests/sites

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = pytest.mark.browser


def sign_in_and_open_add(browser, username: str, password: str):
    from playwright.sync_api import expect

    page = browser.page
    browser.goto("/login/?next=/settings/computers/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("h1")).to_have_text("Computers")
    page.evaluate("window.__sameDocument = true")  # gone if anything below reloads the page
    page.get_by_role("link", name="Add computer").click()
    dialog = page.locator("dialog#dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator("#dialog-title")).to_have_text("Add computer")
    return page, dialog


def test_a_researcher_adds_a_manual_site_and_sees_its_details_in_chromium(
    transactional_db, live_server, world, chromium_page, launcher  # noqa: F811  (chromium_page)
):
    from playwright.sync_api import expect

    browser = chromium_page
    page, dialog = sign_in_and_open_add(browser, "bob", "bob-pass-123")
    expect(dialog.locator("#id_kind")).to_have_count(0)  # researchers: the site form only
    expect(dialog.locator("#id_visibility")).to_have_value("private")  # Private by default
    expect(dialog.locator("#id_host")).to_be_visible()  # Automatic first
    dialog.locator("#id_name").fill("bobs-pc")
    dialog.get_by_label("Manual (the requester runs mado-tracking submit)").check()
    expect(dialog.locator("#id_host")).to_have_count(0)
    expect(dialog.locator("#id_known_hosts")).to_have_count(0)
    expect(dialog.locator("#id_name")).to_have_value("bobs-pc")  # the re-drawn form keeps what was typed
    dialog.locator("#id_working_dir").fill("/home/bob/mmt")
    dialog.locator("#id_runner_api_url").fill("https://tracking.example.org")
    dialog.locator("#id_template").select_option("docker_host")
    browser.screenshot("sites-add-manual.png")
    dialog.get_by_role("button", name="Save").click()

    expect(dialog).to_be_hidden()
    target = ComputeTarget.objects.get(name="bobs-pc")
    details = page.locator("#computer-details")
    expect(details).to_have_attribute("data-computer-id", str(target.pk))
    expect(details.locator("h2")).to_have_text("bobs-pc")
    expect(details.locator("#manual-submission")).to_contain_text(f"mado-tracking submit --site {target.pk} --dry-run")
    expect(details.locator("#manual-submission")).to_contain_text(f"export MMT_API_URL={live_server.url}")
    first_time = details.locator("details.first-time")
    expect(first_time.locator("pre").first).to_be_hidden()
    first_time.locator("summary").click()
    expect(first_time).to_contain_text(f"pip install {live_server.url}/downloads/mado_tracking-")
    expect(details.locator("#job-shell tr[data-version]")).to_have_count(1)
    expect(page.locator('#computer-list tr[data-computer="bobs-pc"]')).to_contain_text("bob")
    assert (target.owner, target.visibility, target.site_settings.submission) == (world.member, "private", "manual")
    assert page.evaluate("window.__sameDocument") is True
    browser.screenshot("sites-manual-details.png")
    assert browser.js_errors == []


def test_a_global_admin_adds_an_automatic_slurm_site_and_checks_the_fingerprint_in_chromium(
    transactional_db, live_server, world, chromium_page, launcher, host_keys  # noqa: F811
):
    from playwright.sync_api import expect

    browser = chromium_page
    page, dialog = sign_in_and_open_add(browser, "root", "root-pass-123")
    expect(dialog.locator("#id_ssh_key_path")).to_be_visible()  # SSH first
    dialog.locator("#id_name").fill("hpc-cluster")
    dialog.locator("#id_kind").select_option("site")
    expect(dialog.locator("#id_known_hosts")).to_be_visible()
    expect(dialog.locator("#id_ssh_key_path")).to_have_count(0)
    expect(dialog.locator("#id_name")).to_have_value("hpc-cluster")
    dialog.locator("#id_launcher").select_option(str(launcher.pk))
    dialog.locator("#id_host").fill(LOGIN_HOST)
    dialog.locator("#id_known_hosts").fill(host_keys.login_line + "\n")
    fingerprints = dialog.locator("#known-hosts-fingerprints")
    expect(fingerprints).to_contain_text(host_keys.login_fingerprint)
    browser.screenshot("sites-add-fingerprint.png")
    dialog.locator("#id_ssh_user").fill("mmtshared")
    dialog.locator("#id_working_dir").fill("/work/mmt")
    dialog.locator("#id_runner_api_url").fill("https://tracking.example.org")
    dialog.locator("#id_variables").fill("PARTITION=gpu")
    dialog.locator("#id_template").select_option("slurm")

    # A bad value is refused under its field, and what was typed stays.
    dialog.locator("#id_port").fill("70000")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog.locator('[data-field="port"], .port').locator(".errors")).to_contain_text(
        "Port must be between 1 and 65535.")
    expect(dialog.locator("#id_known_hosts")).to_have_value(host_keys.login_line + "\n")
    expect(dialog.locator("#known-hosts-fingerprints")).to_contain_text(host_keys.login_fingerprint)
    dialog.locator("#id_port").fill("22")
    dialog.get_by_role("button", name="Save").click()

    expect(dialog).to_be_hidden()
    target = ComputeTarget.objects.get(name="hpc-cluster")
    details = page.locator("#computer-details")
    expect(details).to_have_attribute("data-computer-id", str(target.pk))
    expect(details.locator(".connection-details")).to_contain_text(host_keys.login_fingerprint)
    expect(details.locator("#site-keys")).to_contain_text("The launcher has not published a key for this site yet")
    expect(details.locator("#id_job_shell_content")).to_have_value(target.job_shells.get().content)
    site = target.site_settings
    assert (site.launcher, site.host, site.ssh_user, site.variables) == (launcher, LOGIN_HOST, "mmtshared",
                                                                          {"PARTITION": "gpu"})
    assert page.evaluate("window.__sameDocument") is True
    browser.screenshot("sites-automatic-details.png")
    assert browser.js_errors == []
