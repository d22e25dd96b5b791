"""{% load check_i18n %}: the connection check's details in the reader's language (computers.check_details)."""
from __future__ import annotations

from django import template

from computers import check_details

register = template.Library()


@register.filter
def check_detail(detail) -> str:
    """A worker's English detail in the active language; text it does not know, as it came."""
    return check_details.translate(detail)
