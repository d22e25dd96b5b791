"""`{% agent_wheel_url base_url %}`: the URL `pip install` takes for the agent this server offers, for the
blocks that show install commands (a computer's Worker settings, the manual-submission instructions)."""
from django import template

from mado import downloads

register = template.Library()


@register.simple_tag
def agent_wheel_url(base_url: str) -> str:
    return downloads.wheel_url(base_url)
