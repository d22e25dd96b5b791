"""Who sees and stops which jobs."""
from __future__ import annotations

from django.http import Http404
from django.utils.translation import gettext as _

from jobs.models import Job
from mado import access as identity
from mado.choices import Role


def visible_in(user, project):
    """Every job of a project the user may view."""
    if not identity.has_role(user, project, Role.VIEWER):
        return Job.objects.none()
    return Job.objects.filter(project=project)


def job_for(user, pk: int) -> Job:
    """A job of a project the user may view; otherwise 404."""
    job = Job.objects.select_related("project", "target", "created_by", "worker").filter(pk=pk).first()
    if job is None or not identity.has_role(user, job.project, Role.VIEWER):
        raise Http404("No job with this id that you can see.")
    return job


def can_stop(user, job: Job, *, is_project_admin: bool | None = None) -> bool:
    """The creator and project admins. Lists pass `is_project_admin`, worked out once per page."""
    if job.created_by_id == user.pk:
        return True
    if is_project_admin is None:
        is_project_admin = identity.has_role(user, job.project, Role.ADMIN)
    return is_project_admin


def can_mark_lost(user, job: Job) -> bool:
    """Marking a Not responding job as lost: Project admins (a person's decision, seed 002)."""
    return identity.has_role(user, job.project, Role.ADMIN) and not identity.is_job_principal(user)


def lost_refusal(job: Job) -> str | None:
    """Why the Mark as lost dialog cannot mark this job (it ended, or its worker answers again)."""
    if job.is_terminal:
        return _("Already ended")
    if not job.is_unresponsive:
        return _("Its worker is responding again, so this Job is not marked as lost.")
    return None


def stop_refusal(user, job: Job, *, is_project_admin: bool | None = None) -> str | None:
    """Why the Actions column shows no Request stop button, or None when it does."""
    if job.is_terminal:
        return _("Already ended")
    if not can_stop(user, job, is_project_admin=is_project_admin):
        return _("Only the creator and Project admins can stop this Job")
    if job.stop_requested_at:
        return _("Stop requested")
    return None
