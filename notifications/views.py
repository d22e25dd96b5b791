"""Project settings → Notifications: rules, their delivery log, Send test. Thin: access, then services."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import translation
from django.views.decorators.http import require_http_methods, require_POST

from computers import access as computer_access
from mado import access as identity
from mado.choices import Role
from mado.dialogs import dialog, dialog_shown_once, page_or_part
from mado.forms import service_refusals
from mado.services import Actor
from notifications import access, delivery, services
from notifications.choices import DeliveryStatus
from notifications.forms import RuleForm

LOG_SIZE = 50


def _context(request, project, **more):
    return {"project": project, "is_project_admin": access.is_admin(request.user, project), **more}


@login_required
def rule_list(request, project):
    project = identity.project_for_user(request.user, project, Role.MEMBER)
    rules = access.rules_visible_to(request.user, project)
    return page_or_part(request, "notifications/rules.html", "notifications/partials/_rule_list.html",
                        _context(request, project, rules=rules))


@login_required
@require_http_methods(["GET", "POST"])
def rule_create(request, project):
    project = identity.project_for_user(request.user, project, Role.MEMBER)
    admin = access.is_admin(request.user, project)
    computers = computer_access.listed_to(request.user).order_by("name")
    form = RuleForm(request.POST or None, computers=computers, admin=admin, user=request.user,
                    initial={"language": translation.get_language() or "en"})
    back = reverse("notification-rules", args=[project.slug])
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        if not admin:
            data.update(channel="email", only_my_jobs=True, email_to=request.user.email)
        with service_refusals(form):
            rule, secret = services.create_rule(Actor.from_request(request), project, **data)
            return dialog_shown_once(request, "notifications/partials/_rule_created.html",
                                     _context(request, project, rule=rule, secret=secret), event="rulesChanged",
                                     back=back)
    return dialog(request, "notifications/partials/_rule_form.html", _context(request, project, form=form),
                  back=back)


@login_required
def rule_detail(request, project, pk):
    project = identity.project_for_user(request.user, project, Role.MEMBER)
    rule = access.rule_for(request.user, project, pk)
    return page_or_part(request, "notifications/rule.html", "notifications/partials/_delivery_log.html",
                        _log_context(request, project, rule), fragment="log")


@login_required
@require_POST
def rule_test(request, project, pk):
    project = identity.project_for_user(request.user, project, Role.MEMBER)
    rule = access.rule_for(request.user, project, pk)
    services.send_test(Actor.from_request(request), rule)
    if request.htmx:
        return render(request, "notifications/partials/_delivery_log.html", _log_context(request, project, rule))
    return redirect("notification-rule", project=project.slug, pk=rule.pk)


@login_required
@require_POST
def rule_enabled(request, project, pk):
    project = identity.project_for_user(request.user, project, Role.MEMBER)
    rule = access.rule_for(request.user, project, pk)
    services.set_enabled(Actor.from_request(request), rule, request.POST.get("enabled") == "true")
    return redirect("notification-rule", project=project.slug, pk=rule.pk)


@login_required
@require_POST
def rule_delete(request, project, pk):
    project = identity.project_for_user(request.user, project, Role.MEMBER)
    rule = access.rule_for(request.user, project, pk)
    services.delete_rule(Actor.from_request(request), rule)
    return redirect("notification-rules", project=project.slug)


def _log_context(request, project, rule):
    deliveries = list(rule.deliveries.order_by("-id")[:LOG_SIZE])
    return _context(request, project, rule=rule, deliveries=deliveries,
                    pending=any(d.status == DeliveryStatus.PENDING for d in deliveries),
                    webhook_host=delivery.webhook_host(rule.webhook_url) if rule.webhook_url else "")
