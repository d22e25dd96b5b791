"""Settings → Computers → Compute groups: the list for everyone signed in, and the Add, Edit and
Delete dialogs for global administrators (changes go through computers.groups)."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from computers import groups
from computers.models import ComputeGroup
from mado.access import is_global_admin
from mado.dialogs import dialog, dialog_done
from mado.errors import ServiceError
from mado.forms import add_service_error
from mado.services import Actor

CHANGED = "computeGroupsChanged"


@login_required
@require_GET
def group_list(request):
    context = {"groups": ComputeGroup.objects.prefetch_related("computers"),
               "can_change": is_global_admin(request.user)}
    if request.htmx and request.GET.get("fragment") == "list":
        return render(request, "computers/partials/_group_list.html", context)
    return render(request, "computers/group_list.html", context)


def _admin_only(request) -> None:
    if not is_global_admin(request.user):
        raise PermissionDenied("Only global administrators change compute groups.")


@login_required
@require_http_methods(["GET", "POST"])
def group_edit(request, pk=None):
    _admin_only(request)
    group = get_object_or_404(ComputeGroup, pk=pk) if pk else None
    initial = ({"name": group.name, "description": group.description,
                "computers": [str(i) for i in group.computers.values_list("pk", flat=True)]} if group else None)
    form = groups.GroupForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            groups.save_group(Actor.from_request(request), form.service_data(), group)
        except ServiceError as error:
            add_service_error(form, error)
        else:
            return dialog_done(request, CHANGED, reverse("compute-groups"))
    return dialog(request, "computers/partials/_group_form.html", {"form": form, "group": group},
                  back=reverse("compute-groups"), page="computers/group_dialog_page.html")


@login_required
@require_http_methods(["GET", "POST"])
def group_delete(request, pk):
    _admin_only(request)
    group = get_object_or_404(ComputeGroup, pk=pk)
    error = None
    if request.method == "POST":
        try:
            groups.delete_group(Actor.from_request(request), group)
        except ServiceError as refused:
            error = refused.message
        else:
            return dialog_done(request, CHANGED, reverse("compute-groups"))
    return dialog(request, "computers/partials/_group_delete.html", {"group": group, "error": error},
                  back=reverse("compute-groups"), page="computers/group_dialog_page.html")
