"""Computer kinds that a higher app brings (the sites app registers Type Site in its
`AppConfig.ready()`): how computers' services and pages treat a computer of that kind, without
computers importing the app (DESIGN §2: a lower app learns about a higher one only by registration).

A kind with no registration is one of computers' own (SSH, Local)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class KindHandlers:
    # update(actor, target, changes) -> ComputeTarget: PATCH /api/computers/{id}, Enable/Disable in the
    # list and in the operator's console all change the computer through it.
    update: Callable
    # add_view(request) -> HttpResponse: Add computer with this Type.
    add_view: Callable
    # details_context(request, target, **extra) -> dict: what the computer's details page shows.
    details_context: Callable
    # checks(target) -> QuerySet: the kind's own connection checks of the computer, which
    # GET /api/computers/{id}/checks/{check} reads by id. None: only workers' checks.
    checks: Callable | None = None


_registered: dict[str, KindHandlers] = {}


def register(kind: str, handlers: KindHandlers) -> None:
    _registered[kind] = handlers


def handlers_for(kind: str) -> KindHandlers | None:
    return _registered.get(kind)


def checks_of(target):
    """A computer's connection checks: its kind's own (a site's launcher checks), else the workers'."""
    handlers = handlers_for(target.kind)
    if handlers is not None and handlers.checks is not None:
        return handlers.checks(target)
    return target.checks.select_related("requested_worker", "claimed_by")
