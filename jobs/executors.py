"""Executors of the computer kinds that a higher app brings (the sites app registers Type Site in its
`AppConfig.ready()`): what creating, stopping and describing a Job on such a computer adds, without jobs
importing the app (DESIGN §2). Computers of jobs' own kinds (SSH, Local) run through the worker
channel and register nothing."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Executor:
    # validate(user, target, values, errors): refuse with ServiceError, or add field errors / set
    # values (such as the initial status) for a Job about to be created on `target`.
    validate: Callable
    # created(job): after the Job is committed (wake whoever submits it).
    created: Callable
    # stop(actor, job): a stop of a started Job of this kind, with the Job row locked.
    stop: Callable
    # summary(job, user) -> dict | None: what GET /api/jobs/{id} shows as `submission`.
    summary: Callable
    # The pages. manual_instructions(request, target, project) -> dict | None: how Jobs on `target` get
    # submitted when their requester does it (None when nobody has to). submitter(job) -> str | None: who
    # took the Job to run, in words. error_for(user, job) -> str: the Job's error as `user` may read it.
    manual_instructions: Callable
    submitter: Callable
    error_for: Callable


_registered: dict[str, Executor] = {}


def register(kind: str, executor: Executor) -> None:
    _registered[kind] = executor


def executor_for(kind: str | None) -> Executor | None:
    return _registered.get(kind) if kind else None
