"""What Chromium shows of scripts, commands and a scheduler's error (issue 15, items 12 and 13): the job
shell editor, the manual-submission commands, the New job form's command, requirements and parameters,
and the job page's command and requirements in a monospace font that is really drawn with equal-width
characters; a failed site Job's Error block with the scheduler's lines as lines."""
from __future__ import annotations

import os

import pytest

from jobs import services
from mado.services import Actor
from tests.browser import chromium_page  # noqa: F401  (fixture)
from tests.job_fixtures import job_request
from tests.test_job_page_wording import SCHEDULER_ERROR, failed_site_job, host_keys, manual_pc  # noqa: F401

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = pytest.mark.browser

# How the element's text is drawn: its computed font family, and whether "iiiiiiii" and "WWWWWWWW" take
# the same width in its computed font (only in a monospace font).
DRAWN_FONT = """el => {
  const style = getComputedStyle(el);
  const ctx = document.createElement("canvas").getContext("2d");
  ctx.font = `${style.fontStyle} ${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
  return {family: style.fontFamily,
          equalWidths: Math.abs(ctx.measureText("iiiiiiii").width - ctx.measureText("WWWWWWWW").width) < 0.5};
}"""


def sign_in(browser, username: str, password: str) -> None:
    from playwright.sync_api import expect

    page = browser.page
    browser.goto("/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#id_password")).to_have_count(0)


def assert_monospace(page, selector: str) -> None:
    from playwright.sync_api import expect

    element = page.locator(selector).first
    expect(element).to_be_attached()
    drawn = element.evaluate(DRAWN_FONT)
    assert drawn["family"].rstrip().endswith("monospace") and drawn["equalWidths"], (selector, drawn)


def test_scripts_and_commands_are_drawn_in_a_monospace_font_in_chromium(
    transactional_db, live_server, world, chromium_page, gpu_box, manual_pc  # noqa: F811
):
    browser = chromium_page
    page = browser.page
    job = services.create_job(Actor(world.member), world.project,
                              job_request(gpu_box, command=["python", "-c", "print('hi')"], requirements="torch"))
    sign_in(browser, "bob", "bob-pass-123")

    # bob's own manual site: its job shell editor and the commands to submit by hand.
    browser.goto(f"/settings/computers/{manual_pc.pk}/")
    assert_monospace(page, "#id_job_shell_content")
    assert_monospace(page, "#manual-submission pre")

    browser.goto("/projects/lab/jobs/new")
    for field in ("#id_command", "#id_requirements", "#id_parameters"):
        assert_monospace(page, field)

    browser.goto(f"/projects/lab/jobs/{job.pk}/")
    assert_monospace(page, "#job-command")
    assert page.locator("#job-command").inner_text() == """python -c "print('hi')\""""
    assert_monospace(page, "#job-summary pre.requirements")
    assert not browser.js_errors, browser.js_errors


def test_a_failed_site_jobs_error_keeps_the_schedulers_lines_in_chromium(
    transactional_db, live_server, world, chromium_page, manual_pc  # noqa: F811
):
    from playwright.sync_api import expect

    job = failed_site_job(world, manual_pc)
    browser = chromium_page
    page = browser.page
    sign_in(browser, "bob", "bob-pass-123")
    browser.goto(f"/projects/lab/jobs/{job.pk}/")
    error = page.locator("#job-error")
    expect(error).to_be_visible()
    # innerText follows the CSS: with the line breaks collapsed it would read as one line.
    assert error.inner_text().splitlines() == SCHEDULER_ERROR.splitlines()
    # The timeline's Failed line quotes the same lines.
    assert page.locator("#job-timeline .event-failed .event-detail").inner_text().splitlines() == \
        SCHEDULER_ERROR.splitlines()
    expect(page.locator("#job-claimer")).to_have_text("bob with mado-tracking submit")
    expect(page.locator("#job-timeline")).to_contain_text("Claimed by bob with mado-tracking submit")
    browser.screenshot("job-page-failed-site-job.png")

    # In Japanese (the top bar's language menu sets Django's language cookie): one language per line.
    page.context.add_cookies([{"name": "django_language", "value": "ja", "url": live_server.url}])
    browser.goto(f"/projects/lab/jobs/{job.pk}/")
    expect(page.locator("#job-claimer")).to_have_text("bobのmado-tracking submit")
    expect(page.locator("#job-timeline .event-failed .event-text")).to_have_text("失敗")
    expect(page.locator("#job-status .status")).to_have_text("失敗")
    expect(page.locator(".crumbs")).to_contain_text("Jobs")
    browser.screenshot("job-page-failed-site-job-ja.png")
    assert not browser.js_errors, browser.js_errors


def test_the_run_panel_draws_each_series_once_and_follows_the_running_job_in_chromium(
    transactional_db, live_server, world, chromium_page, gpu_box, job_worker  # noqa: F811
):
    """Issue 16: the Job's Run panel replaces jobs' own Metrics panel (the same series were drawn twice);
    its chart still follows the running Job through the page's poll, which stops once the Job has ended."""
    from playwright.sync_api import expect

    browser = chromium_page
    page = browser.page
    job = services.create_job(Actor(world.member), world.project, job_request(gpu_box, name="live-chart"))
    item = job_worker.claim()
    assert job_worker.heartbeat(item, "running").status_code == 200
    points = [{"name": "loss", "value": 1.0, "step": 0}, {"name": "loss", "value": 0.5, "step": 1}]
    assert job_worker.leased(item, "metrics", metrics=points).status_code == 200
    sign_in(browser, "bob", "bob-pass-123")
    browser.goto(f"/projects/lab/jobs/{job.pk}/")
    page.evaluate("window.__sameDocument = true")  # gone if anything below reloads the page
    chart = page.locator('#run-panel figure[data-metric="loss"]')
    expect(chart).to_have_attribute("data-points", "2")
    expect(page.locator('figure[data-metric="loss"]')).to_have_count(1)  # drawn once
    expect(page.locator("#job-metrics")).to_have_count(0)

    assert job_worker.leased(item, "metrics", metrics=[{"name": "loss", "value": 0.25, "step": 2}]).status_code == 200
    expect(chart).to_have_attribute("data-points", "3")
    expect(chart.locator("figcaption")).to_contain_text("last 0.25 at step 2")
    assert job_worker.complete(item).status_code == 200
    expect(page.locator("#run-status")).to_have_text("Finished")
    expect(page.locator("#log-poller")).to_have_attribute("data-polling", "false")
    expect(page.locator('figure[data-metric="loss"]')).to_have_count(1)
    assert page.evaluate("window.__sameDocument") is True, "the chart followed the Job by reloading the page"
    assert not browser.js_errors, browser.js_errors
