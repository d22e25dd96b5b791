"""The job page's timeline, one sentence per line in the reader's language, and who claimed the Job.

jobs.services and sites.submissions write each event's message in English ("Claimed by worker w1",
"Failed (exit code 1): ..."). The page matches the message against the sentences below, which are that
same English with the values as placeholders, and shows the sentence's translation with the values filled
in. Free text after the sentence (an error the executor or the scheduler sent) is shown apart, as it was
written. A message no sentence matches is shown as stored, whole: never half translated.

An ended Job's line names its state with the state's own label, the one on the Job's badge."""
from __future__ import annotations

import re
from dataclasses import dataclass

from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from jobs.choices import TERMINAL_STATUSES, JobStatus

# (kind, sentence, whether free text may follow after ": "). More particular sentences come first: a
# placeholder matches any text.
SENTENCES = [
    ("created", gettext_noop("Created by %(user)s"), False),
    ("claimed", gettext_noop("Claimed by worker %(worker)s"), False),
    ("claimed", gettext_noop("Claimed by launcher %(launcher)s (job shell version %(version)s)"), False),
    ("claimed", gettext_noop("Claimed by %(user)s with mado-tracking submit (job shell version %(version)s)"),
     False),
    ("requeued", gettext_noop("Back in the queue: worker %(worker)s claimed it but never started it, and sent no "
                              "heartbeat for %(seconds)s s"), False),
    ("requeued", gettext_noop("Back in the queue: worker %(worker)s stopped before it started it"), False),
    ("requeued", gettext_noop("Back in the queue: worker %(worker)s gave it back"), True),
    ("waiting", gettext_noop("Waiting for its GPUs"), True),
    ("started", gettext_noop("Started"), False),
    ("started", gettext_noop("Started: all %(count)s replicas run"), False),
    ("stop_requested", gettext_noop("Stop requested by %(user)s"), False),
    ("submitted", gettext_noop("Submitted (no scheduler job id: the runner starts directly)"), False),
    ("submitted", gettext_noop("Submitted to the scheduler as %(scheduler_id)s"), False),
    ("cancel_queued", gettext_noop("Cancellation of %(scheduler_id)s queued for the launcher"), False),
    ("cancel_failed", gettext_noop("The scheduler did not cancel it"), True),
    ("runner_started", gettext_noop("Runner started on the compute node"), False),
    ("runner_started", gettext_noop("Runner started on %(host)s"), False),
    ("runner_started", gettext_noop("Runner of %(replica)s started on a compute node"), False),
    ("runner_started", gettext_noop("Runner of %(replica)s started on %(host)s"), False),
    ("replica_ended", gettext_noop("%(replica)s finished (exit code 0); the Job runs until main1 ends"), False),
]
ENDED_WITH_CODE = gettext_noop("%(status)s (exit code %(code)s)")
# What jobs.services._finish writes: "Finished", "Failed (exit code 1)", "Canceled: why".
ENDED = re.compile(r"(?P<status>Finished|Failed|Canceled)(?: \(exit code (?P<code>-?\d+)\))?(?:: (?P<detail>.*))?",
                   re.DOTALL)
PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def _pattern(sentence: str, detail: bool) -> re.Pattern:
    parts = PLACEHOLDER.split(sentence)  # literal, name, literal, name, …, literal
    regex = "".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>.+?)" for i, part in enumerate(parts))
    if detail:
        regex += r"(?:: (?P<detail>.*))?"
    return re.compile(regex, re.DOTALL)


PATTERNS = [(kind, sentence, _pattern(sentence, detail)) for kind, sentence, detail in SENTENCES]


@dataclass
class Entry:
    event: object
    text: str
    detail: str = ""

    @property
    def kind(self) -> str:
        return self.event.kind


def entry(event) -> Entry:
    """One line of the timeline: the event's sentence in the active language, and free text apart."""
    message = event.message
    if event.kind in TERMINAL_STATUSES and (ended := ENDED.fullmatch(message)):
        label = JobStatus(event.kind).label  # the badge's word: 失敗, never the check result's NG
        text = _(ENDED_WITH_CODE) % {"status": label, "code": ended["code"]} if ended["code"] else str(label)
        return Entry(event, text, (ended["detail"] or "").strip())
    for kind, sentence, pattern in PATTERNS:
        if kind != event.kind or not (match := pattern.fullmatch(message)):
            continue
        values = match.groupdict()
        detail = (values.pop("detail", None) or "").strip()
        text = _(sentence) % values if values else _(sentence)
        return Entry(event, text, detail)
    return Entry(event, message)


def timeline(events, error: tuple[str, str] = ("", "")) -> list[Entry]:
    """The lines of `events`. `error` is the Job's error as stored and as the page shows it (with the
    line breaks its submission kept): an ending line that quotes it shows it as the page does."""
    stored, shown = error
    entries = [entry(event) for event in events]
    for line in entries:
        # The event keeps at most 500 characters of the message: it may quote the error's beginning.
        if stored and line.detail and line.kind in TERMINAL_STATUSES and stored.strip().startswith(line.detail):
            line.detail = shown
    return entries


def last_claim(events) -> Entry | None:
    """The claim the Job is still under, as its timeline tells it: the last `claimed` event, unless the
    Job went back to the queue after it."""
    claim = None
    for event in events:
        if event.kind == "claimed":
            claim = event
        elif event.kind == "requeued":
            claim = None
    return entry(claim) if claim is not None else None
