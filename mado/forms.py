from __future__ import annotations

from django import forms
from django.conf import settings
from django.utils.translation import gettext_lazy as _

from mado.choices import Role


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
