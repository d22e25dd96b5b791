"""The computer's details page shows what a worker last reported of its dataset cache (the e2e tests
check that a worker reports it after delivering a job's inputs)."""
from __future__ import annotations

import pytest

from datasets.models import DatasetCacheReport
from tests.computer_fixtures import make_computer


@pytest.fixture
def computer(world):
    return make_computer(world.global_admin, "gpu-box", visibility="public")


def details(client, world, computer) -> str:
    client.force_login(world.global_admin)
    return client.get(f"/settings/computers/{computer.pk}/").content.decode()


def test_the_cache_block_says_nothing_was_reported_yet(client, world, computer):
    page = details(client, world, computer)
    assert "Dataset cache" in page and "Not reported yet" in page


def test_the_cache_block_shows_the_last_report(client, world, computer):
    DatasetCacheReport.objects.create(target=computer, used_bytes=3 * 2 ** 30, limit_bytes=100 * 2 ** 30,
                                      version_count=2, pinned_count=1, worker_id="lab-worker-1")
    page = details(client, world, computer)
    block = page[page.index('id="dataset-cache"'):]
    block = block[:block.index("</dl>")]
    assert "3.0\xa0GB of 100.0\xa0GB" in block
    assert "2 versions, 1 in use by queued or running jobs" in block
    assert "by worker lab-worker-1" in block
