"""In Chromium: a running job's page draws its Run's metric chart, which gains points as the code logs
them (HTMX polling, no reload), and stops polling once the job has ended."""
from __future__ import annotations

import os

import pytest

from tests.browser import chromium_page, sign_in  # noqa: F401  (fixture)
from tests.tracking_pages.conftest import log

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = pytest.mark.browser


def test_a_running_jobs_chart_gains_points_and_polling_stops_at_the_end(
    transactional_db, live_server, world, running_job, chromium_page  # noqa: F811
):
    from playwright.sync_api import expect

    job, item, worker = running_job
    run = job.run
    browser = chromium_page
    page = browser.page
    log(run, world.member, "loss", [1.0, 0.8])
    sign_in(browser, "carol", "carol-pass-123", next_path=f"/projects/lab/jobs/{job.pk}/")
    chart = page.locator('#run-panel figure[data-metric="loss"]')
    expect(chart).to_have_attribute("data-points", "2")
    page.evaluate("window.__sameDocument = true")  # gone if anything below reloads the page

    log(run, world.member, "loss", [0.6, 0.4, 0.2], first_step=2)
    expect(chart).to_have_attribute("data-points", "5", timeout=10_000)
    assert len(chart.locator("polyline").get_attribute("points").split()) == 5
    log(run, world.member, "accuracy", [0.7], first_step=4)
    expect(page.locator('#run-panel figure[data-metric="accuracy"]')).to_have_count(1, timeout=10_000)

    assert worker.complete(item).status_code == 200
    expect(page.locator("#run-status")).to_have_text("Finished", timeout=10_000)
    expect(page.locator("#log-poller")).to_have_attribute("data-polling", "false")
    # Polling has stopped: a point logged now (the API no longer takes the job's token, but a member's
    # notebook could still write) does not reach the page until it is reloaded.
    polls = []
    page.on("request", lambda request: "/poll" in request.url and polls.append(request.url))
    log(run, world.member, "loss", [0.1], first_step=5)
    page.wait_for_timeout(2500)  # two poll intervals: proves the absence of polls, there is no event to wait on
    assert polls == [] and chart.get_attribute("data-points") == "5"
    assert page.evaluate("window.__sameDocument") is True, "the points arrived by reloading the page"
    page.reload()
    expect(chart).to_have_attribute("data-points", "6")
    assert not browser.js_errors, browser.js_errors
