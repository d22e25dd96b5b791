"""Project settings → Notifications in real Chromium against the live server: add a webhook rule through
the dialog, read its secret once, Send test, see the delivery in the log; the receiver verifies the
signature with that secret."""
from __future__ import annotations

import os

import pytest

from notifications.models import Delivery, NotificationRule
from tests.browser import chromium_page, sign_in  # noqa: F401  (fixture)

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = pytest.mark.browser


def test_a_project_admin_adds_a_webhook_rule_sends_a_test_and_sees_the_delivery_log(
        transactional_db, live_server, world, chromium_page, receiver):  # noqa: F811
    from playwright.sync_api import expect

    hook = receiver()
    browser = chromium_page
    page = browser.page
    sign_in(browser, "alice", "alice-pass-123")
    expect(page.locator("h1")).to_have_text("Lab")

    browser.goto("/projects/lab/settings/tokens/")
    page.locator("nav.tabs").get_by_role("link", name="Notifications").click()
    expect(page.locator("h1")).to_have_text("Notifications")

    dialog = page.locator("dialog#dialog")
    page.get_by_role("link", name="Add rule").click()
    expect(dialog).to_be_visible()
    expect(dialog.locator("#dialog-title")).to_have_text("Add notification rule")
    dialog.locator("#id_name").fill("CI hook")
    dialog.locator('input[name="events"][value="job.failed"]').check()
    dialog.locator('input[name="channel"][value="webhook"]').check()
    dialog.locator("#id_webhook_url").fill("ftp://example.org/hook")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog.locator(".field.invalid")).to_contain_text("http")  # said on the field, dialog still open
    dialog.locator("#id_webhook_url").fill(hook.url)
    dialog.get_by_role("button", name="Save").click()
    secret = dialog.locator("#rule-secret")
    expect(secret).to_be_visible()
    hook.secret = secret.inner_text().strip()
    assert hook.secret == NotificationRule.objects.get(name="CI hook").secret
    expect(page.locator('tr[data-rule="CI hook"]')).to_be_visible()  # the list behind refreshed
    browser.screenshot("mado-notification-rule-created.png")

    dialog.get_by_role("link", name="Open the rule").click()
    expect(page.locator("h1")).to_have_text("CI hook")
    page.get_by_role("button", name="Send test").click()
    row = page.locator("#delivery-log tr[data-delivery]").first
    expect(row).to_have_attribute("data-status", "delivered")
    expect(row).to_contain_text("test")
    browser.screenshot("mado-notification-delivery-log.png")

    assert len(hook.accepted) == 1 and hook.bad_signatures == 0
    assert hook.accepted[0]["event"] == "test" and hook.accepted[0]["rule"] == "CI hook"
    assert Delivery.objects.get().status == "delivered"
    assert not browser.js_errors, browser.js_errors
