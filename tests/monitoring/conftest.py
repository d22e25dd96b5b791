"""Scraping /metrics as Prometheus would, and reading the answer with prometheus_client's own parser."""
from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mado.choices import Scope
from tests.conftest import bearer


class Scrape:
    """One parsed answer of /metrics: `value(name, **labels)` for one sample, `series(name)` for all of a
    sample name as {labels: value}."""

    def __init__(self, text: str):
        self.families = {family.name: family for family in text_string_to_metric_families(text)}
        self.samples = {}
        for family in self.families.values():
            for sample in family.samples:
                self.samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value

    def series(self, name: str) -> dict:
        return dict(self.samples.get(name, {}))

    def value(self, name: str, **labels) -> float:
        return self.samples[name][tuple(sorted(labels.items()))]


def scrape(client) -> Scrape:
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4"), response["Content-Type"]
    return Scrape(response.content.decode())


@pytest.fixture
def metrics_token(world) -> str:
    """A global administrator's own token with metrics:read, as docs/monitoring.md tells to issue."""
    return world.token(world.global_admin, [Scope.METRICS_READ])


@pytest.fixture
def metrics_client(metrics_token):
    return bearer(metrics_token)
