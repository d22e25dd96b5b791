"""Global administration → Launchers: register a launcher (its token shown once), recreate its token,
revoke it. Superusers only; the same services as the launcher API (sites.launchers)."""
from __future__ import annotations

import json

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_http_methods

from mado import access
from mado.dialogs import dialog, dialog_done
from mado.errors import ServiceError
from mado.forms import add_service_error
from mado.models import Project
from mado.services import Actor
from sites import launchers
from sites.models import Launcher

PAGE = "sites/dialog_page.html"


class LauncherForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=64,
                           help_text=_("Letters, digits, '.', '_' or '-'; for example the host it runs on."))
    project = forms.ModelChoiceField(label=_("Project"), queryset=Project.objects.order_by("slug"),
                                     to_field_name="slug",
                                     help_text=_("The project the launcher's token belongs to."))


def _require_superuser(request) -> None:
    if not request.user.is_superuser or access.is_service_user(request.user):
        raise PermissionDenied(_("Only global administrators manage launchers."))


def _rows():
    rows = []
    for launcher in Launcher.objects.select_related("token__project", "created_by"):
        project = launchers.project_of(launcher)
        rows.append({"launcher": launcher, "project": project, "state": launchers.state_of(launcher),
                     "last_used": launchers.last_used(launcher)})
    return rows


@login_required
def launcher_list(request):
    _require_superuser(request)
    context = {"rows": _rows()}
    if request.htmx and request.GET.get("fragment") == "list":
        return render(request, "sites/partials/_launcher_list.html", context)
    return render(request, "sites/launchers.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def launcher_create(request):
    _require_superuser(request)
    form = LauncherForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            launcher, plaintext = launchers.register_launcher(Actor.from_request(request), form.cleaned_data["name"],
                                                              form.cleaned_data["project"])
        except ServiceError as error:
            add_service_error(form, error)
        else:
            return _token_shown_once(request, launcher, plaintext)
    return dialog(request, "sites/partials/_launcher_form.html", {"form": form}, back=reverse("launchers"), page=PAGE)


@login_required
@require_http_methods(["GET", "POST"])
def launcher_token(request, launcher_id):
    _require_superuser(request)
    launcher = get_object_or_404(Launcher, pk=launcher_id)
    context = {"launcher": launcher, "action": reverse("launcher-token", args=[launcher.pk]), "error": None}
    if request.method == "POST":
        try:
            launcher, plaintext = launchers.recreate_token(Actor.from_request(request), launcher)
        except ServiceError as error:
            context["error"] = error.message
        else:
            return _token_shown_once(request, launcher, plaintext)
    return dialog(request, "sites/partials/_launcher_recreate.html", context, back=reverse("launchers"), page=PAGE)


@login_required
@require_http_methods(["GET", "POST"])
def launcher_revoke(request, launcher_id):
    _require_superuser(request)
    launcher = get_object_or_404(Launcher, pk=launcher_id)
    if request.method == "POST":
        launchers.revoke(Actor.from_request(request), launcher)
        return dialog_done(request, "launchersChanged", reverse("launchers"))
    context = {"launcher": launcher, "action": reverse("launcher-revoke", args=[launcher.pk])}
    return dialog(request, "sites/partials/_launcher_revoke.html", context, back=reverse("launchers"), page=PAGE)


def _token_shown_once(request, launcher, plaintext):
    launcher = Launcher.objects.select_related("token__project").get(pk=launcher.pk)
    context = {"launcher": launcher, "token": launcher.token, "plaintext": plaintext}
    response = dialog(request, "sites/partials/_launcher_token.html", context, back=reverse("launchers"), page=PAGE)
    response["Cache-Control"] = "no-store"
    if request.htmx:
        response["HX-Trigger"] = json.dumps({"launchersChanged": True})
    return response
