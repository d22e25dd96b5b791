"""`{% manual_for_job manual job as manual %}`: the Job page's "Waiting for manual submission" for that
Job (issue 15): the commands only for people who can submit it, and who can for everyone else. The
page's `manual` comes from sites.views.manual_instructions for the Job's computer and project."""
from __future__ import annotations

from django import template

from sites.submissions import manual_submitters

register = template.Library()


@register.simple_tag(takes_context=True)
def manual_for_job(context, manual, job):
    if not manual or job is None:
        return manual
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None:
        return {**manual, "can_submit": False, "who_can": ""}
    return {**manual, **manual_submitters(user, job.target, job=job)}
