"""Global administration → Launchers (register a launcher, its token shown once, recreate its token,
revoke it; superusers only, through sites.launchers), and the pages of site computers (seed 003): the
site form of Add computer and Edit site, and a site's details below the Computers list — job shell
versions, keys, My settings, manual submission and connection checks (through sites.services)."""
from __future__ import annotations

from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseStopPolling

from computers import access as computer_access
from computers.choices import CheckFailure, CheckStatus, Kind
from computers.views import show_saved
from mado import access
from mado.dialogs import dialog, dialog_done, dialog_shown_once, page_or_part
from mado.errors import ServiceError
from mado.forms import service_refusals
from mado.models import Project
from mado.services import Actor
from sites import allowed_hosts
from sites import known_hosts as kh
from sites import checks as site_checks
from sites import keys as site_keys
from sites import launchers, services
from sites import submissions as site_submissions
from sites.choices import MAX_KNOWN_HOSTS_BYTES, AccountKind, SubmissionMethod
from sites.forms import (
    AUTOMATIC_FIELDS,
    JobShellForm,
    MySettingsForm,
    SiteForm,
    add_errors,
    add_field_errors,
    duration_text,
    site_initial,
    variables_text,
)
from sites.models import JobShell, Launcher, LauncherKey, SiteCheck


PAGE = "sites/dialog_page.html"


class LauncherForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=64,
                           help_text=_("Letters, digits, '.', '_' or '-'; for example the host it runs on."))
    project = forms.ModelChoiceField(label=_("Project"), queryset=Project.objects.order_by("slug"),
                                     to_field_name="slug",
                                     help_text=_("The project the launcher's token belongs to."))
    allowed_hosts = forms.CharField(
        label=_("Allowed hosts"), required=False,
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false", "autocomplete": "off", "class": "mono"}),
        help_text=_("The hosts this launcher may log in to, one pattern per line, such as *.hpc.example.ac.jp or "
                    "login[1-4].example.org (* and ? match any characters, [1-4] one of them; upper and lower "
                    "case are the same). Sites may name only matching hosts and jump hosts. Empty: nowhere."))


class AllowedHostsForm(forms.Form):
    allowed_hosts = LauncherForm.base_fields["allowed_hosts"]


def _require_global_admin(request) -> None:
    if not access.is_global_admin(request.user):
        raise PermissionDenied(_("Only global administrators manage launchers."))


def _rows():
    rows = []
    for launcher in Launcher.objects.select_related("token__project", "created_by"):
        project = launchers.project_of(launcher)
        rows.append({"launcher": launcher, "project": project, "state": launchers.state_of(launcher),
                     "last_used": launchers.last_used(launcher),
                     "outside": [site.target for site in launchers.outside_allowed_hosts(launcher)]})
    return rows


@login_required
def launcher_list(request):
    _require_global_admin(request)
    return page_or_part(request, "sites/launchers.html", "sites/partials/_launcher_list.html", {"rows": _rows()})


@login_required
@require_http_methods(["GET", "POST"])
def launcher_create(request):
    _require_global_admin(request)
    form = LauncherForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        with service_refusals(form):
            launcher, plaintext = launchers.register_launcher(Actor.from_request(request), form.cleaned_data["name"],
                                                              form.cleaned_data["project"],
                                                              form.cleaned_data["allowed_hosts"])
            return _token_shown_once(request, launcher, plaintext)
    return dialog(request, "sites/partials/_launcher_form.html", {"form": form}, back=reverse("launchers"), page=PAGE)


@login_required
@require_http_methods(["GET", "POST"])
def launcher_token(request, launcher_id):
    _require_global_admin(request)
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
def launcher_allowed_hosts(request, launcher_id):
    """Allowed hosts: the host name patterns the launcher may log in to (global administrators)."""
    _require_global_admin(request)
    launcher = get_object_or_404(Launcher, pk=launcher_id)
    form = AllowedHostsForm(request.POST or None, initial={"allowed_hosts": "\n".join(launcher.allowed_hosts or [])})
    if request.method == "POST" and form.is_valid():
        with service_refusals(form):
            launchers.set_allowed_hosts(Actor.from_request(request), launcher, form.cleaned_data["allowed_hosts"])
            return dialog_done(request, "launchersChanged", reverse("launchers"))
    context = {"launcher": launcher, "form": form, "action": reverse("launcher-allowed-hosts", args=[launcher.pk]),
               "outside": [site.target for site in launchers.outside_allowed_hosts(launcher)]}
    return dialog(request, "sites/partials/_launcher_allowed_hosts.html", context, back=reverse("launchers"),
                  page=PAGE)


@login_required
@require_http_methods(["GET", "POST"])
def launcher_revoke(request, launcher_id):
    _require_global_admin(request)
    launcher = get_object_or_404(Launcher, pk=launcher_id)
    if request.method == "POST":
        launchers.revoke(Actor.from_request(request), launcher)
        return dialog_done(request, "launchersChanged", reverse("launchers"))
    context = {"launcher": launcher, "action": reverse("launcher-revoke", args=[launcher.pk])}
    return dialog(request, "sites/partials/_launcher_revoke.html", context, back=reverse("launchers"), page=PAGE)


def _token_shown_once(request, launcher, plaintext):
    launcher = Launcher.objects.select_related("token__project").get(pk=launcher.pk)
    context = {"launcher": launcher, "token": launcher.token, "plaintext": plaintext}
    return dialog_shown_once(request, "sites/partials/_launcher_token.html", context, event="launchersChanged",
                             back=reverse("launchers"), page=PAGE)


# Site computers (seed 003): Add computer with Type Site, the details below the list, Edit site -------

DETAILS = "computers/partials/_computer_details.html"
COMPUTER_PAGE = "computers/dialog_page.html"


def add_site(request):
    """Add computer for a site: the one-screen form (global administrators reach it by choosing Site
    in Type, everyone else gets only this). Called by computers.views.computer_add."""
    if access.is_service_user(request.user):
        raise PermissionDenied(_("Service accounts cannot add computers; a person adds the site and owns it."))
    if request.method == "GET" or request.POST.get("action") == "refresh":
        form = SiteForm(initial=_refresh_initial(request.POST) if request.method == "POST" else {})
        return _render_site_form(request, form)
    return _submit_site_form(request, SiteForm(request.POST))


@login_required
@require_http_methods(["GET", "POST"])
def site_edit(request, pk):
    """Edit site: the same screen as Add computer without the template (the job shell is versioned in
    the details). Owners and global administrators."""
    target, site = _managed_site(request, pk)
    if request.method == "GET" or request.POST.get("action") == "refresh":
        initial = _refresh_initial(request.POST) if request.method == "POST" else site_initial(target, site)
        form = SiteForm(initial=initial, editing=True, current_launcher=site.launcher)
        return _render_site_form(request, form, target=target)
    return _submit_site_form(request, SiteForm(request.POST, editing=True, current_launcher=site.launcher), target)


def _submit_site_form(request, form: SiteForm, target=None):
    """Save of Add computer (a new site) or Edit site (`target`)."""
    actor = Actor.from_request(request)
    if form.is_valid():
        with service_refusals(form, add_errors):
            if target is None:
                return show_saved(request, services.create_site(actor, form.site_values()))
            return show_saved(request, services.update_site(actor, target, form.site_values()))
    else:  # what else is wrong, so that one Save reports every field
        add_field_errors(form, services.site_errors(actor, form.site_values(), target=target))
    return _render_site_form(request, form, target=target)


def _render_site_form(request, form: SiteForm, *, target=None):
    if form.is_bound:
        _surface_hidden_errors(form)
    known_hosts = form["known_hosts"].value() or ""
    context = {
        "form": form,
        "target": target,
        "choose_kind": target is None and computer_access.can_add(request.user, Kind.SSH),
        "kind_choices": [(Kind.SSH.value, Kind.SSH.label), *([(Kind.LOCAL.value, Kind.LOCAL.label)]
                                                            if settings.DEV_MODE else []),
                         (Kind.SITE.value, Kind.SITE.label)],
        "fingerprints": _fingerprints(known_hosts),
        "action": reverse("site-edit", args=[target.pk]) if target else reverse("computer-add"),
    }
    title = _("Edit site %(name)s") % {"name": target.name} if target else _("Add computer")
    return dialog(request, "sites/partials/_site_form.html", {**context, "page_title": title},
                  back=reverse("computers"), page=COMPUTER_PAGE)


def _surface_hidden_errors(form: SiteForm) -> None:
    """A refusal about a field this choice of method or account does not show goes above the form."""
    hidden = set(AUTOMATIC_FIELDS) if form.manual else (set() if form.shared else {"ssh_user"})
    for name in sorted(hidden & set(form.errors)):
        for message in form.errors[name]:
            form.add_error(None, f"{form.fields[name].label}: {message}")


def _refresh_initial(data) -> dict:
    """A re-drawn form (another Type, Submission method or Account) keeps what was typed, without errors."""
    initial = {key: data.get(key) for key in data if key not in ("csrfmiddlewaretoken", "action", "runtimes")}
    initial["runtimes"] = data.getlist("runtimes")
    return initial


@login_required
@require_POST
def known_hosts_fingerprints(request):
    """The fingerprints of pasted known_hosts, shown under the field while the owner compares them with
    the ones the site publishes."""
    text = request.POST.get("known_hosts", "")
    if len(text.encode("utf-8")) > MAX_KNOWN_HOSTS_BYTES:
        return render(request, "sites/partials/_fingerprints.html",
                      {"fingerprints": {"error": _("known_hosts is larger than 64 KiB; paste only this site's lines."),
                                        "keys": []}})
    return render(request, "sites/partials/_fingerprints.html", {"fingerprints": _fingerprints(text)})


def _fingerprints(text: str) -> dict:
    try:
        return {"keys": [key.display() for key in kh.parse(text or "")], "error": ""}
    except kh.KnownHostsError as exc:
        return {"keys": [], "error": str(exc)}


# The details of a site ------------------------------------------------------------------------------

def site_details_context(request, target, **extra) -> dict:
    """What the details of a site show to this user: the summary, the job shell and its versions, the
    keys, My settings, the manual instructions and the connection checks."""
    user = request.user
    site = services.site_settings_of(target)
    manageable = computer_access.can_manage(user, target)
    usable = computer_access.can_use(user, target)
    service_user = access.is_service_user(user)
    owner = target.owner_id == user.pk
    mine = services.my_settings(user, target)
    versions = list(JobShell.objects.filter(target=target).select_related("created_by").order_by("-version")[:50])
    current = versions[0] if versions else None
    automatic = site.submission == SubmissionMethod.AUTOMATIC
    context = {
        "target": target,
        "site": site,
        "is_site": True,
        "manageable": manageable,
        "see_connection": manageable,
        "usable": usable,
        "automatic": automatic,
        "fingerprints": _fingerprints(site.known_hosts) if manageable else None,
        "variables_text": variables_text(site.variables),
        "queue_timeout": duration_text(site.queue_timeout_seconds),
        "current_shell": current,
        "versions": versions,
        "shell_form": JobShellForm(initial={"content": current.content if current else ""}),
        # The seed's "Before using someone else's computer": where a job shell would run under the
        # reader's own account (own-account or manual sites) on a computer someone else owns.
        "trust_warning": not owner and site.runs_under_own_account,
        "my_settings_open": usable and not service_user and site.uses_personal_accounts,
        "manual_settings_note": usable and not service_user and site.submission == SubmissionMethod.MANUAL,
        "service_user": service_user,
        "my_settings": mine,
        "my_form": MySettingsForm(initial={"account_name": mine.account_name, "working_dir": mine.working_dir,
                                           "variables": variables_text(mine.variables)} if mine else None),
        "shared_key": _key(target, site, None) if manageable and automatic and site.account == AccountKind.SHARED
        else None,
        "my_key": _key(target, site, user) if mine is not None and site.uses_personal_accounts else None,
        "manual": manual_instructions(request, target) if not automatic else None,
        "checks": site_checks_context(request, target, site, manageable=manageable, mine=mine),
        # The launcher's allowed hosts no longer include this site's host or a jump host (managers).
        "host_refusal": allowed_hosts.site_refusal(site) if manageable and automatic and site.launcher_id else "",
    }
    context.update(extra)
    return context


def _key(target, site, user) -> dict:
    """The public key this site's launcher published for the shared account (user None) or for `user`."""
    keys = LauncherKey.objects.filter(target=target, user=user)
    if site.launcher_id:
        keys = keys.filter(launcher_id=site.launcher_id)
    key = keys.order_by("-created_at").first()
    return {"key": key, "launcher": site.launcher}


def manual_instructions(request, target, project=None, job=None, jobs=None) -> dict:
    """The commands of "Submit manually" with this computer's ID and this server's URL; `project` gives
    the link that issues a token with read and jobs:write (the Jobs page). The commands are for people
    who can submit (`can_submit`: sites.submissions.manual_submitters, for `job`, or for any of `jobs`
    waiting there when given, else for the caller's own Jobs of `project`); the others read who can
    (`who_can`)."""
    if jobs:
        decisions = [site_submissions.manual_submitters(request.user, target, job=one) for one in jobs]
        decision = next((d for d in decisions if d["can_submit"]), decisions[0])
    else:
        decision = site_submissions.manual_submitters(request.user, target, project=project, job=job)
    token_url = None
    if project is not None:
        token_url = reverse("personal-token-create", args=[project.slug]) + "?" + urlencode(
            [("scopes", "read"), ("scopes", "jobs:write")])
    return {
        "computer_id": target.pk,
        "computer": target,
        "api_url": request.build_absolute_uri("/").rstrip("/"),
        "token_url": token_url,
        "trust_warning": target.owner_id != request.user.pk,
        "is_owner": target.owner_id == request.user.pk,
        **decision,
    }


def site_checks_context(request, target, site, *, manageable: bool, mine) -> dict | None:
    """Check connection: the shared account's by owners and global administrators, one's own account
    after My settings. None when sites.checks (the launcher's connection checks) is not installed."""
    if site.submission != SubmissionMethod.AUTOMATIC:
        return None
    shared = manageable and site.account == AccountKind.SHARED
    own = mine is not None and site.uses_personal_accounts
    if not (shared or own):
        return None
    return {"mine": own and not shared,
            "latest": check_view(_latest_check(target, request.user if own and not shared else None), request.user),
            "error": ""}


def _latest_check(target, user):
    return SiteCheck.objects.filter(target=target, site_user=user).first()


CHECK_TEXT = {
    CheckStatus.QUEUED: _("Waiting for the launcher to pick up the check…"),
    CheckStatus.CLAIMED: _("The launcher is logging in…"),
}


CHECK_FAILURES = {
    CheckFailure.NOT_CLAIMED: _("The launcher did not pick up the check. Check that the launcher is running and "
                                "polls this server."),
    CheckFailure.NO_RESULT: _("No answer arrived from the launcher. Check the launcher's log."),
}


def check_view(check, user=None) -> dict | None:
    """A site check in words: its state, and why it failed (the login's error, or no launcher answer).
    Global administrators read the launcher's own message; others only what they can fix."""
    if check is None:
        return None
    result = check.result if isinstance(check.result, dict) else {}
    failed = [site_checks.failure_detail(user, check, str(item.get("detail")))
              for item in result.get("items", [])
              if isinstance(item, dict) and item.get("status") == "failed" and item.get("detail")]
    error = " ".join(failed) or str(CHECK_FAILURES.get(check.failure_reason, ""))
    return {"obj": check, "id": check.pk, "open": check.is_open, "status": check.status,
            "status_text": CHECK_TEXT.get(check.status) or CheckStatus(check.status).label,
            "error": error, "account_name": check.account_name, "finished_at": check.finished_at}


@login_required
@require_POST
def site_check_request(request, pk):
    """Check connection: the launcher logs in with the key and account (shared, or the caller's own)."""
    target = _site(computer_access.detail_for(request.user, pk))
    site = services.site_settings_of(target)
    mine = request.POST.get("mine") == "1"
    error = ""
    try:
        site_checks.request_site_check(Actor.from_request(request), target, mine=mine)
    except ServiceError as failure:
        error = failure.message
    if not request.htmx:
        if error:
            messages.error(request, error)
        return redirect(reverse("computer-detail", args=[target.pk]) + "#site-check")
    panel = {"mine": mine, "latest": check_view(_latest_check(target, request.user if mine else None), request.user),
             "error": error}
    return render(request, "sites/partials/_site_check.html", {"target": target, "site": site, "checks": panel})


@login_required
@require_POST
def site_key_recreate(request, pk):
    """Recreate a key (the shared account's, or the caller's own); the details then say it is on its way."""
    target = computer_access.detail_for(request.user, pk)
    try:
        site_keys.request_recreate(Actor.from_request(request), target, mine=request.POST.get("mine") == "1")
    except ServiceError as failure:
        messages.error(request, failure.message)
    else:
        messages.success(request, _("The launcher makes a new key on its next poll; the new public key then "
                                    "appears here. The old key works until then."))
    return redirect(reverse("computer-detail", args=[target.pk]) + "#site-keys")


@login_required
@require_GET
def site_check_status(request, pk, check_id):
    """The check's progress, polled every second; 286 once it ended."""
    target = _site(computer_access.detail_for(request.user, pk))
    site = services.site_settings_of(target)
    check = get_object_or_404(SiteCheck, pk=check_id, target=target)
    mine = check.site_user_id is not None
    if (mine and check.site_user_id != request.user.pk) or (not mine and not computer_access.can_manage(
            request.user, target)):
        raise Http404("No such check of yours.")
    panel = {"mine": mine, "latest": check_view(check, request.user), "error": ""}
    content = render_to_string("sites/partials/_site_check.html", {"target": target, "site": site, "checks": panel},
                               request=request)
    return HttpResponse(content) if check.is_open else HttpResponseStopPolling(content)


@login_required
@require_POST
def site_job_shell_save(request, pk):
    """Save the job shell: a new version only when the content differs from the current one."""
    target = _site(computer_access.detail_for(request.user, pk))
    if not computer_access.can_manage(request.user, target):
        raise PermissionDenied(_("Only the computer's owner and global administrators can save its job shell."))
    form = JobShellForm(request.POST)
    form.is_valid()
    outcome = None
    with service_refusals(form, add_errors):
        shell, created = services.save_job_shell(Actor.from_request(request), target,
                                                 form.cleaned_data.get("content", ""))
        outcome = {"created": created, "version": shell.version}
        form = JobShellForm(initial={"content": shell.content})
    if not request.htmx:
        return _back_to_details(request, target, "#job-shell", form, outcome and _shell_message(outcome))
    context = site_details_context(request, target, shell_form=form, shell_outcome=outcome)
    return render(request, "sites/partials/_job_shell.html", context)


def _back_to_details(request, target, section: str, form, success: str | None):
    """Without HTMX a save in the details goes back to its section there, saying what happened."""
    if success:
        messages.success(request, success)
    else:
        messages.error(request, " ".join(str(e) for errors in form.errors.values() for e in errors))
    return redirect(reverse("computer-detail", args=[target.pk]) + section)


def _shell_message(outcome: dict) -> str:
    if outcome["created"]:
        return _("Saved as version %(version)s.") % {"version": outcome["version"]}
    return _("The content is the same as version %(version)s; no new version was made.") % {
        "version": outcome["version"]}


@login_required
@require_GET
def site_job_shell_version(request, pk, version):
    """One version of the job shell, old or current: everyone who may use the site reads it (it runs
    under their Jobs)."""
    target = computer_access.detail_for(request.user, pk)
    shell = get_object_or_404(JobShell.objects.select_related("created_by"), target=target, version=version)
    context = {"target": target, "shell": shell, "page_title": _("Job shell version %(version)s") % {
        "version": shell.version}}
    return dialog(request, "sites/partials/_job_shell_version.html", context,
                  back=reverse("computer-detail", args=[target.pk]), page=COMPUTER_PAGE)


@login_required
@require_POST
def site_my_settings(request, pk):
    """Save My settings: the account name, working directory and variables of the caller."""
    if access.is_service_user(request.user):
        raise PermissionDenied(_("Service accounts cannot have their own settings."))
    target = computer_access.detail_for(request.user, pk)
    form = MySettingsForm(request.POST)
    form.is_valid()
    saved = False
    with service_refusals(form, add_errors):
        services.save_my_settings(Actor.from_request(request), target, {
            "account_name": form.cleaned_data.get("account_name", ""),
            "working_dir": form.cleaned_data.get("working_dir", ""),
            "variables": form.cleaned_data.get("variables", "")})
        saved = True
    if not request.htmx:
        return _back_to_details(request, target, "#my-settings", form, saved and _("Saved your settings."))
    # The key section and Check connection depend on My settings: the whole details are drawn again.
    return render(request, DETAILS, site_details_context(request, target, **(
        {"my_saved": True} if saved else {"my_form": form})))


def _managed_site(request, pk):
    target = _site(computer_access.managed_for(request.user, pk))
    return target, services.site_settings_of(target)


def _site(target):
    """The site pages answer 404 for any other kind of computer."""
    if target.kind != Kind.SITE:
        raise Http404("This computer is not a site.")
    return target

