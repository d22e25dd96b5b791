"""Who sees and changes which notification rules: project admins all of the project's rules, members
their own (rules about their own jobs, mailed to themselves)."""
from __future__ import annotations

from django.shortcuts import get_object_or_404

from mado import access as identity
from mado.choices import Role
from notifications.models import NotificationRule


def is_admin(user, project) -> bool:
    return identity.has_role(user, project, Role.ADMIN)


def rules_visible_to(user, project):
    rules = NotificationRule.objects.filter(project=project).select_related("computer", "created_by")
    return rules if is_admin(user, project) else rules.filter(created_by=user)


def rule_for(user, project, pk: int) -> NotificationRule:
    """404 for a rule the user may not see (another member's, another project's)."""
    return get_object_or_404(rules_visible_to(user, project), pk=pk)
