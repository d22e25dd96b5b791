"""HTML pages of Computers under Global settings (seed 002, DESIGN §10): the list with each computer's
details below it, the two-step Add computer dialog, Edit computer, connection checks and the directory
reads that complete the working directory and Python paths.

Every decision about who may see or do what is asked of computers.access; every change goes through
computers.services. Dialogs are HTMX fragments for the <dialog> shell of base.html, and whole pages
when opened without HTMX."""
from __future__ import annotations

import json
import re

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import filesizeformat
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseStopPolling, push_url, reswap, retarget

from computers import access, kinds, locks, page_blocks, services
from computers.choices import (
    CHECK_ITEM_LABELS,
    RESOLUTIONS,
    CheckFailure,
    CheckStatus,
    CpuArch,
    EntryKind,
    ItemStatus,
    Kind,
    ReadError,
    ReadStatus,
    Visibility,
)
from computers.forms import (
    CONNECTION_VALUES,
    ConnectionForm,
    EditForm,
    SettingsForm,
    SuggestedSettingsForm,
    gpu_label,
)
from computers.models import ComputeTarget, ConnectionCheck, DirectoryRead
from mado import access as identity
from mado.dialogs import dialog, page_or_part
from mado.errors import ServiceError
from mado.forms import add_service_error as shared_add_service_error
from mado.forms import service_refusals
from mado.services import Actor
from mado.validation import BIGINT_MAX, as_int

POLL = "every 1s"
LIST_PAGE = 50  # computers per page of the list, as many as the Jobs list shows
MULTI_VALUED = ("runtimes", "gpu_detected")
PATH_FIELDS = ("working_dir", "python_path")

# Step 1 says why a check did not get through and what to do (seed: "When the connection cannot be checked").
ADD_FAILURE_HELP = {
    CheckFailure.NOT_CLAIMED: gettext_lazy("The worker did not pick up the check within 5 minutes. Check that the "
                                           "worker is running"),
    CheckFailure.NO_RESULT: gettext_lazy("The worker stopped during the check. Check the worker log"),
    CheckFailure.CHECK_FAILED: gettext_lazy(
        "The result of each item is shown. If SSH connection is Failed, follow the Resolution column, correct the "
        "connection fields, and press Check connection and continue again"),
}
# The details' Connection check panel (seed: "When the check does not finish").
DETAIL_FAILURES = {
    CheckFailure.NOT_CLAIMED: (
        gettext_lazy("The chosen worker did not pick up the check, or no worker claimed the check within 5 minutes"),
        gettext_lazy("The worker asked to check is not running. Check that it is online under Workers on a "
                     "Project's Compute page. For a check that named no worker, also check that the target ID is "
                     "in the worker's MMT_WORKER_TARGET_IDS (--target-ids of install)")),
    CheckFailure.NO_RESULT: (gettext_lazy("No result arrived from the worker"),
                             gettext_lazy("The worker stopped during the check. Check the worker log")),
}


# The list and the details ---------------------------------------------------------------------------

@login_required
@require_GET
def computer_list(request):
    return page_or_part(request, "computers/computer_list.html", "computers/partials/_computer_list.html",
                        _list_context(request, request.GET.get("page")))


@login_required
@require_GET
def computer_detail(request, pk):
    """The details of a computer the user may use or manage (others: 404), below the list."""
    target = access.detail_for(request.user, pk)
    details = _details_context(request, target)
    if request.htmx and not request.htmx.history_restore_request:
        return render(request, "computers/partials/_computer_details.html", details)
    # Opened by its address (a reload, a link): the list shows the page that holds this computer's row.
    number = request.GET.get("page") or _page_of(request.user, target)
    return render(request, "computers/computer_list.html", {**_list_context(request, number), **details})


def _list_context(request, number) -> dict:
    """One page of LIST_PAGE computers (docs/decisions.md "Long lists"), in the same few queries whatever
    the number of computers: a count, the page's computers with their owners, and which of them the user
    may use (a service account's creator is looked up once)."""
    user = request.user
    page = Paginator(access.listed_to(user), LIST_PAGE).get_page(number)
    computers = list(page)
    usable_ids = set(access.usable_by(user).filter(pk__in=[c.pk for c in computers]).values_list("pk", flat=True))
    # Each label translated once, not once per row: with a thousand rows the lookups were most of the page.
    # The same goes for the rows' addresses: each pattern reversed once.
    kind_labels = {value: str(label) for value, label in Kind.choices}
    visibility_labels = {value: str(label) for value, label in Visibility.choices}
    urls = {name: _row_url(name) for name in ("computer-detail", "computer-edit", "computer-enabled", "site-edit")}
    for computer in computers:
        computer.manageable = access.can_manage(user, computer)
        computer.usable = computer.manageable or computer.pk in usable_ids
        computer.kind_label = kind_labels.get(computer.kind, computer.kind)
        computer.visibility_label = visibility_labels.get(computer.visibility, computer.visibility)
        computer.urls = {name.replace("-", "_"): url(computer.pk) for name, url in urls.items()}
    # Anyone signed in adds sites (seed 003); service accounts add nothing.
    can_add = access.can_add(user, Kind.SITE) and not identity.is_service_user(user)
    return {"computers": computers, "page": page, "can_add": can_add}


def _page_of(user, target: ComputeTarget) -> int:
    """The list's page number of `target`'s row (the list is ordered by name, and names are unique)."""
    return access.listed_to(user).filter(name__lt=target.name).count() // LIST_PAGE + 1


def _row_url(name: str):
    """reverse(name, args=[pk]) for many pks at the cost of one reverse: the pattern's text around the pk."""
    marker = 987654321
    before, after = reverse(name, args=[marker]).split(str(marker))
    return lambda pk: f"{before}{pk}{after}"


def _details_context(request, target: ComputeTarget, **extra) -> dict:
    handlers = kinds.handlers_for(target.kind)
    if handlers is not None:
        return handlers.details_context(request, target, **extra)
    user = request.user
    manageable = access.can_manage(user, target)
    succeeded = _last_succeeded(target)
    suggestions = check_suggestions(succeeded)
    context = {
        "target": target,
        "manageable": manageable,
        "see_connection": access.can_see_connection(user, target),
        # Who Jobs run as: the SSH user's name (not the rest of the connection) for people who use it.
        "see_ssh_user": target.kind == Kind.SSH and bool(target.ssh_user) and access.can_use(user, target),
        "machine": machine_summary(succeeded),
        "gpu_difference": gpu_difference(target, succeeded),
        "public_url": settings.PUBLIC_URL,
        "active_jobs": list(locks.active_jobs(target)[:5]) if manageable else [],
        "details_blocks": page_blocks.render_details_blocks(request, target),
    }
    if manageable:
        latest = target.checks.select_related("requested_worker", "claimed_by").first()
        context["panel"] = check_view(latest, flow="details")
        context["suggested_form"] = extra.pop("suggested_form", None) or SuggestedSettingsForm(
            gpus=suggestions["gpus"], runtimes=suggestions["runtimes"])
        context["suggested_gpus"] = suggestions["gpus"]
        context["suggested_runtimes"] = suggestions["runtimes"]
    context.update(extra)
    return context


@login_required
@require_POST
def computer_set_enabled(request, pk):
    """Enable/Disable in the list: always allowed to managers, even while Jobs run."""
    target = access.managed_for(request.user, pk)
    enabled = request.POST.get("enabled") == "1"
    try:
        services.set_enabled(Actor.from_request(request), target, enabled)
    except ServiceError as error:
        message = error.message
        if error.code == "invalid_computer" and set(error.fields) <= set(PATH_FIELDS):
            message = _("The working directory and the Python executable path are required to enable %(name)s. "
                        "Enter them with Edit computer.") % {"name": target.name}
        if request.htmx:
            response = render(request, "computers/partials/_message.html", {
                "title": _("Enable"), "message": message, "target": target})
            return reswap(retarget(response, "#dialog-content"), "innerHTML")
        messages.error(request, message)
        return redirect("computers")
    if request.htmx:
        return _triggered(HttpResponse(status=204), computersChanged=True)
    return redirect("computers")


@login_required
@require_POST
def computer_check_request(request, pk):
    """Check connection in the details: asks the worker of the last check, or one that handles the computer."""
    target = access.managed_for(request.user, pk)
    error = None
    try:
        services.request_check(Actor.from_request(request), target)
    except ServiceError as failure:
        error = failure.message
    if not request.htmx:
        if error:
            messages.error(request, error)
        return redirect(reverse("computer-detail", args=[target.pk]) + "#connection-check")
    latest = target.checks.select_related("requested_worker", "claimed_by").first()
    return render(request, "computers/partials/_check_panel.html", {
        "target": target, "manageable": True, "panel": check_view(latest, flow="details"), "panel_error": error})


@login_required
@require_POST
def computer_apply_suggested(request, pk):
    """Save selected settings: only the GPUs and runtimes the user ticked replace the computer's."""
    target = access.managed_for(request.user, pk)
    suggestions = check_suggestions(_last_succeeded(target))
    form = SuggestedSettingsForm(request.POST, gpus=suggestions["gpus"], runtimes=suggestions["runtimes"])
    saved = False
    if form.is_valid():
        gpu_ids = form.cleaned_data["gpu_ids"] or None
        runtimes = form.cleaned_data["runtimes"] or None
        if gpu_ids is None and runtimes is None:
            form.add_error(None, _("Select the GPUs or runtimes to save."))
        else:
            try:
                target = services.apply_suggested_settings(Actor.from_request(request), target, gpu_ids=gpu_ids,
                                                           runtimes=runtimes)
                saved = True
            except ServiceError as error:
                form.add_error(None, error.message)
    if not request.htmx:
        if saved:
            messages.success(request, _("Saved the selected settings."))
        else:
            messages.error(request, " ".join(str(e) for e in form.non_field_errors()))
        return redirect("computer-detail", pk=target.pk)
    target = access.detail_for(request.user, target.pk)
    context = _details_context(request, target, suggested_saved=saved,
                               suggested_form=None if saved else form)
    return render(request, "computers/partials/_computer_details.html", context)


# Add computer, step 1: Connection ---------------------------------------------------------------

@login_required
@require_http_methods(["GET", "POST"])
def computer_add(request):
    """Global administrators choose the Type; everyone else (and Type Site) gets the one-screen site form."""
    kind = request.POST.get("kind") if request.method == "POST" else request.GET.get("kind")
    if kind in (Kind.SSH, Kind.LOCAL) and not access.can_add(request.user, Kind.SSH):
        raise PermissionDenied(_("Only global administrators can add SSH and Local computers."))
    if not access.can_add(request.user, Kind.SSH) or kind == Kind.SITE:
        return kinds.handlers_for(Kind.SITE).add_view(request)
    workers = access.workers_to_choose(request.user)
    if request.method == "GET" or _action(request) == "refresh":
        initial = initial_from(request.POST) if request.method == "POST" else {}
        return _render_connection(request, ConnectionForm(initial=initial, workers=workers))
    return _submit_connection(request, ConnectionForm(request.POST, workers=workers), target=None)


@login_required
@require_http_methods(["GET", "POST"])
def computer_connection(request, pk):
    """Step 1 again for a computer it registered (Back from step 2, or after a failed check)."""
    target = _add_flow_target(request, pk)
    workers = access.workers_to_choose(request.user)
    if request.method == "GET" or _action(request) == "refresh":
        if request.method == "POST":
            initial = initial_from(request.POST)
        else:
            initial = {name: getattr(target, name) for name in CONNECTION_VALUES}
            initial["worker"] = request.GET.get("worker") or (
                str(target.last_check_worker_id) if target.last_check_worker_id else "")
        check = _check_param(request.GET, target)
        if check is not None and check.status == CheckStatus.SUCCEEDED:
            return redirect(_settings_url(target, check=check, worker=initial.get("worker")))
        return _render_connection(request, ConnectionForm(initial=initial, workers=workers), target=target,
                                  check=check)
    return _submit_connection(request, ConnectionForm(request.POST, workers=workers), target=target)


def _submit_connection(request, form: ConnectionForm, *, target: ComputeTarget | None):
    """Check connection and continue, or Continue without checking: either way the computer is
    registered (disabled) or its connection saved first."""
    checking = _action(request) != "continue"
    if not form.is_valid():
        return _render_connection(request, form, target=target)
    worker = form.chosen_worker()
    if checking and worker is None:
        form.add_error("worker", _("No online worker can check the connection.") if not form.workers else
                       _("Choose the worker that checks the connection."))
        return _render_connection(request, form, target=target)
    actor = Actor.from_request(request)
    try:
        if target is None:
            target = services.register_computer(actor, {**form.connection_values(with_kind=True), "enabled": False})
        else:
            target = services.update_computer(actor, target, form.connection_values(with_kind=False))
    except ServiceError as error:
        add_service_error(form, error)
        return _render_connection(request, form, target=target)
    if not checking:
        if request.htmx:
            return _triggered(_render_settings(request, target, worker=worker), computersChanged=True)
        return redirect(_settings_url(target, worker=worker and worker.pk))
    try:
        check = services.request_check(actor, target, worker)
    except ServiceError as error:
        form = ConnectionForm(initial=initial_from(request.POST), workers=form.workers)
        return _triggered(_render_connection(request, form, target=target, error=error.message),
                          computersChanged=True)
    if request.htmx:
        form = ConnectionForm(initial=initial_from(request.POST), workers=form.workers)
        return _triggered(_render_connection(request, form, target=target, check=check), computersChanged=True)
    return redirect(reverse("computer-connection", args=[target.pk]) + f"?check={check.pk}")


def _render_connection(request, form: ConnectionForm, *, target=None, check=None, error=None):
    chosen = form.chosen_worker()
    kind = target.kind if target is not None else (form["kind"].value() or Kind.SSH)
    if target is None:  # Type also offers Site, whose form replaces this one
        form.fields["kind"].choices = [*form.fields["kind"].choices, (Kind.SITE.value, Kind.SITE.label)]
    action = reverse("computer-connection", args=[target.pk]) if target else reverse("computer-add")
    context = {
        "form": form,
        "target": target,
        "kind": kind,
        "is_local": kind == Kind.LOCAL,
        "chosen_worker": chosen,
        "no_worker": not form.workers,
        "check": check_view(check, flow="add"),
        "error": error,
        "action": action,
    }
    return _dialog(request, "computers/partials/_add_connection.html", context, title=_("Add computer"), check=check)


@login_required
@require_GET
def worker_candidates(request):
    """The key and known_hosts candidates of the worker chosen in Worker for this connection."""
    if not access.can_choose_worker(request.user):
        raise PermissionDenied(_("Only global administrators can choose a worker."))
    return render(request, "computers/partials/_ssh_candidates.html",
                  {"chosen_worker": _online_worker(request, request.GET.get("worker"))})


# Add computer, step 2: Settings after connecting -----------------------------------------------

@login_required
@require_http_methods(["GET", "POST"])
def computer_settings(request, pk):
    target = _add_flow_target(request, pk)
    params = request.POST if request.method == "POST" else request.GET
    check = _check_param(params, target)
    worker = _online_worker(request, params.get("worker"))
    if request.method == "GET":
        return _render_settings(request, target, check=check, worker=worker)
    form = SettingsForm(request.POST, gpus=check_suggestions(check)["gpus"])
    if form.is_valid():
        with service_refusals(form, add_service_error):
            target = services.update_computer(Actor.from_request(request), target, form.settings_values())
            return show_saved(request, target)
    return _render_settings(request, target, check=check, worker=worker, form=form)


def _render_settings(request, target, *, check=None, worker=None, form=None):
    suggestions = check_suggestions(check)
    gpus = suggestions["gpus"]
    if form is None:
        gpu_ids = [str(g.get("index")) for g in gpus] if gpus else list(target.gpu_ids)
        form = SettingsForm(gpus=gpus, initial={
            "working_dir": target.working_dir,
            "python_path": target.python_path or suggestions["python_path"],
            "cpu_arch": suggestions["cpu_arch"] or target.cpu_arch,
            "runtimes": suggestions["runtimes"] if check is not None and suggestions["ok"] else target.runtimes,
            "gpu_detected": [str(g.get("index")) for g in gpus],
            "gpu_ids": "\n".join(gpu_ids),
            "concurrency": len(gpu_ids) if gpus else target.concurrency,
            "dataset_transfer": target.dataset_transfer,
            "dataset_cache_limit_gib": target.dataset_cache_limit_gib,
            "gpu_busy_wait_seconds": target.gpu_busy_wait_seconds,
            "enabled": True,
        })
    _mark_follow(form)
    context = {
        "form": form,
        "target": target,
        "check": check_view(check, flow="add"),
        "suggestions": suggestions,
        "machine": machine_summary(check),
        "worker": worker,
        "can_read": access.can_choose_worker(request.user),  # without a worker, typing says so
        "assists": _initial_assists(request, target, form, check),
        "action": reverse("computer-settings", args=[target.pk]),
        "back_to_connection": reverse("computer-connection", args=[target.pk])
        + (f"?worker={worker.pk}" if worker else ""),
    }
    return _dialog(request, "computers/partials/_add_settings.html", context, title=_("Add computer"))


# Edit computer ------------------------------------------------------------------------------------

@login_required
@require_http_methods(["GET", "POST"])
def computer_edit(request, pk):
    target = access.managed_for(request.user, pk)
    if target.kind == Kind.SITE:  # sites have their own one-screen form (the Sites pages)
        raise Http404("Site computers are changed with the site form, not Edit computer.")
    if request.method == "GET":
        return _render_edit(request, target, check=_check_param(request.GET, target))
    action = _action(request)
    if action == "refresh":
        return _render_edit(request, target, initial=initial_from(request.POST))
    form = _edit_form(request, target, data=request.POST)
    if not form.is_valid():
        return _render_edit(request, target, form=form)
    actor = Actor.from_request(request)
    if action == "check":
        return _check_again(request, target, form, actor)
    try:
        target = services.update_computer(actor, target, {**form.connection_values(with_kind=False),
                                                          **form.settings_values()})
    except ServiceError as error:
        add_service_error(form, error)
        return _render_edit(request, target, form=form, locked=error.code == "computer_in_use")
    return show_saved(request, target)


def _check_again(request, target, form: EditForm, actor: Actor):
    """Check again: unsaved connection changes are saved first (and only those), then the worker checks."""
    connection = form.connection_values(with_kind=False)
    changed = {k: v for k, v in connection.items() if str(getattr(target, k)) != str(v)}
    try:
        if changed:
            target = services.update_computer(actor, target, connection)
        worker = form.chosen_worker() if access.can_choose_worker(request.user) else None
        check = services.request_check(actor, target, worker)
    except ServiceError as error:
        add_service_error(form, error)
        return _render_edit(request, target, form=form, locked=error.code == "computer_in_use")
    if not request.htmx:
        return redirect(reverse("computer-edit", args=[target.pk]) + f"?check={check.pk}")
    response = _render_edit(request, target, initial=initial_from(request.POST), check=check,
                            connection_saved=bool(changed))
    return _triggered(response, computersChanged=True) if changed else response


def _edit_form(request, target, *, data=None, initial=None, jobs=None) -> EditForm:
    """The Edit dialog's form. While Jobs are queued or running, the fields they lock are disabled with
    the reason beside them. A browser does not send disabled fields, so a submitted form names the
    fields it showed locked (`locked_fields`): those keep the computer's values; any other locked field
    that changed is refused by the service (Jobs that started while the dialog was open)."""
    workers = access.workers_to_choose(request.user)
    gpus = check_suggestions(_last_succeeded(target))["gpus"]
    saved = {name: getattr(target, name) for name in CONNECTION_VALUES}
    saved.update({
        "working_dir": target.working_dir, "python_path": target.python_path, "cpu_arch": target.cpu_arch,
        "runtimes": target.runtimes, "gpu_ids": "\n".join(target.gpu_ids), "concurrency": target.concurrency,
        "gpu_detected": [str(g.get("index")) for g in gpus if str(g.get("index")) in target.gpu_ids],
        "dataset_transfer": target.dataset_transfer, "enabled": target.enabled,
        "dataset_cache_limit_gib": target.dataset_cache_limit_gib,
        "gpu_busy_wait_seconds": target.gpu_busy_wait_seconds,
    })
    # Worker for this connection starts with the worker of the last check, if it is online.
    last = target.last_check_worker_id
    saved["worker"] = str(last) if any(w.pk == last for w in workers) else ""
    jobs = list(locks.active_jobs(target)[:5]) if jobs is None else jobs
    if data is not None:
        locked = [name for name in str(data.get("locked_fields", "")).split(",") if name in locks.LOCKED_FIELDS]
    else:
        locked = list(locks.LOCKED_FIELDS) if jobs else []
    if data is None and initial is None:
        initial = saved
    elif data is None:  # redrawn from what was sent: the locked fields were not sent, they keep their values
        keep = [*locked, *(["gpu_detected"] if "gpu_ids" in locked else [])]
        initial = {**initial, **{name: saved[name] for name in keep if name in saved}}
    else:
        initial = saved  # a disabled field's value is its initial one
    if jobs:
        reason = _("Cannot change while Jobs %(jobs)s are queued or running on this computer.") % {
            "jobs": ", ".join(str(job.pk) for job in jobs)}
    else:
        reason = _("Cannot change while Jobs are queued or running on this computer.")
    return EditForm(data, initial=initial, workers=workers, gpus=gpus, locked=locked, locked_reason=reason)


def _render_edit(request, target, *, form=None, initial=None, check=None, locked=False, connection_saved=False):
    jobs = list(locks.active_jobs(target)[:5])
    form = form or _edit_form(request, target, initial=initial, jobs=jobs)
    succeeded = check if check is not None and check.status == CheckStatus.SUCCEEDED else _last_succeeded(target)
    if succeeded is not None and check is not None and succeeded.pk == check.pk:
        # Check again refreshes the candidates (GPUs too); the values already entered stay.
        form.gpus = check_suggestions(check)["gpus"]
        form.fields["gpu_detected"].choices = [(str(g.get("index")), gpu_label(g)) for g in form.gpus]
    if not form.is_bound:  # the detected GPUs are ticked where GPU IDs already name them
        gpu_ids = str(form["gpu_ids"].value() or "").split()
        form.initial["gpu_detected"] = [value for value, _label in form.fields["gpu_detected"].choices
                                        if value in gpu_ids]
    worker = form.chosen_worker()
    _mark_follow(form)
    tab = (initial or {}).get("tab") or request.POST.get("tab") or request.GET.get("tab") or "connection"
    if form.is_bound and form.errors:  # open the tab that shows the first error
        settings_errors = any(name in form.errors for name in SettingsForm.base_fields)
        connection_errors = any(name in form.errors for name in ConnectionForm.base_fields)
        tab = "settings" if settings_errors and not connection_errors else "connection"
    context = {
        "form": form,
        "target": target,
        "is_local": target.kind == Kind.LOCAL,
        "check": check_view(check, flow="edit"),
        "suggestions": check_suggestions(succeeded),
        "candidates_check": succeeded,
        "can_choose_worker": access.can_choose_worker(request.user),
        "chosen_worker": worker,
        "no_worker": not form.workers,
        "worker": worker,
        # Typing a path ending in "/" always answers: with the worker chosen now (the select is in the
        # same form), or saying to choose one.
        "can_read": access.can_choose_worker(request.user),
        "assists": _initial_assists(request, target, form, succeeded),
        "editing": True,
        "locked": locked,
        "locked_jobs": ", ".join(str(job.pk) for job in jobs),
        "connection_saved": connection_saved,
        "tab": tab if tab in ("connection", "settings") else "connection",
        "action": reverse("computer-edit", args=[target.pk]),
    }
    return _dialog(request, "computers/partials/_edit.html", context, title=_("Edit computer"), check=check)


# Check progress (polled every second; 286 ends the polling) ------------------------------------

@login_required
@require_http_methods(["GET", "POST"])
def computer_check_status(request, pk, check_id):
    target = access.managed_for(request.user, pk)
    check = get_object_or_404(ConnectionCheck.objects.select_related("requested_worker", "claimed_by"),
                              pk=check_id, target=target)
    flow = request.GET.get("flow", "details")
    if flow == "add":
        _add_flow_target(request, pk)
        if not request.htmx:
            if check.status == CheckStatus.SUCCEEDED:
                return redirect(_settings_url(target, check=check, worker=check.requested_worker_id))
            return redirect(reverse("computer-connection", args=[target.pk]) + f"?check={check.pk}")
    if flow == "edit" and not request.htmx:
        return redirect(reverse("computer-edit", args=[target.pk]) + f"?check={check.pk}")
    if flow in ("add", "edit") and check.is_open:
        return render(request, "computers/partials/_check_progress.html",
                      {"target": target, "check": check_view(check, flow=flow)})
    if flow == "add":
        if check.status == CheckStatus.SUCCEEDED:
            worker = _online_worker(request, check.requested_worker_id)
            return _into_dialog(_render_settings(request, target, check=check, worker=worker))
        initial = {name: getattr(target, name) for name in CONNECTION_VALUES}
        initial["worker"] = str(check.requested_worker_id or "")
        form = ConnectionForm(initial=initial, workers=access.workers_to_choose(request.user))
        return _into_dialog(_render_connection(request, form, target=target, check=check))
    if flow == "edit":
        return _into_dialog(_render_edit(request, target, initial=initial_from(request.POST), check=check))
    if not request.htmx:
        return redirect(reverse("computer-detail", args=[target.pk]) + "#connection-check")
    if check.is_open:
        return render(request, "computers/partials/_check_panel.html",
                      {"target": target, "manageable": True, "panel": check_view(check, flow="details")})
    # Finished: the Machine row and Suggested settings changed too, so the whole details are redrawn.
    target = access.detail_for(request.user, target.pk)
    content = render_to_string("computers/partials/_computer_details.html", _details_context(request, target),
                               request=request)
    return reswap(retarget(HttpResponseStopPolling(content), "#computer-details"), "outerHTML")


# Completing the working directory and Python paths ---------------------------------------------

@login_required
@require_POST
def computer_path_assist(request, pk):
    """Typing in Working directory or Python executable path. A path ending in "/" asks the chosen
    worker to read that directory; while it does, this answer polls itself every second."""
    target = access.managed_for(request.user, pk)
    if not access.can_choose_worker(request.user):
        raise PermissionDenied(_("Only global administrators can read directories through a worker."))
    field = request.GET.get("field")
    if field not in PATH_FIELDS:
        raise Http404("No such field.")
    check = _check_param(request.POST, target)
    worker = _online_worker(request, request.POST.get("worker"))
    if worker is None and request.POST.get("worker"):
        no_worker = _("The chosen worker is not online now, so nothing can list this directory: start it, or type "
                      "the whole path.")
    elif worker is None and request.GET.get("flow") == "edit":
        no_worker = _("Choose an online worker in Worker for this connection (Connection tab) to list this "
                      "directory, or type the whole path.")
    else:
        no_worker = _("No worker was chosen in step 1, so nothing can list this directory: press Back and choose "
                      "an online worker in Worker for this connection, or type the whole path.")
    assist = path_assist(request, target, field, request.POST.get(field, ""), _read_ids(request.POST, field),
                         check, worker, may_read=True, no_worker=no_worker)
    content = render_to_string("computers/partials/_path_assist.html", {"assist": assist, "target": target},
                               request=request)
    if request.GET.get("poll") and assist["pending"] is None:
        return HttpResponseStopPolling(content)
    return HttpResponse(content)


def path_assist(request, target, field: str, value: str, read_ids: list[int], check, worker, *, may_read: bool,
                no_worker: str = ""):
    """The candidates for one path field: what the check found, plus the entries of the directory the
    typed path is in once the worker has read it. Hidden entries appear only after a typed "."."""
    suggestions = check_suggestions(check)
    options: list[dict] = []
    if field == "working_dir":
        for place in suggestions["workdirs"]:
            options.append({"value": place["path"], "label": workdir_label(place)})
    else:
        for python in suggestions["pythons"]:
            options.append({"value": python["path"], "label": f"Python {python.get('version') or '?'}"})
    value = (value or "").strip()
    directory, typed = (value[:value.rfind("/") + 1], value[value.rfind("/") + 1:]) if value.startswith("/") \
        else ("", "")
    reads = {read.pk: read for read in DirectoryRead.objects.filter(
        pk__in=read_ids, target=target, requested_by=request.user)}
    read_ids = [pk for pk in read_ids if pk in reads]
    read = next((reads[pk] for pk in reversed(read_ids) if reads[pk].path == directory), None) if directory else None
    error = pending = None
    if directory and read is None and may_read and typed == "":
        if worker is None:
            error = no_worker or _("Choose an online worker in Worker for this connection.")
        else:
            try:
                read = services.request_read(Actor.from_request(request), target, worker, directory)
            except ServiceError as failure:
                error = failure.message
            else:
                read_ids.append(read.pk)
    if read is not None:
        if read.status in (ReadStatus.QUEUED, ReadStatus.CLAIMED):
            pending = read
        elif read.status == ReadStatus.DONE:
            show_hidden = typed.startswith(".")
            for entry in read.entries:
                if entry["name"].startswith(".") and not show_hidden:
                    continue
                option = entry_option(field, directory, entry)
                if option:
                    options.append(option)
        else:
            error = str(ReadError(read.error).label) if read.error in ReadError.values else _("Failed")
    seen: set[str] = set()
    unique = [o for o in options if not (o["value"] in seen or seen.add(o["value"]))]
    return {"field": field, "options": unique, "read_ids": read_ids, "pending": pending,
            "pending_text": ReadStatus.QUEUED.label, "error": error}


def _initial_assists(request, target, form, check) -> dict:
    return {field: path_assist(request, target, field, "", [], check, None, may_read=False) for field in PATH_FIELDS}


def entry_option(field: str, directory: str, entry: dict) -> dict | None:
    kind = entry["kind"]
    if kind == EntryKind.DIR:
        return {"value": f"{directory}{entry['name']}/", "label": _("directory")}
    if field == "python_path" and kind in (EntryKind.EXEC, EntryKind.SYMLINK):
        return {"value": f"{directory}{entry['name']}",
                "label": _("executable") if kind == EntryKind.EXEC else _("link")}
    if field == "working_dir" and kind == EntryKind.SYMLINK:
        return {"value": f"{directory}{entry['name']}/", "label": _("link")}
    return None


def workdir_label(place: dict) -> str:
    parts = [_("writable") if place.get("writable") else _("not writable")]
    if isinstance(place.get("free_bytes"), int):
        parts.append(_("%(size)s free") % {"size": filesizeformat(place["free_bytes"])})
    return " · ".join(parts)


# Presenting checks ---------------------------------------------------------------------------------

def check_view(check: ConnectionCheck | None, *, flow: str) -> dict | None:
    """What the pages show of a check: its state in words, why it failed and the per-item table."""
    if check is None:
        return None
    reason = check.failure_reason or ""
    reason_text = reason_help = ""
    if reason:
        if flow == "details" and reason in DETAIL_FAILURES:
            reason_text, reason_help = DETAIL_FAILURES[reason]
        else:
            reason_text = CheckFailure(reason).label if reason in CheckFailure.values else reason
            reason_help = ADD_FAILURE_HELP.get(reason, "") if flow != "details" else ""
    return {
        "obj": check,
        "id": check.pk,
        "status": check.status,
        "status_text": CheckStatus(check.status).label,
        "open": check.is_open,
        "succeeded": check.status == CheckStatus.SUCCEEDED,
        "reason_text": reason_text,
        "reason_help": reason_help,
        "rows": check_rows(check),
        "worker": check.claimed_by.worker_id if check.claimed_by_id else (
            check.requested_worker.worker_id if check.requested_worker_id else ""),
        "finished_at": check.finished_at,
        "flow": flow,
    }


def check_rows(check: ConnectionCheck) -> list[dict]:
    rows = []
    for item in (check.result or {}).get("items", []):
        status = item.get("status")
        code = item.get("code") or ""
        resolution = ""
        if status == ItemStatus.FAILED:
            resolution = RESOLUTIONS.get(code) or item.get("resolution") or ""
        rows.append({
            "key": item.get("key"),
            "label": CHECK_ITEM_LABELS.get(item.get("key"), item.get("key")),
            "status": status,
            "status_text": ItemStatus(status).label if status in ItemStatus.values else status,
            "detail": item.get("detail") or "",
            "resolution": resolution,
        })
    return rows


def check_suggestions(check: ConnectionCheck | None) -> dict:
    """What a succeeded check offers for step 2, Edit and Suggested settings."""
    result = (check.result or {}) if check is not None and check.status == CheckStatus.SUCCEEDED else {}
    machine = result.get("machine") or {}
    pythons = [p for p in result.get("pythons", []) if isinstance(p, dict)]
    python = next((p["path"] for p in pythons if _python_ok(p.get("version"))), "")
    arch = machine.get("arch")
    return {
        "ok": bool(result),
        "python_path": python,
        "cpu_arch": arch if arch in CpuArch.values else None,
        "unknown_arch": arch if arch and arch not in CpuArch.values else None,
        "runtimes": list(result.get("runtimes", [])),
        "gpus": [g for g in result.get("gpus", []) if isinstance(g, dict) and g.get("index") is not None],
        "workdirs": [w for w in result.get("workdirs", []) if isinstance(w, dict)],
        "pythons": pythons,
    }


def gpu_difference(target: ComputeTarget, check: ConnectionCheck | None) -> dict | None:
    """The registered GPU IDs against the GPUs the last succeeded check found, when they differ (a
    computer added before its GPUs, a card added or replaced): {found, registered} as IDs to show. A
    registered ID names a GPU by nvidia-smi's index or its UUID. None when they agree, or when the check
    did not read the GPUs (its gpu item failed or was not checked)."""
    result = (check.result or {}) if check is not None and check.status == CheckStatus.SUCCEEDED else {}
    item = next((i for i in result.get("items", []) if isinstance(i, dict) and i.get("key") == "gpu"), None)
    if item is None or item.get("status") not in (ItemStatus.OK, ItemStatus.NONE):
        return None
    found = check_suggestions(check)["gpus"]
    registered = [str(g) for g in target.gpu_ids or []]
    names = [{str(g["index"]), str(g.get("uuid") or "")} for g in found]
    unknown = [g for g in registered if not any(g in n for n in names)]
    unregistered = [n for n in names if not n & set(registered)]
    if not unknown and not unregistered:
        return None
    return {"found": [str(g["index"]) for g in found], "registered": registered}


def machine_summary(check: ConnectionCheck | None) -> dict | None:
    if check is None or check.status != CheckStatus.SUCCEEDED:
        return None
    machine = (check.result or {}).get("machine") or {}
    memory = machine.get("memory_bytes")
    return {
        "arch": machine.get("arch") or "—",
        "cores": machine.get("cores"),
        "memory": f"{memory / 2**30:.1f} GiB" if isinstance(memory, (int, float)) and memory else None,
        "checked_at": check.finished_at,
    }


def _python_ok(version) -> bool:
    match = re.match(r"^(\d+)\.(\d+)", str(version or ""))
    return bool(match) and (int(match[1]), int(match[2])) >= (3, 11)


# helpers -----------------------------------------------------------------------------------------

def _add_flow_target(request, pk) -> ComputeTarget:
    """Steps 1 and 2 of Add computer belong to whoever may add this kind of computer (global admins)."""
    target = access.managed_for(request.user, pk)
    if not access.can_add(request.user, target.kind):
        raise PermissionDenied(_("Only global administrators can add SSH and Local computers; use Edit computer."))
    return target


def _last_succeeded(target) -> ConnectionCheck | None:
    return target.checks.filter(status=CheckStatus.SUCCEEDED).first()


def _check_param(params, target) -> ConnectionCheck | None:
    check_id = as_int(params.get("check"), low=1, high=BIGINT_MAX)
    if check_id is None:
        return None
    return target.checks.select_related("requested_worker", "claimed_by").filter(pk=check_id).first()


def _online_worker(request, pk):
    """A worker the user may choose (global admins; online workers reporting candidates)."""
    if not pk:
        return None
    return next((w for w in access.workers_to_choose(request.user) if str(w.pk) == str(pk)), None)


def _read_ids(params, field: str) -> list[int]:
    ids = (as_int(x, low=1, high=BIGINT_MAX) for x in str(params.get(f"{field}_reads", "")).split(","))
    return [i for i in ids if i is not None][-50:]


def _action(request) -> str:
    return request.POST.get("action", "")


def _settings_url(target, *, check=None, worker=None) -> str:
    query = [f"check={check.pk}"] if check is not None else []
    if worker:
        query.append(f"worker={worker}")
    return reverse("computer-settings", args=[target.pk]) + ("?" + "&".join(query) if query else "")


def _mark_follow(form) -> None:
    """Concurrent jobs follows the number of GPU IDs (computers.js) until the user changes it."""
    value = form["concurrency"].value()
    gpu_ids = str(form["gpu_ids"].value() or "").split()
    attrs = form.fields["concurrency"].widget.attrs
    if str(value or "") in ("", str(max(1, len(gpu_ids)))):
        attrs["data-follow-gpus"] = "1"
    else:
        attrs.pop("data-follow-gpus", None)


def initial_from(data) -> dict:
    """A submitted form as initial values: re-drawing a dialog (Refresh workers, a finished check)
    keeps what the user entered without showing errors."""
    initial = {key: data.get(key) for key in data if key not in MULTI_VALUED and key != "csrfmiddlewaretoken"}
    for key in MULTI_VALUED:
        initial[key] = data.getlist(key)
    initial["enabled"] = data.get("enabled") in ("on", "true", "1")
    return initial


def add_service_error(form, error: ServiceError) -> None:
    """A refused change on the form (mado.forms.add_service_error); a change refused because Jobs use
    the computer says so above the form and marks each locked field."""
    if error.code != "computer_in_use":
        shared_add_service_error(form, error)
        return
    form.add_error(None, error.message)
    for field, field_messages in error.fields.items():
        if field in form.fields:
            for message in field_messages:
                form.add_error(field, message)


def _dialog(request, fragment: str, context: dict, *, title: str, check: ConnectionCheck | None = None):
    """A dialog's content for HTMX, or the same content as a whole page (which reloads itself every
    two seconds while the worker runs `check`, since it has no HTMX to poll with)."""
    refresh = check is not None and check.is_open and not request.htmx
    return dialog(request, fragment, {**context, "page_title": title, "refresh": refresh}, back=reverse("computers"),
                  page="computers/dialog_page.html")


def _into_dialog(response):
    """A finished check: the answer replaces the whole dialog and ends the polling (286)."""
    done = HttpResponseStopPolling(response.content)
    if "HX-Trigger" in response:
        done["HX-Trigger"] = response["HX-Trigger"]
    return reswap(retarget(done, "#dialog-content"), "innerHTML")


def show_saved(request, target):
    """After Save (here and in the site form): the computer's details open below the list (in place of
    what was there), the list refreshes, and the dialog closes once the details are in (closing first
    would detach the form the answer belongs to)."""
    url = reverse("computer-detail", args=[target.pk])
    if not request.htmx:
        return redirect(url)
    target = access.detail_for(request.user, target.pk)
    content = render_to_string("computers/partials/_computer_details.html", _details_context(request, target),
                               request=request)
    response = _triggered(HttpResponse(content), computersChanged=True)
    response["HX-Trigger-After-Swap"] = json.dumps({"closeDialog": True})
    return push_url(reswap(retarget(response, "#computer-details"), "outerHTML"), url)


def _triggered(response, **events):
    existing = json.loads(response.get("HX-Trigger", "{}") or "{}")
    response["HX-Trigger"] = json.dumps({**existing, **events})
    return response
