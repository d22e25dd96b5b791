"""Sections that the apps above computers add to a computer's details (datasets: its dataset cache).
computers may not import them (DESIGN §2), so each registers a block here in its AppConfig.ready(): a
template and a function giving its context for one computer and user (None to show nothing)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe


@dataclass(frozen=True)
class DetailsBlock:
    template: str
    context: Callable[..., dict | None]   # context(request, target) -> dict, or None to show nothing


_blocks: dict[str, DetailsBlock] = {}


def register_details_block(name: str, *, template: str, context: Callable[..., dict | None]) -> None:
    """Add a section to the details of SSH and Local computers (after Settings). The same name again
    replaces it (ready() may run twice in tests)."""
    _blocks[name] = DetailsBlock(template, context)


def render_details_blocks(request, target) -> list[SafeString]:
    rendered = []
    for block in list(_blocks.values()):
        context = block.context(request, target)
        if context is not None:
            rendered.append(mark_safe(render_to_string(block.template, context, request=request)))
    return rendered
