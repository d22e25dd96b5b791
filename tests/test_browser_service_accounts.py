"""The Service Accounts dialogs in real Chromium against the live server: create an account, issue a
token through the dialog, see it once, and never again after a reload."""
from __future__ import annotations

import os
import re
import time

import pytest
import requests

from mado.models import ApiToken, ServiceAccount
from tests.browser import chromium_page, sign_in  # noqa: F401  (fixture)

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = pytest.mark.browser


def test_a_project_admin_creates_a_service_account_and_sees_its_token_once_in_chromium(
    transactional_db, live_server, world, chromium_page  # noqa: F811
):
    started = time.monotonic()
    browser = chromium_page
    page = browser.page
    from playwright.sync_api import expect

    # Sign in through the login form.
    sign_in(browser, "alice", "alice-pass-123")
    expect(page.locator("h1")).to_have_text("Lab")

    # Project settings → Service Accounts.
    page.locator("nav.tabs").get_by_role("link", name="Service Accounts").click()
    expect(page.locator("h1")).to_have_text("Service Accounts")
    page.evaluate("window.__sameDocument = true")  # gone if anything below reloads the page

    # Create Service Account dialog.
    dialog = page.locator("dialog#dialog")
    page.get_by_role("button", name="Create Service Account").or_(
        page.get_by_role("link", name="Create Service Account")).click()
    expect(dialog).to_be_visible()
    expect(dialog.locator("#dialog-title")).to_have_text("Create Service Account")
    dialog.locator("#id_name").fill("GPU-host-1-worker")  # taken, in another case: the dialog says so
    dialog.get_by_role("button", name="Save").click()
    expect(dialog.locator(".field.invalid")).to_contain_text("already exists")
    expect(dialog).to_be_visible()
    dialog.locator("#id_name").fill("ci-worker")
    dialog.locator("#id_role").select_option(label="Admin")
    browser.screenshot("mado-create-dialog.png")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    row = page.locator('tr[data-service-account="ci-worker"]')
    expect(row).to_be_visible()
    expect(row).to_contain_text("Admin")
    assert page.evaluate("window.__sameDocument") is True, "the list refreshed by reloading the page"
    assert ServiceAccount.objects.get(name="ci-worker").role == "admin"

    # Issue API token dialog: tick read and worker:execute, issue, read the token once.
    row.get_by_role("link", name="Issue API token").or_(row.get_by_role("button", name="Issue API token")).click()
    expect(dialog).to_be_visible()
    expect(dialog.locator("#dialog-title")).to_have_text("Issue API token")
    dialog.locator('input[name="scopes"][value="read"]').check()
    dialog.locator('input[name="scopes"][value="worker:execute"]').check()
    browser.screenshot("mado-token-form.png")
    dialog.get_by_role("button", name="Issue", exact=True).click()
    issued = dialog.locator("#issued-token")
    expect(issued).to_be_visible()
    plaintext = issued.inner_text().strip()
    assert re.fullmatch(r"mmt_[A-Za-z0-9_-]{43}", plaintext), plaintext
    shot = browser.screenshot("mado-token-dialog.png")
    assert shot.stat().st_size > 5_000

    # Connection: close, so no keep-alive server thread holds a database connection after the test.
    answer = requests.get(f"{live_server.url}/api/auth/token", timeout=5,
                          headers={"Authorization": f"Bearer {plaintext}", "Connection": "close"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["kind"] == "service"
    assert answer.json()["scopes"] == ["read", "worker:execute"]
    expect(row.locator("td").nth(3)).to_have_text("1")  # the list counted the new token without a reload

    # Close the dialog: the token leaves the page at once; a reload does not bring it back.
    dialog.get_by_role("button", name="Done").click()
    expect(dialog).to_be_hidden()
    assert plaintext not in page.content()
    page.reload()
    expect(page.locator('tr[data-service-account="ci-worker"]')).to_be_visible()
    assert plaintext not in page.content()

    # Project tokens shows the token by its prefix only.
    page.locator("nav.tabs").get_by_role("link", name="Project tokens").click()
    expect(page.locator("h1")).to_have_text("Project tokens")
    prefix = plaintext[:12]
    token_row = page.locator(f'tr[data-token-prefix="{prefix}"]')
    expect(token_row).to_be_visible()
    expect(token_row).to_contain_text("ci-worker")
    assert plaintext not in page.content()
    assert ApiToken.objects.get(prefix=prefix).user.service_account.name == "ci-worker"

    # Revoke asks first, then swaps the row in place; the token stops working.
    page.once("dialog", lambda confirm: confirm.accept())
    token_row.get_by_role("button", name="Revoke").click()
    expect(token_row).to_contain_text("Revoked")
    expect(token_row.get_by_role("button", name="Revoke")).to_have_count(0)
    answer = requests.get(f"{live_server.url}/api/auth/token", timeout=5,
                          headers={"Authorization": f"Bearer {plaintext}", "Connection": "close"})
    assert answer.status_code == 401 and "revoked" in answer.json()["error"]

    assert browser.js_errors == []
    assert time.monotonic() - started < 20


def test_the_dialogs_also_work_as_whole_pages_in_chromium(
    transactional_db, live_server, world, chromium_page  # noqa: F811
):
    """Opening a dialog's address directly (a new tab, no HTMX request) gives a whole page whose
    form posts normally and leads back to the list."""
    browser = chromium_page
    page = browser.page
    from playwright.sync_api import expect

    sign_in(browser, "alice", "alice-pass-123", next_path="/projects/lab/settings/service-accounts/new")
    expect(page.locator("#dialog-title")).to_have_text("Create Service Account")
    page.locator("#id_name").fill("tab-worker")
    page.get_by_role("button", name="Save").click()
    expect(page).to_have_url(f"{live_server.url}/projects/lab/settings/service-accounts/")
    account = ServiceAccount.objects.get(name="tab-worker")

    browser.goto(f"/projects/lab/settings/service-accounts/{account.pk}/tokens/new")
    page.get_by_role("button", name="Issue", exact=True).click()
    plaintext = page.locator("#issued-token").inner_text().strip()
    assert plaintext.startswith("mmt_")
    page.get_by_role("link", name="Done").click()
    expect(page).to_have_url(f"{live_server.url}/projects/lab/settings/service-accounts/")
    expect(page.locator('tr[data-service-account="tab-worker"] td').nth(3)).to_have_text("1")
    assert plaintext not in page.content()
    assert browser.js_errors == []


def test_a_failing_dialog_request_says_so_and_a_lost_session_leads_to_the_login_page(
    transactional_db, live_server, world, chromium_page  # noqa: F811
):
    browser = chromium_page
    page = browser.page
    from playwright.sync_api import expect

    from mado.models import Membership

    sign_in(browser, "alice", "alice-pass-123", next_path="/projects/lab/settings/service-accounts/")
    expect(page.locator("h1")).to_have_text("Service Accounts")

    # Alice stops being a project admin while the page is open: the dialog says the request failed.
    Membership.objects.filter(user=world.project_admin).update(role="member")
    page.get_by_role("link", name="Create Service Account").click()
    dialog = page.locator("dialog#dialog")
    expect(dialog).to_be_visible()
    expect(dialog.get_by_role("alert")).to_contain_text("403")
    dialog.get_by_role("button", name="Close").click()
    expect(dialog).to_be_hidden()

    # Signed out elsewhere: the next dialog request goes to the login page as a whole page.
    Membership.objects.filter(user=world.project_admin).update(role="admin")
    page.context.clear_cookies()
    page.get_by_role("link", name="Create Service Account").click()
    expect(page).to_have_url(re.compile(r"/login/\?next="))
    expect(page.locator("#id_username")).to_be_visible()
    assert [e for e in browser.js_errors if "403" not in e] == []
