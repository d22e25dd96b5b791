"""The Computers list in pages of 50, in real Chromium against the live server: on page 2 a global
administrator enables a computer and the list refreshes that same page, opens a row's details (the
address changes) and reloads them to find the row again, and the row's Edit computer still opens its
dialog; the pager walks back to page 1."""
from __future__ import annotations

import os

import pytest

from computers.models import ComputeTarget
from tests.browser import chromium_page, sign_in  # noqa: F401  (chromium_page: fixture)

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = pytest.mark.browser


def test_page_2_of_the_list_stays_on_page_2_through_enable_details_and_reload_in_chromium(
    transactional_db, live_server, world, chromium_page  # noqa: F811  (chromium_page)
):
    from playwright.sync_api import expect

    ComputeTarget.objects.bulk_create(
        ComputeTarget(name=f"node-{i:04d}", kind="ssh", owner=world.global_admin, visibility="public",
                      host=f"node-{i}.internal", ssh_user="mmt", ssh_key_path="/k", known_hosts_path="/kh",
                      working_dir="/data/jobs", python_path="/usr/bin/python3")
        for i in range(60))
    browser = chromium_page
    page = browser.page
    sign_in(browser, "root", "root-pass-123", next_path="/settings/computers/")
    pager = page.locator("#computer-list nav.pager")
    expect(pager).to_contain_text("Page 1 of 2")
    expect(page.locator("#computer-list tbody tr")).to_have_count(50)
    pager.get_by_role("link", name="Next").click()
    expect(pager).to_contain_text("Page 2 of 2")
    expect(page.locator("#computer-list tbody tr")).to_have_count(10)
    page.evaluate("window.__sameDocument = true")  # gone if anything below reloads the page

    row = page.locator('#computer-list tr[data-computer="node-0055"]')
    expect(row).to_contain_text("Disabled")
    row.get_by_role("button", name="Enable").click()
    expect(row).to_contain_text("Enabled")  # the list refreshed itself, on page 2
    expect(pager).to_contain_text("Page 2 of 2")
    assert ComputeTarget.objects.get(name="node-0055").enabled

    row.get_by_role("link", name="node-0055").click()
    details = page.locator("#computer-details")
    expect(details.locator("h2")).to_have_text("node-0055")
    target = ComputeTarget.objects.get(name="node-0055")
    expect(page).to_have_url(f"{live_server.url}/settings/computers/{target.pk}/")
    assert page.evaluate("window.__sameDocument") is True

    row.get_by_role("link", name="Edit computer").click()
    dialog = page.locator("dialog#dialog")
    expect(dialog).to_be_visible()
    expect(dialog.locator("#dialog-title")).to_have_text("Edit computer node-0055")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()

    page.reload()  # the details' own address: the list shows the page that holds the row
    expect(details.locator("h2")).to_have_text("node-0055")
    expect(row).to_contain_text("Enabled")
    expect(pager).to_contain_text("Page 2 of 2")
    pager.get_by_role("link", name="Previous").click()
    expect(pager).to_contain_text("Page 1 of 2")
    expect(page.locator('#computer-list tr[data-computer="node-0000"]')).to_be_visible()
    browser.screenshot("computers-list-pages.png")
    assert browser.js_errors == []
