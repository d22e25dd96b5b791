"""From audit rows to events. The lower layers record what happened in AuditEvent (mado.services.audit);
this module reads the rows that mean a notification event and the rules that match it;
notifications.services.on_audit_event (connected to the row's post_save in NotificationsConfig.ready())
queues one Delivery per matching rule, in the writer's own transaction."""
from __future__ import annotations

from django.conf import settings
from django.db.models import Q
from django.urls import reverse

from notifications.choices import JOB_EVENTS, Event

# The audit actions that may mean an event; every other row returns at once (this runs on every audit write).
ACTIONS = {"worker.offline", "worker.online", "job.not_responding", "job.complete", "computer.check.finish",
           "site.check.finish"}
ENDED = {"failed": Event.JOB_FAILED, "finished": Event.JOB_FINISHED, "canceled": Event.JOB_CANCELED}


def events_of(audit) -> list[tuple[str, dict]]:
    after = audit.after or {}
    if audit.action in ("worker.offline", "worker.online"):
        return [(audit.action, _worker_subject(audit))]
    if audit.action == "job.not_responding":
        return [(Event.JOB_NOT_RESPONDING, _job_subject(audit))]
    if audit.action == "job.complete":
        event = ENDED.get(after.get("status"))
        if event is None:
            return []
        subject = _job_subject(audit)
        found = [(event, subject)]
        if after.get("end_reason") == "submit_failed":
            found.append((Event.SITE_SUBMIT_FAILED, subject))
        return found
    if audit.action in ("computer.check.finish", "site.check.finish") and after.get("status") in ("failed", "expired"):
        return [(Event.CHECK_FAILED, _check_subject(audit))]
    return []


def absolute(path: str) -> str:
    return settings.PUBLIC_URL.rstrip("/") + path


def _worker_subject(audit) -> dict:
    from workers.models import Worker

    worker = Worker.objects.select_related("project").get(pk=audit.object_id)
    return {
        "kind": "worker", "project_id": worker.project_id, "computer_ids": worker.target_ids, "creator_id": None,
        "worker": {"id": worker.pk, "worker_id": worker.worker_id, "hostname": worker.hostname,
                   "last_seen_at": worker.last_seen_at.isoformat(), "stopped": worker.stopped_at is not None},
        "url": absolute(reverse("project-compute", args=[worker.project.slug])),
    }


def _job_subject(audit) -> dict:
    from jobs.models import Job

    job = Job.objects.select_related("project", "target", "created_by").get(pk=audit.object_id)
    return {
        "kind": "job", "project_id": job.project_id, "computer_ids": [job.target_id], "creator_id": job.created_by_id,
        "job": {"id": job.pk, "name": job.display_name, "status": job.status, "end_reason": job.end_reason or None,
                "exit_code": job.exit_code, "error": (job.error or "")[:500], "computer": job.target.name,
                "created_by": job.created_by.username,
                "heartbeat_at": job.heartbeat_at.isoformat() if job.heartbeat_at else None},
        "url": absolute(reverse("job-detail", args=[job.project.slug, job.pk])),
    }


def _check_subject(audit) -> dict:
    from computers.models import ComputeTarget

    target = ComputeTarget.objects.get(pk=audit.object_id)
    after = audit.after or {}
    return {
        "kind": "computer", "project_id": None, "computer_ids": [target.pk], "creator_id": None,
        "target_owner_id": target.owner_id, "public": target.visibility == "public",
        "computer": {"id": target.pk, "name": target.name, "check": after.get("check"), "status": after.get("status"),
                     "failure_reason": after.get("failure_reason") or None},
        "url": absolute(reverse("computer-detail", args=[target.pk])),
    }


def matching_rules(event: str, subject: dict):
    from notifications.models import NotificationRule

    rules = NotificationRule.objects.filter(enabled=True).select_related("project")
    if subject["project_id"] is not None:
        rules = rules.filter(project_id=subject["project_id"])
    else:
        # A computer belongs to no project: a rule hears about it when it names it, or, naming none,
        # when the computer is Public or its owner is in the rule's project.
        computer = subject["computer_ids"][0]
        owner = subject["target_owner_id"]
        reach = Q(computer_id=computer) | Q(computer__isnull=True, project__memberships__user_id=owner)
        if subject.get("public"):
            reach |= Q(computer__isnull=True)
        rules = rules.filter(reach).distinct()
    computers = subject["computer_ids"]
    if computers is not None and subject["project_id"] is not None:  # None: a worker serving every computer
        rules = rules.filter(Q(computer__isnull=True) | Q(computer_id__in=computers))
    if event in JOB_EVENTS:
        rules = rules.filter(Q(only_my_jobs=False) | Q(created_by_id=subject["creator_id"]))
        rules = rules.filter(Q(job__isnull=True) | Q(job_id=subject["job"]["id"]))
    else:
        rules = rules.filter(job__isnull=True)
    # Events are a short JSON list; filtered here because SQLite (the demo) has no JSON containment.
    return [rule for rule in rules.order_by("id") if event in (rule.events or [])]
