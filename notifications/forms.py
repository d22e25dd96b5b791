from __future__ import annotations

from django import forms
from django.conf import settings
from django.utils.translation import gettext_lazy as _

from notifications.choices import JOB_EVENTS, Channel, Event


class RuleForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=100)
    events = forms.MultipleChoiceField(label=_("Events"), widget=forms.CheckboxSelectMultiple, choices=Event.choices)
    computer = forms.ModelChoiceField(label=_("Computer"), queryset=None, required=False,
                                      empty_label=_("Every computer"))
    only_my_jobs = forms.BooleanField(label=_("Only my jobs"), required=False,
                                      help_text=_("Job events only for the jobs you created."))
    channel = forms.ChoiceField(label=_("Channel"), choices=Channel.choices, widget=forms.RadioSelect,
                                initial=Channel.EMAIL)
    email_to = forms.CharField(label=_("E-mail addresses"), required=False, max_length=2000,
                               help_text=_("Separate addresses with commas."))
    webhook_url = forms.CharField(label=_("Webhook URL"), required=False, max_length=1000,
                                  help_text=_("An https:// or http:// URL. Each POST is signed with X-Mado-Signature."))
    language = forms.ChoiceField(label=_("Language of the messages"), choices=settings.LANGUAGES)

    def __init__(self, *args, computers, admin: bool, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["computer"].queryset = computers
        if not admin:
            # A member's rule: their own jobs, by e-mail to themselves.
            self.fields["events"].choices = [(e.value, e.label) for e in JOB_EVENTS]
            for name in ("only_my_jobs", "channel", "email_to", "webhook_url"):
                del self.fields[name]
            self.member_email = user.email
