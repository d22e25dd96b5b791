"""The words of each notification, rendered in the rule's language (translation.override) at sending time."""
from __future__ import annotations

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext as _
from django.utils.translation import override


def _when(value) -> str:
    moment = parse_datetime(value) if isinstance(value, str) else None
    return timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S %Z") if moment else "?"


def render(rule, event: str, payload: dict) -> tuple[str, str]:
    """(subject, text) of one delivery, in the rule's language."""
    with override(rule.language):
        subject, lines = _words(event, payload)
        project = payload.get("project", {}).get("name") or payload.get("project", {}).get("slug", "")
        lines += ["", _("Open: %(url)s") % {"url": payload.get("url", "")}, "",
                  _("You receive this because of the notification rule “%(rule)s” in the Project %(project)s.")
                  % {"rule": rule.name, "project": project}]
        return f"[Mado] {subject}", "\n".join(lines) + "\n"


def _words(event: str, payload: dict) -> tuple[str, list[str]]:
    worker = payload.get("worker") or {}
    job = payload.get("job") or {}
    computer = payload.get("computer") or {}
    w = {"worker": worker.get("worker_id", "?"), "host": worker.get("hostname") or "?",
         "seen": _when(worker.get("last_seen_at"))}
    j = {"job": job.get("name", "?"), "id": job.get("id", "?"), "computer": job.get("computer", "?"),
         "creator": job.get("created_by", "?")}
    if event == "worker.offline":
        if worker.get("stopped"):
            return (_("Worker %(worker)s is offline") % w,
                    [_("The worker %(worker)s on %(host)s stopped (it said goodbye) at %(seen)s.") % w])
        return (_("Worker %(worker)s is offline") % w,
                [_("The worker %(worker)s on %(host)s has not been seen since %(seen)s. Jobs for its computers "
                   "wait until it is back: check that its process runs and can reach this server.") % w])
    if event == "worker.online":
        return (_("Worker %(worker)s is back online") % w,
                [_("The worker %(worker)s on %(host)s is back online (seen at %(seen)s).") % w])
    if event == "job.failed":
        lines = [_("Job %(job)s (#%(id)s) on %(computer)s, created by %(creator)s, failed.") % j]
        if job.get("exit_code") is not None:
            lines.append(_("Exit code: %(code)s") % {"code": job["exit_code"]})
        if job.get("error"):
            lines.append(_("Error: %(error)s") % {"error": job["error"]})
        return _("Job %(job)s failed") % j, lines
    if event == "job.finished":
        return (_("Job %(job)s finished") % j,
                [_("Job %(job)s (#%(id)s) on %(computer)s, created by %(creator)s, finished.") % j])
    if event == "job.canceled":
        return (_("Job %(job)s was canceled") % j,
                [_("Job %(job)s (#%(id)s) on %(computer)s, created by %(creator)s, was canceled.") % j])
    if event == "job.not_responding":
        return (_("Job %(job)s is not responding") % j,
                [_("Job %(job)s (#%(id)s) on %(computer)s sent no heartbeat since %(when)s. Its GPUs stay reserved; "
                   "if its worker or computer is gone for good, mark it as lost on its page.")
                 % {**j, "when": _when(job.get("heartbeat_at"))}])
    if event == "site.submit_failed":
        lines = [_("Job %(job)s (#%(id)s) could not be submitted to the scheduler of %(computer)s.") % j]
        if job.get("error"):
            lines.append(_("Error: %(error)s") % {"error": job["error"]})
        return _("Job %(job)s could not be submitted") % j, lines
    if event == "check.failed":
        c = {"computer": computer.get("name", "?"), "status": computer.get("status", "?")}
        return (_("Connection check of %(computer)s failed") % c,
                [_("The connection check of %(computer)s ended as %(status)s. Open the computer to see which "
                   "item failed and how to fix it.") % c])
    return (_("Test notification from the rule %(rule)s") % {"rule": payload.get("rule", "")},
            [_("This is a test. When this rule's events happen, messages like this one arrive here.")])
