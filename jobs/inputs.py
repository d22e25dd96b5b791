"""Job inputs: what a Job reads besides its source (`input_datasets`, dataset versions). jobs may not import
the app that stores them (DESIGN §2), so that app registers one provider here in its AppConfig.ready()
(datasets). Without a provider jobs works with no inputs: bodies and claims carry an empty list, the form
offers nothing, and a create request that names inputs is refused on its `input_datasets` field.

The provider's functions:
  clean(user, project, raw) -> value   the inputs a new job reads, from the request's `input_datasets`;
                                       raises ServiceError (with fields) to refuse them
  attach(job, value)                   records them, inside the job's creation transaction
  summary(job) -> list                 the job body's `input_datasets`
  claim_payload(job) -> list           the claim's `input_datasets` (what a worker fetches)
  page_versions(job) -> list           the job page's Inputs panel
  choices(user, project) -> list       the New job form's picker: (value, label) pairs
  prefetch: str                        what a list of jobs prefetches so that summary() costs no query a job;
                                       its first part is the relation from Job to its inputs (any_of_job)
  max_count: int                       how many inputs a job may read (the API schema's maxItems)"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from django.db.models import Exists, Value
from django.utils.translation import gettext as _

from jobs.models import Job
from mado.errors import ServiceError

FIELD = "input_datasets"


@dataclass(frozen=True)
class InputsProvider:
    clean: Callable[..., object]
    attach: Callable[..., object]
    summary: Callable[..., list]
    claim_payload: Callable[..., list]
    page_versions: Callable[..., list]
    choices: Callable[..., list]
    prefetch: str
    max_count: int


_provider: InputsProvider | None = None


def register_provider(provider: InputsProvider) -> None:
    """Set the provider of job inputs. Registering again replaces it (ready() may run twice in tests)."""
    global _provider
    _provider = provider


def clean(user, project, raw, errors: dict) -> object:
    """The inputs a new job reads, or an empty list; a refusal goes into `errors` (reported together
    with the other fields' errors)."""
    if _provider is None:
        if raw not in (None, "", []):
            errors[FIELD] = [_("This server keeps no datasets: leave input_datasets out.")]
        return []
    try:
        return _provider.clean(user, project, raw)
    except ServiceError as error:
        errors.update(error.fields or {FIELD: [error.message]})
        return []


def attach(job, value) -> None:
    if _provider is not None and value:
        _provider.attach(job, value)


def summary(job) -> list:
    return _provider.summary(job) if _provider is not None else []


def claim_payload(job) -> list:
    return _provider.claim_payload(job) if _provider is not None else []


def page_versions(job) -> list:
    return _provider.page_versions(job) if _provider is not None else []


def choices(user, project) -> list:
    return _provider.choices(user, project) if _provider is not None and project is not None else []


def prefetch_lookups() -> tuple[str, ...]:
    """For a list of jobs: `.prefetch_related(*inputs.prefetch_lookups())`."""
    return (_provider.prefetch,) if _provider is not None else ()


def any_of_job(job_ref):
    """An expression: whether the Job at `job_ref` (an OuterRef or F of its pk) reads any input. A claim
    selects it along with the job, so that a job without inputs answers input_datasets with no query."""
    if _provider is None:
        return Value(False)
    relation = _provider.prefetch.split("__")[0]
    return Exists(Job.objects.filter(pk=job_ref, **{relation + "__isnull": False}))


def max_count() -> int | None:
    return _provider.max_count if _provider is not None else None
