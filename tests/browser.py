"""Real Chromium (Debian's package) driven by Playwright, for the dialog tests.

Import the fixtures into a test module: `from tests.browser import chromium_page  # noqa: F401`.
Playwright cannot download its own browsers on these machines, so it launches /usr/bin/chromium."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

# Playwright's sync API runs an event loop in the test thread; the ORM calls the test makes around it
# are still synchronous. The Makefile sets this too.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SCREENSHOT_DIR = Path(os.environ.get("MADO_SCREENSHOT_DIR", "/tmp"))


class BrowserPage:
    """A Playwright page plus the JavaScript errors it raised: a test ends by asserting there were none."""

    def __init__(self, page, base_url: str):
        self.page = page
        self.base_url = base_url
        self.js_errors: list[str] = []
        page.on("pageerror", lambda error: self.js_errors.append(str(error)))
        page.on("console", lambda msg: msg.type == "error" and self.js_errors.append(msg.text))

    def goto(self, path: str):
        return self.page.goto(self.base_url + path)

    def screenshot(self, name: str) -> Path:
        path = SCREENSHOT_DIR / name
        self.page.screenshot(path=str(path))
        return path


@pytest.fixture
def chromium_page(live_server):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing; `make test` installs Debian's chromium package.")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(locale="en-US", viewport={"width": 1200, "height": 800})
            page = context.new_page()
            page.set_default_timeout(5_000)
            yield BrowserPage(page, live_server.url)
        finally:
            browser.close()
            # While Playwright's event loop runs in this thread, Django keeps the ORM calls the test
            # makes on a connection of their own (per context, not per thread). Close it here, or the
            # test database cannot be dropped at the end of the run.
            from django.db import connections

            connections.close_all()


def sign_in(browser: BrowserPage, username: str, password: str, *, next_path: str = "",
            button: str = "Sign in") -> None:
    """Sign in through the login form as a person does, and wait for the page it leads to.

    `next_path` is where the form sends you afterwards (the login page's `?next=`); without it you land
    where the product sends you (the first project you can see). `button` is the form's button in the
    browser's language."""
    from playwright.sync_api import expect

    page = browser.page
    browser.goto("/login/" + (f"?next={next_path}" if next_path else ""))
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.get_by_role("button", name=button).click()
    expect(page.locator("#id_password")).to_have_count(0)  # left the login page: the password was taken
