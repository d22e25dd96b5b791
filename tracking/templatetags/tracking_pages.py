"""Template filters of tracking's pages."""
from datetime import datetime, timezone as dt_timezone

from django import template
from django.utils import timezone

register = template.Library()


@register.filter
def ms_datetime(value):
    """MLflow's milliseconds since the epoch as an aware datetime in the current time zone ('' for none)."""
    if value in (None, ""):
        return ""
    return timezone.localtime(datetime.fromtimestamp(int(value) / 1000, tz=dt_timezone.utc))
