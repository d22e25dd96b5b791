"""HTML pages of the identity app: the shell, project settings, service accounts and tokens."""
from __future__ import annotations

import json
import math

from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm
from django.db.models import Count, Q
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import ngettext
from django.views.decorators.http import require_http_methods, require_POST

from mado import access, authentication, services
from mado.choices import Role, TokenKind
from mado.dialogs import dialog, dialog_done
from mado.errors import ServiceError
from mado.exceptions import json_bad_request, json_not_found, json_server_error
from mado.forms import ServiceAccountForm, TokenForm, add_service_error
from mado.models import ApiToken, ServiceAccount


@login_required
def home(request):
    wanted = request.GET.get("project")
    if wanted:  # the project switcher, also without JavaScript
        project = access.project_for_user(request.user, wanted)
        return redirect("project-home", project=project.slug)
    project = access.projects_visible_to(request.user).first()
    if project is not None:
        return redirect("project-home", project=project.slug)
    return render(request, "mado/home.html")


@login_required
def global_settings(request):
    memberships = request.user.memberships.select_related("project")
    return render(request, "mado/global_settings.html", {"memberships": memberships})


@login_required
def project_home(request, project):
    project = access.project_for_user(request.user, project)
    role = Role(access.project_role(request.user, project))
    return render(request, "mado/project_home.html", {
        "project": project,
        "role_label": role.label,
        "is_project_admin": role == Role.ADMIN,
    })


# Service accounts -------------------------------------------------------------------------------

@login_required
def service_accounts(request, project):
    project = access.project_for_user(request.user, project, Role.ADMIN)
    now = timezone.now()
    accounts = project.service_accounts.select_related("created_by").annotate(usable_tokens=Count(
        "user__api_tokens", filter=Q(user__api_tokens__revoked_at__isnull=True, user__api_tokens__expires_at__gt=now)))
    context = {"project": project, "accounts": accounts, "is_project_admin": True}
    if request.htmx and request.GET.get("fragment") == "list":
        return render(request, "mado/partials/_service_account_list.html", context)
    return render(request, "mado/service_accounts.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def service_account_create(request, project):
    project = access.project_for_user(request.user, project, Role.ADMIN)
    form = ServiceAccountForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            services.create_service_account(services.Actor.from_request(request), project, **form.cleaned_data)
        except ServiceError as error:
            add_service_error(form, error)
        else:
            return dialog_done(request, "serviceAccountsChanged", reverse("service-accounts", args=[project.slug]))
    return dialog(request, "mado/partials/_service_account_form.html", {"project": project, "form": form},
                   back=reverse("service-accounts", args=[project.slug]))


@login_required
@require_http_methods(["GET", "POST"])
def service_account_token_create(request, project, account_id):
    project = access.project_for_user(request.user, project, Role.ADMIN)
    account = get_object_or_404(ServiceAccount.objects.select_related("user"), pk=account_id, project=project)
    allowed = services.allowed_scopes(account.user, project, TokenKind.SERVICE)
    form = TokenForm(request.POST or None, allowed_scopes=allowed)
    context = {"project": project, "account": account, "form": form,
               "action": reverse("service-account-token-create", args=[project.slug, account.pk])}
    if account.is_disabled:
        form.add_error(None, _("The Service Account %(name)s is disabled; create a new one instead.")
                       % {"name": account.name})
    elif request.method == "POST" and form.is_valid():
        try:
            token, plaintext = services.issue_service_account_token(
                services.Actor.from_request(request), account, **form.cleaned_data
            )
        except ServiceError as error:
            add_service_error(form, error)
        else:
            return _token_shown_once(request, project, token, plaintext, holder=account.name,
                                     back=reverse("service-accounts", args=[project.slug]))
    return dialog(request, "mado/partials/_token_form.html", context, back=reverse("service-accounts", args=[project.slug]))


@login_required
@require_http_methods(["GET", "POST"])
def service_account_disable(request, project, account_id):
    project = access.project_for_user(request.user, project, Role.ADMIN)
    account = get_object_or_404(ServiceAccount, pk=account_id, project=project)
    if request.method == "POST":
        services.disable_service_account(services.Actor.from_request(request), account)
        return dialog_done(request, "serviceAccountsChanged", reverse("service-accounts", args=[project.slug]))
    return dialog(request, "mado/partials/_service_account_disable.html", {"project": project, "account": account},
                   back=reverse("service-accounts", args=[project.slug]))


# Tokens -----------------------------------------------------------------------------------------

@login_required
def project_tokens(request, project):
    project = access.project_for_user(request.user, project)
    context = {
        "project": project,
        "tokens": access.tokens_visible_to(request.user, project),
        "is_project_admin": access.has_role(request.user, project, Role.ADMIN),
        "can_issue": access.has_role(request.user, project, Role.MEMBER),
    }
    if request.htmx and request.GET.get("fragment") == "list":
        return render(request, "mado/partials/_token_list.html", context)
    return render(request, "mado/project_tokens.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def personal_token_create(request, project):
    project = access.project_for_user(request.user, project, Role.MEMBER)
    allowed = services.allowed_scopes(request.user, project, TokenKind.PERSONAL)
    initial = None
    if request.method == "GET" and request.GET.getlist("scopes"):
        # Shortcuts such as the manual-submission instructions preselect the scopes they need.
        initial = {"scopes": [s for s in request.GET.getlist("scopes") if s in allowed]}
    form = TokenForm(request.POST or None, allowed_scopes=allowed, initial=initial)
    context = {"project": project, "form": form, "action": reverse("personal-token-create", args=[project.slug])}
    if request.method == "POST" and form.is_valid():
        try:
            token, plaintext = services.issue_personal_token(services.Actor.from_request(request), project,
                                                             **form.cleaned_data)
        except ServiceError as error:
            add_service_error(form, error)
        else:
            return _token_shown_once(request, project, token, plaintext, holder=request.user.username,
                                     back=reverse("project-tokens", args=[project.slug]))
    return dialog(request, "mado/partials/_token_form.html", context, back=reverse("project-tokens", args=[project.slug]))


@login_required
@require_POST
def token_revoke(request, project, token_id):
    project = access.project_for_user(request.user, project)
    token = get_object_or_404(access.tokens_visible_to(request.user, project), pk=token_id)
    services.revoke_token(services.Actor.from_request(request), token)
    if request.htmx:
        return render(request, "mado/partials/_token_row.html", {
            "token": ApiToken.objects.get(pk=token.pk), "project": project, "can_revoke": False,
        })
    return redirect("project-tokens", project=project.slug)


# Sign-in ----------------------------------------------------------------------------------------

def sign_in_locked_out(request, original_response=None, credentials=None):
    """django-axes' lock-out answer (AXES_LOCKOUT_CALLABLE), for /login/ and /admin/login/: the sign-in
    page again, saying why and for how long, with 429 and Retry-After."""
    seconds = authentication.sign_in_retry_after(request, credentials)
    minutes = max(1, math.ceil(seconds / 60))
    message = ngettext(
        "Too many failed sign-ins for this account or from this address. Try again in %(minutes)d minute, "
        "or ask a global administrator to unlock it.",
        "Too many failed sign-ins for this account or from this address. Try again in %(minutes)d minutes, "
        "or ask a global administrator to unlock it.",
        minutes,
    ) % {"minutes": minutes}
    form = AuthenticationForm(request, initial={"username": request.POST.get("username", "")})
    response = render(request, "registration/login.html", {
        "form": form, "locked_out": message, "next": request.POST.get("next", ""),
    }, status=429)
    response["Retry-After"] = str(seconds)
    return response


# Error pages ------------------------------------------------------------------------------------

def not_found(request, exception=None):
    if request.path.startswith("/api/"):
        return json_not_found(request, exception)
    return render(request, "404.html", {"message": str(exception or "")}, status=404)


def bad_request(request, exception=None):
    if request.path.startswith("/api/"):
        return json_bad_request(request, exception)
    from django.views.defaults import bad_request as default_bad_request

    return default_bad_request(request, exception)


def server_error(request):
    if request.path.startswith("/api/"):
        return json_server_error(request)
    return render(request, "500.html", status=500)


# helpers ----------------------------------------------------------------------------------------

def _token_shown_once(request, project, token, plaintext, *, holder: str, back: str):
    context = {"project": project, "token": token, "plaintext": plaintext, "holder": holder}
    response = dialog(request, "mado/partials/_token_issued.html", context, back=back)
    response["Cache-Control"] = "no-store"
    if request.htmx:
        response["HX-Trigger"] = json.dumps({"tokensChanged": True})
    return response
