"""HTML pages of the identity app: the shell, project settings (members, service accounts, tokens),
Global administration → Users, and the set-password page of a one-time link."""
from __future__ import annotations

import math

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Prefetch, Q
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import Resolver404, reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import ngettext
from django.views.decorators.http import require_http_methods, require_POST

from mado import access, authentication, services
from mado.choices import Role, TokenKind
from mado.dialogs import dialog, dialog_done, dialog_shown_once, page_or_part
from mado.errors import ServiceError
from mado.exceptions import json_bad_request, json_not_found, json_server_error
from mado.forms import (
    MemberAddForm,
    MemberRoleForm,
    ServiceAccountForm,
    TokenForm,
    UserCreateForm,
    service_refusals,
)
from mado.models import ApiToken, Membership, ServiceAccount


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
    # Every project the user has a role in. A global administrator is an Admin of every project without
    # a membership row, which is why listing memberships alone left the demo admin's list empty.
    projects = [{"project": project, "role_label": Role(role).label, "global_admin": via_global_admin}
                for project, role, via_global_admin in access.projects_with_roles(request.user)]
    return render(request, "mado/global_settings.html", {
        "projects": projects, "can_manage_users": access.can_manage_users(request.user),
    })


@login_required
def project_home(request, project):
    project = access.project_for_user(request.user, project)
    role = Role(access.project_role(request.user, project))
    return render(request, "mado/project_home.html", {
        "project": project,
        "role_label": role.label,
        "is_project_admin": role == Role.ADMIN,
    })


# Members ----------------------------------------------------------------------------------------

def _members_project(request, project):
    """Project settings → Members is for project admins (global administrators included); members and
    viewers get 403, people outside the project 404."""
    project = access.project_for_user(request.user, project, Role.ADMIN)
    if not access.can_manage_members(request.user, project):
        raise PermissionDenied(_("Only project admins can manage members."))
    return project


@login_required
def members(request, project):
    project = _members_project(request, project)
    memberships = project.memberships.select_related("user").order_by("user__username")
    admins = sum(1 for m in memberships if m.role == Role.ADMIN)
    context = {"project": project, "memberships": memberships, "admin_count": admins, "is_project_admin": True}
    return page_or_part(request, "mado/members.html", "mado/partials/_member_list.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def member_add(request, project):
    project = _members_project(request, project)
    form = MemberAddForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        with service_refusals(form):
            services.set_membership(services.Actor.from_request(request), project, only_new=True, **form.cleaned_data)
            return dialog_done(request, "membersChanged", reverse("project-members", args=[project.slug]))
    return dialog(request, "mado/partials/_member_add_form.html", {"project": project, "form": form},
                  back=reverse("project-members", args=[project.slug]))


@login_required
@require_http_methods(["GET", "POST"])
def member_role(request, project, membership_id):
    project = _members_project(request, project)
    membership = get_object_or_404(Membership.objects.select_related("user"), pk=membership_id, project=project)
    form = MemberRoleForm(request.POST or None, initial={"role": membership.role})
    if request.method == "POST" and form.is_valid():
        with service_refusals(form):
            services.set_membership(services.Actor.from_request(request), project,
                                    username=membership.user.username, role=form.cleaned_data["role"])
            return dialog_done(request, "membersChanged", reverse("project-members", args=[project.slug]))
    return dialog(request, "mado/partials/_member_role_form.html",
                  {"project": project, "membership": membership, "form": form},
                  back=reverse("project-members", args=[project.slug]))


@login_required
@require_http_methods(["GET", "POST"])
def member_remove(request, project, membership_id):
    project = _members_project(request, project)
    membership = get_object_or_404(Membership.objects.select_related("user"), pk=membership_id, project=project)
    refusal = services.last_admin_refusal(project, membership, removing=True)
    if request.method == "POST" and refusal is None:
        try:
            services.remove_membership(services.Actor.from_request(request), project,
                                       username=membership.user.username)
        except ServiceError as error:
            refusal = error
        else:
            return dialog_done(request, "membersChanged", reverse("project-members", args=[project.slug]))
    return dialog(request, "mado/partials/_member_remove.html",
                  {"project": project, "membership": membership, "refusal": refusal},
                  back=reverse("project-members", args=[project.slug]))


# Global administration → Users ------------------------------------------------------------------

def _require_user_admin(request) -> None:
    if not access.can_manage_users(request.user):
        raise PermissionDenied(_("Only global administrators can manage users."))


@login_required
def users(request):
    _require_user_admin(request)
    people = (User.objects.filter(service_account__isnull=True).order_by("username")
              .prefetch_related(Prefetch("memberships", Membership.objects.select_related("project")
                                         .order_by("project__name"))))
    return page_or_part(request, "mado/users.html", "mado/partials/_user_list.html", {"people": people})


@login_required
@require_http_methods(["GET", "POST"])
def user_create(request):
    _require_user_admin(request)
    form = UserCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        actor = services.Actor.from_request(request)
        with service_refusals(form):
            user = services.create_user(actor, username=data["username"], email=data["email"],
                                        password=data["password"])
            link = None if data["password"] else _set_password_url(actor, user)
            return _user_ready(request, user, link, created=True)
    return dialog(request, "mado/partials/_user_form.html", {"form": form}, back=reverse("users"))


@login_required
@require_http_methods(["GET", "POST"])
def user_set_password_link(request, user_id):
    _require_user_admin(request)
    person = get_object_or_404(User.objects.filter(service_account__isnull=True), pk=user_id)
    error = None
    if request.method == "POST":
        try:
            link = _set_password_url(services.Actor.from_request(request), person)
        except ServiceError as refused:
            error = refused.message
        else:
            return _user_ready(request, person, link, created=False)
    return dialog(request, "mado/partials/_user_link_confirm.html", {"person": person, "error": error},
                  back=reverse("users"))


def _set_password_url(actor, user) -> str:
    uidb64, token = services.set_password_link(actor, user)
    return settings.PUBLIC_URL.rstrip("/") + reverse("set-password", args=[uidb64, token])


def _user_ready(request, person, link: str | None, *, created: bool):
    """The answer after creating a user or a new link: the link is shown once, like a token."""
    return dialog_shown_once(request, "mado/partials/_user_ready.html",
                             {"person": person, "link": link, "created": created,
                              "timeout_days": max(1, settings.PASSWORD_RESET_TIMEOUT // 86400)},
                             event="usersChanged", back=reverse("users"))


class SetPasswordView(auth_views.PasswordResetConfirmView):
    """The page a one-time set-password link opens. Django's password-reset tokens: the link stops
    working once a password is set. The password is written by services.set_password (audited)."""

    template_name = "registration/set_password.html"
    post_reset_login = False

    def get_user(self, uidb64):
        user = super().get_user(uidb64)
        if user is not None and (access.is_service_user(user) or not user.is_active):
            return None
        return user

    def form_valid(self, form):
        services.set_password(self.user, form.cleaned_data["new_password1"])
        del self.request.session[auth_views.INTERNAL_RESET_SESSION_TOKEN]
        messages.success(self.request, _("Your password is set. Sign in with it."))
        return redirect("login")


# Service accounts -------------------------------------------------------------------------------

@login_required
def service_accounts(request, project):
    project = access.project_for_user(request.user, project, Role.ADMIN)
    now = timezone.now()
    accounts = project.service_accounts.select_related("created_by").annotate(usable_tokens=Count(
        "user__api_tokens", filter=Q(user__api_tokens__revoked_at__isnull=True, user__api_tokens__expires_at__gt=now)))
    context = {"project": project, "accounts": accounts, "is_project_admin": True}
    return page_or_part(request, "mado/service_accounts.html", "mado/partials/_service_account_list.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def service_account_create(request, project):
    project = access.project_for_user(request.user, project, Role.ADMIN)
    form = ServiceAccountForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        with service_refusals(form):
            services.create_service_account(services.Actor.from_request(request), project, **form.cleaned_data)
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
        with service_refusals(form):
            token, plaintext = services.issue_service_account_token(
                services.Actor.from_request(request), account, **form.cleaned_data
            )
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
    return page_or_part(request, "mado/project_tokens.html", "mado/partials/_token_list.html", context)


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
        with service_refusals(form):
            token, plaintext = services.issue_personal_token(services.Actor.from_request(request), project,
                                                             **form.cleaned_data)
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
    # A path that matches no URL carries the resolver's list of every pattern: never shown.
    message = "" if isinstance(exception, Resolver404) else str(exception or "")
    return render(request, "404.html", {"message": message}, status=404)


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
    return dialog_shown_once(request, "mado/partials/_token_issued.html", context, event="tokensChanged", back=back)
