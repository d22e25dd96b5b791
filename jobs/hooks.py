"""What the apps above jobs add to the creation of a Job. jobs may not import them (DESIGN §2), so each
registers a callback here in its AppConfig.ready(), with the names of the create_job options it reads
(notifications: `notify_me`, "Notify me when it ends").

create_job calls every callback inside its transaction, after the Job and its audit row are written, as
callback(actor, job, options) with only the options that callback named and the caller gave. A callback
that raises ServiceError refuses the whole creation: the Job is rolled back and the error (with its
fields) reaches the form or the API caller."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class AfterCreate:
    name: str
    callback: Callable[..., object]
    options: tuple[str, ...]


_after_create: dict[str, AfterCreate] = {}


def register_after_create(name: str, callback: Callable[..., object], *, options: tuple[str, ...] = ()) -> None:
    """Add a callback. The same name again replaces it (ready() may run twice in tests)."""
    _after_create[name] = AfterCreate(name, callback, tuple(options))


def offers(option: str) -> bool:
    """Whether some installed app reads this create_job option (the form shows its field only then)."""
    return any(option in hook.options for hook in _after_create.values())


def run_after_create(actor, job, data: dict) -> None:
    for hook in list(_after_create.values()):
        hook.callback(actor, job, {name: data[name] for name in hook.options if name in data})
