"""Panels that the apps above jobs add to the job page (tracking: the Job's Run). jobs may not import
them (DESIGN §2), so each registers a block here at import time of a module its AppConfig.ready() loads.

A block is a template, a function giving its context for one job, and a cheap `version(job)` stamp that
changes whenever what the block shows changes: the job page's poll (jobs.views.job_poll) renders the
blocks again, out of band (`oob` is True in their context), only when some version changed. The
template's outermost element carries a stable id so that out-of-band swap finds it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe


@dataclass(frozen=True)
class JobBlock:
    name: str
    template: str
    context: Callable[..., dict | None]   # context(request, job) -> dict, or None to show nothing
    version: Callable[..., str]            # version(job) -> str, cheap: it runs on every poll


_blocks: dict[str, JobBlock] = {}


def register_job_block(name: str, *, template: str, context: Callable[..., dict | None],
                       version: Callable[..., str]) -> None:
    """Add a block to the job page (after the built-in panels). The same name again replaces it."""
    _blocks[name] = JobBlock(name, template, context, version)


def versions(job) -> str:
    """One string that changes when any block's content does."""
    parts = []
    for block in list(_blocks.values()):
        parts.append(f"{block.name}={block.version(job)}")
    return "|".join(parts)


def render_blocks(request, job, *, oob: bool = False) -> list[SafeString]:
    rendered = []
    for block in list(_blocks.values()):
        context = block.context(request, job)
        if context is None:
            continue
        rendered.append(mark_safe(render_to_string(block.template, {**context, "oob": oob}, request=request)))
    return rendered
