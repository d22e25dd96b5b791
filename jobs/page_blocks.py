"""Panels that the apps above jobs add to the job page (tracking: the Job's Run). jobs may not import
them (DESIGN §2), so each registers a block here at import time of a module its AppConfig.ready() loads.

A block is a template, a function giving its context for one job, and a cheap `version(job)` stamp that
changes whenever what the block shows changes: the job page's poll (jobs.views.job_poll) renders the
blocks again, out of band (`oob` is True in their context), only when some version changed. The
template's outermost element carries a stable id so that out-of-band swap finds it.

A block may replace built-in panels of the job page (`replaces`, names from BUILT_IN_PANELS): the page then
leaves those panels out whenever the block shows (its context is not None), so the same thing is not shown
twice (tracking's Run panel draws the Job's metric series, which jobs' Metrics panel drew too)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe


BUILT_IN_PANELS = ("metrics",)  # the job page's own panels that a block may replace


@dataclass(frozen=True)
class JobBlock:
    name: str
    template: str
    context: Callable[..., dict | None]   # context(request, job) -> dict, or None to show nothing
    version: Callable[..., str]            # version(job) -> str, cheap: it runs on every poll
    replaces: tuple[str, ...] = ()         # built-in panels hidden while this block shows


@dataclass(frozen=True)
class RenderedBlocks:
    html: list[SafeString]
    replaced: frozenset[str]   # built-in panels the shown blocks replace

    def shows(self, panel: str) -> bool:
        """Whether the job page shows its built-in `panel` (no shown block replaces it)."""
        return panel not in self.replaced


_blocks: dict[str, JobBlock] = {}


def register_job_block(name: str, *, template: str, context: Callable[..., dict | None],
                       version: Callable[..., str], replaces: tuple[str, ...] = ()) -> None:
    """Add a block to the job page (after the built-in panels). The same name again replaces it."""
    unknown = sorted(set(replaces) - set(BUILT_IN_PANELS))
    if unknown:
        raise ValueError(f"Job block {name} replaces unknown panels {unknown}; the job page's own panels are "
                         f"{list(BUILT_IN_PANELS)}.")
    _blocks[name] = JobBlock(name, template, context, version, tuple(replaces))


def versions(job) -> str:
    """One string that changes when any block's content does."""
    parts = []
    for block in list(_blocks.values()):
        parts.append(f"{block.name}={block.version(job)}")
    return "|".join(parts)


def render_blocks(request, job, *, oob: bool = False) -> RenderedBlocks:
    rendered, replaced = [], set()
    for block in list(_blocks.values()):
        context = block.context(request, job)
        if context is None:
            continue
        rendered.append(mark_safe(render_to_string(block.template, {**context, "oob": oob}, request=request)))
        replaced.update(block.replaces)
    return RenderedBlocks(rendered, frozenset(replaced))
