"""Project settings → Members and Global administration → Users in real Chromium against the live server:
a project admin adds an existing user, changes the role, is told why the last admin cannot be removed,
and removes someone, all in dialogs without reloading the page; a global administrator creates a user
with a one-time link, and that person sets a password with it and signs in."""
from __future__ import annotations

import os

import pytest

from mado.models import AuditEvent, Membership
from tests.browser import chromium_page  # noqa: F401  (fixture)

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = pytest.mark.browser


def sign_in(browser, username: str, password: str, next_path: str = ""):
    browser.goto(f"/login/?next={next_path}" if next_path else "/login/")
    browser.page.fill("#id_username", username)
    browser.page.fill("#id_password", password)
    browser.page.get_by_role("button", name="Sign in").click()


def test_a_project_admin_manages_members_in_dialogs_in_chromium(
    transactional_db, live_server, world, chromium_page  # noqa: F811
):
    browser = chromium_page
    page = browser.page
    from playwright.sync_api import expect

    sign_in(browser, "alice", "alice-pass-123")
    expect(page.locator("h1")).to_have_text("Lab")
    page.locator("nav.tabs").get_by_role("link", name="Members").click()
    expect(page.locator("h1")).to_have_text("Members")
    page.evaluate("window.__sameDocument = true")  # gone if anything below reloads the page
    dialog = page.locator("dialog#dialog")

    # Add member: a name that does not exist is refused in the dialog; then mallory as Viewer.
    page.get_by_role("link", name="Add member").click()
    expect(dialog.locator("#dialog-title")).to_have_text("Add member")
    dialog.locator("#id_username").fill("malory")
    dialog.get_by_role("button", name="Add", exact=True).click()
    expect(dialog.locator(".field.invalid")).to_contain_text("No user named malory")
    dialog.locator("#id_username").fill("mallory")
    dialog.locator("#id_role").select_option(label="Viewer")
    dialog.get_by_role("button", name="Add", exact=True).click()
    expect(dialog).to_be_hidden()
    row = page.locator('tr[data-member="mallory"]')
    expect(row).to_contain_text("Viewer")

    # Change role.
    row.get_by_role("link", name="Change role").click()
    expect(dialog.locator("#dialog-title")).to_have_text("Change role")
    dialog.locator("#id_role").select_option(label="Member")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog).to_be_hidden()
    expect(row).to_contain_text("Member")

    # The last admin: the dialog says why and offers nothing to press but Close.
    page.locator('tr[data-member="alice"]').get_by_role("link", name="Remove").click()
    expect(dialog.get_by_role("alert")).to_contain_text("alice is the last admin of Lab and cannot be removed")
    expect(dialog.get_by_role("button", name="Remove")).to_have_count(0)
    browser.screenshot("mado-members-last-admin.png")
    dialog.get_by_role("button", name="Close").last.click()
    expect(dialog).to_be_hidden()

    # Remove mallory.
    row.get_by_role("link", name="Remove").click()
    expect(dialog).to_contain_text("Remove mallory from Lab?")
    dialog.get_by_role("button", name="Remove").click()
    expect(dialog).to_be_hidden()
    expect(page.locator('tr[data-member="mallory"]')).to_have_count(0)

    assert page.evaluate("window.__sameDocument") is True, "the list refreshed by reloading the page"
    assert not Membership.objects.filter(project=world.project, user=world.outsider).exists()
    assert Membership.objects.get(project=world.project, user=world.project_admin).role == "admin"
    assert list(AuditEvent.objects.filter(action__startswith="membership.").order_by("id")
                .values_list("action", flat=True)) == ["membership.create", "membership.update", "membership.delete"]
    assert browser.js_errors == []


def test_a_global_administrator_creates_a_user_who_sets_a_password_with_the_link_in_chromium(
    transactional_db, live_server, world, chromium_page  # noqa: F811
):
    browser = chromium_page
    page = browser.page
    from playwright.sync_api import expect

    sign_in(browser, "root", "root-pass-123", "/settings/")
    expect(page.locator("h1")).to_have_text("Global settings")
    # Your projects: a global administrator is Admin of every project without memberships.
    expect(page.locator('tr[data-project="lab"]')).to_contain_text("Admin")
    page.locator("section").get_by_role("link", name="Users", exact=True).click()
    expect(page.locator("h1")).to_have_text("Users")

    dialog = page.locator("dialog#dialog")
    page.get_by_role("link", name="Create user").click()
    expect(dialog.locator("#dialog-title")).to_have_text("Create user")
    dialog.locator("#id_username").fill("dave")
    dialog.locator("#id_email").fill("dave@example.org")
    dialog.get_by_label("A one-time link where the user sets a password").check()
    dialog.get_by_role("button", name="Create", exact=True).click()
    link = dialog.locator("#set-password-link")
    expect(link).to_be_visible()
    url = link.inner_text().strip()
    assert "/set-password/" in url
    dialog.get_by_role("button", name="Done").click()
    expect(dialog).to_be_hidden()
    expect(page.locator('tr[data-user="dave"]')).to_contain_text("Waiting to set a password")
    assert url not in page.content()

    # Dave opens the link (signed out), sets a password and signs in with it.
    page.context.clear_cookies()
    browser.goto("/" + url.split("/", 3)[3])
    expect(page.locator("h1")).to_have_text("Set your password")
    page.fill("#id_new_password1", "correct-horse-battery")
    page.fill("#id_new_password2", "correct-horse-battery")
    page.get_by_role("button", name="Set password").click()
    expect(page.locator(".messages")).to_contain_text("Your password is set")
    page.fill("#id_username", "dave")
    page.fill("#id_password", "correct-horse-battery")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("h1")).to_have_text("Welcome")
    assert browser.js_errors == []
