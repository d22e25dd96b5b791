from __future__ import annotations

from contextlib import contextmanager

from django import forms
from django.conf import settings
from django.utils.translation import gettext_lazy as _

from mado.choices import Role
from mado.errors import ServiceError


class ServiceAccountForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=64,
                           help_text=_("For example gpu-host-1-worker. Letters, digits, '.', '_' and '-'."))
    role = forms.ChoiceField(label=_("Role"), choices=Role.choices, initial=Role.MEMBER)
    description = forms.CharField(label=_("Description"), max_length=500, required=False,
                                  widget=forms.Textarea(attrs={"rows": 2}))


class TokenForm(forms.Form):
    scopes = forms.MultipleChoiceField(label=_("Scopes"), widget=forms.CheckboxSelectMultiple, choices=())
    expires_in_days = forms.IntegerField(label=_("Expires in (days)"), min_value=1, max_value=settings.TOKEN_MAX_DAYS,
                                         initial=settings.TOKEN_MAX_DAYS,
                                         help_text=_("The maximum expiration is 365 days."))
    name = forms.CharField(label=_("Note"), max_length=100, required=False)

    def __init__(self, *args, allowed_scopes: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["scopes"].choices = [(scope, scope) for scope in allowed_scopes]
        if "read" in allowed_scopes:
            self.fields["scopes"].initial = ["read"]


class MemberAddForm(forms.Form):
    username = forms.CharField(label=_("Username"), max_length=150,
                               help_text=_("An existing user's username. A global administrator creates new users."))
    role = forms.ChoiceField(label=_("Role"), choices=Role.choices, initial=Role.MEMBER)


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(label=_("Role"), choices=Role.choices)


class UserCreateForm(forms.Form):
    LINK = "link"
    PASSWORD = "password"

    username = forms.CharField(label=_("Username"), max_length=150,
                               help_text=_("Letters, digits and @ . + - _ only."))
    # Checked by services.create_user with the other fields, so one Save reports every problem.
    email = forms.CharField(label=_("E-mail address"), max_length=254,
                            widget=forms.EmailInput(attrs={"autocomplete": "off"}))
    sign_in = forms.ChoiceField(
        label=_("First sign-in"), widget=forms.RadioSelect, initial=LINK,
        choices=[(LINK, _("A one-time link where the user sets a password")),
                 (PASSWORD, _("An initial password that I hand over"))])
    password = forms.CharField(label=_("Initial password"), required=False, strip=False,
                               widget=forms.PasswordInput(render_value=True, attrs={"autocomplete": "new-password"}),
                               help_text=_("Only with an initial password. At least 8 characters, not a common one."))

    def clean(self):
        data = super().clean()
        if data.get("sign_in") == self.PASSWORD and not data.get("password"):
            self.add_error("password", _("Enter the initial password, or choose the one-time link."))
        if data.get("sign_in") == self.LINK:
            data["password"] = ""
        return data


def add_service_error(form: forms.Form, error, *, renamed: dict[str, str] | None = None) -> None:
    """Show a refusal from a service on the form: with several fields named, each field gets its own
    sentences; with one, it gets the whole sentence; otherwise the sentence goes above the form.
    `renamed` maps service field names to form field names where they differ."""
    fields = {(renamed or {}).get(name, name): messages for name, messages in error.fields.items()}
    known = {name: messages for name, messages in fields.items() if name in form.fields}
    if len(known) > 1:
        for name, messages in known.items():
            for message in messages:
                form.add_error(name, message)
        rest = [m for name, messages in fields.items() if name not in form.fields for m in messages]
        if rest:
            form.add_error(None, " ".join(rest))
    elif known:
        form.add_error(next(iter(known)), error.message)
    else:
        form.add_error(None, error.message)


@contextmanager
def service_refusals(form: forms.Form, report=add_service_error):
    """Runs a service call whose refusal (ServiceError) belongs on `form`, through `report`: the rest of
    the block (often a `return`) runs only when the call succeeded; after a refusal the view goes on
    after the block and draws the form again."""
    try:
        yield
    except ServiceError as error:
        report(form, error)
