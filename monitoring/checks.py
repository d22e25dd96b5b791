"""`manage.py check` (and every server start) refuses an address list it cannot read, so a typo is
found at deployment rather than at the first scrape."""
from __future__ import annotations

from django.core.checks import Error
from django.core.exceptions import ImproperlyConfigured

from monitoring import access


def metrics_allowed_addresses(app_configs, **kwargs):
    try:
        access.allowed_networks()
    except ImproperlyConfigured as error:
        return [Error(str(error), id="monitoring.E001")]
    return []
