"""Forms of the site pages (seed 003): the one-screen site form of Add computer and Edit site, the job
shell editor and My settings. They only parse what the browser sends; sites.services holds the rules
and their messages, so the pages and the API refuse the same things with the same words."""
from __future__ import annotations

from django import forms
from django.conf import settings
from django.utils.translation import gettext_lazy as _

from computers.choices import Runtime, Visibility
from jobs.forms import parse_walltime
from sites.choices import (
    DEFAULT_MAX_ACTIVE_SUBMISSIONS,
    DEFAULT_QUEUE_TIMEOUT,
    AccountKind,
    SubmissionMethod,
    Template,
)
from sites.models import Launcher

# Fields that only an automatic site has; a manual site's form leaves them out.
AUTOMATIC_FIELDS = ("launcher", "host", "port", "jump_hosts", "known_hosts", "account", "ssh_user")
SITE_VALUES = ("name", "visibility", "submission", "launcher", "host", "port", "jump_hosts", "known_hosts",
               "account", "ssh_user", "working_dir", "runner_python", "runner_api_url", "variables",
               "queue_timeout_seconds", "max_active_submissions", "runtimes")
MONO = {"spellcheck": "false", "autocomplete": "off", "class": "mono"}


def duration_text(seconds: int) -> str:
    """7 days as "7d", 90 minutes as "1h30m": what the Queue timeout field shows and accepts back."""
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def variables_text(variables: dict) -> str:
    return "\n".join(f"{name}={value}" for name, value in (variables or {}).items())


class SiteForm(forms.Form):
    """Add computer (Type: Site) and Edit site: every setting of a site on one screen."""

    name = forms.CharField(label=_("Name"), max_length=64, required=False,
                           help_text=_("Shown on screen and in the computer choices of Jobs"))
    visibility = forms.ChoiceField(
        label=_("Visibility"), choices=Visibility.choices, initial=Visibility.PRIVATE, required=False,
        help_text=_("With Private (the default), only Jobs of you and of the Service Accounts you created run. "
                    "To let other people use it as well, choose Public"))
    submission = forms.ChoiceField(label=_("Submission method"), choices=SubmissionMethod.choices,
                                   initial=SubmissionMethod.AUTOMATIC, widget=forms.RadioSelect,
                                   required=False)
    launcher = forms.ChoiceField(label=_("Launcher"), required=False,
                                 help_text=_("The launcher that logs in to this site. A global administrator "
                                             "registers launchers"))
    host = forms.CharField(label=_("Host"), max_length=255, required=False,
                           help_text=_("The login node the launcher connects to"))
    port = forms.IntegerField(label=_("Port"), initial=22, required=False)
    jump_hosts = forms.CharField(label=_("Jump hosts"), required=False,
                                 widget=forms.Textarea(attrs={"rows": 2, **MONO}),
                                 help_text=_("[user@]host[:port], one per line, in the order the launcher hops "
                                             "through them"))
    known_hosts = forms.CharField(label=_("known_hosts"), required=False,
                                  widget=forms.Textarea(attrs={"rows": 4, **MONO}),
                                  help_text=_("Check the output of ssh-keyscan against the host key fingerprints "
                                              "the site publishes, then paste it"))
    account = forms.ChoiceField(label=_("Account"), choices=AccountKind.choices, initial=AccountKind.SHARED,
                                widget=forms.RadioSelect, required=False,
                                help_text=_("Shared account: everyone runs under one account. Your own account: "
                                            "Jobs run under the account of the person who requested them"))
    ssh_user = forms.CharField(label=_("Shared account name"), max_length=64, required=False)
    working_dir = forms.CharField(label=_("Working directory"), max_length=1024, required=False,
                                  help_text=_("A location visible at the same path from the compute nodes as well"))
    runner_python = forms.CharField(label=_("Runner Python"), max_length=1024, required=False,
                                    initial="/usr/bin/python3", help_text=_("Python 3.11 or later"))
    runner_api_url = forms.CharField(label=_("API URL seen from the runner"), max_length=2000, required=False,
                                     help_text=_("This server's URL as the compute nodes reach it"))
    variables = forms.CharField(label=_("Variables"), required=False, widget=forms.Textarea(attrs={"rows": 3, **MONO}),
                                help_text=_("NAME=VALUE, one per line (such as PARTITION=gpu, GROUP=…)"))
    template = forms.ChoiceField(label=_("Job shell template"), choices=Template.choices, initial=Template.SLURM,
                                 required=False,
                                 help_text=_("Then adjust the queue name, resources and group to match the site's "
                                             "documentation in the computer's details"))
    runtimes = forms.MultipleChoiceField(label=_("Supported runtimes"), choices=Runtime.choices, required=False,
                                         widget=forms.CheckboxSelectMultiple,
                                         help_text=_("None checked: those of the job shell template"))
    queue_timeout = forms.CharField(label=_("Queue timeout"), max_length=40, required=False,
                                    initial=duration_text(DEFAULT_QUEUE_TIMEOUT),
                                    help_text=_("A submitted Job whose runner has not started by then fails, "
                                                "such as 7d, 12h or 90m"))
    max_active_submissions = forms.IntegerField(label=_("Max active submissions"), required=False,
                                                initial=DEFAULT_MAX_ACTIVE_SUBMISSIONS,
                                                help_text=_("Jobs submitted or running on this site at once"))

    def __init__(self, *args, editing: bool = False, current_launcher=None, **kwargs):
        super().__init__(*args, label_suffix="", **kwargs)
        launchers = Launcher.objects.filter(revoked_at__isnull=True).order_by("name")
        choices = [(str(launcher.pk), launcher.name) for launcher in launchers]
        if current_launcher is not None and current_launcher.is_revoked:
            # A site keeps showing its revoked launcher, so the owner sees why it must be changed.
            choices.append((str(current_launcher.pk), _("%(name)s (revoked)") % {"name": current_launcher.name}))
        self.fields["launcher"].choices = [("", "—")] + choices
        self.no_launcher = not launchers
        if editing:
            del self.fields["template"]  # the job shell changes in the details, as a new version
        if not self.initial.get("runner_api_url") and not self.is_bound:
            self.initial["runner_api_url"] = settings.PUBLIC_URL.rstrip("/")

    def value_of(self, name: str) -> str:
        return str(self[name].value() or "")

    @property
    def manual(self) -> bool:
        return self.value_of("submission") == SubmissionMethod.MANUAL

    @property
    def shared(self) -> bool:
        return self.value_of("account") != AccountKind.PERSONAL

    def clean_queue_timeout(self):
        text = (self.cleaned_data.get("queue_timeout") or "").strip().lower()
        if not text:
            return DEFAULT_QUEUE_TIMEOUT
        seconds = parse_walltime(text)
        if seconds is None:
            raise forms.ValidationError(_("Write the queue timeout as 7d, 12h, 90m or a number of seconds."))
        return seconds

    def site_values(self) -> dict:
        """What sites.services.create_site/update_site take. A manual site drops the launcher's fields.
        After a refused form (is_valid() False), the fields it could read: sites.services.site_errors
        then finds what else is wrong, so one Save shows every problem."""
        data = dict(self.cleaned_data)
        values = {name: data.get(name) for name in SITE_VALUES if name in data}
        if "queue_timeout" in data:
            values["queue_timeout_seconds"] = data["queue_timeout"]
        if "max_active_submissions" in data:
            values["max_active_submissions"] = (DEFAULT_MAX_ACTIVE_SUBMISSIONS if data["max_active_submissions"] is None
                                                else data["max_active_submissions"])
        manual = data.get("submission") == SubmissionMethod.MANUAL
        if "port" in data:
            values["port"] = 22 if data["port"] is None and manual else ("" if data["port"] is None else data["port"])
        if "name" in data:
            values["name"] = (data["name"] or "").strip()
        values["runtimes"] = list(data.get("runtimes") or [])
        if manual:
            values.update({"launcher": None, "host": "", "port": 22, "jump_hosts": [], "known_hosts": "",
                           "account": AccountKind.SHARED, "ssh_user": ""})
        elif data.get("account") == AccountKind.PERSONAL:
            values["ssh_user"] = ""
        if "template" in data:
            values["template"] = data["template"]
        return values


def site_initial(target, site) -> dict:
    return {
        "name": target.name, "visibility": target.visibility, "submission": site.submission,
        "launcher": str(site.launcher_id or ""), "host": site.host, "port": site.port,
        "jump_hosts": "\n".join(site.jump_hosts), "known_hosts": site.known_hosts, "account": site.account,
        "ssh_user": site.ssh_user, "working_dir": site.working_dir, "runner_python": site.runner_python,
        "runner_api_url": site.runner_api_url, "variables": variables_text(site.variables),
        "runtimes": list(target.runtimes), "queue_timeout": duration_text(site.queue_timeout_seconds),
        "max_active_submissions": site.max_active_submissions,
    }


class JobShellForm(forms.Form):
    content = forms.CharField(label=_("Job shell"), required=False, strip=False,
                              widget=forms.Textarea(attrs={"rows": 18, **MONO}))


class MySettingsForm(forms.Form):
    account_name = forms.CharField(label=_("Account name"), max_length=64, required=False,
                                   help_text=_("Your account on this computer"))
    working_dir = forms.CharField(label=_("Working directory"), max_length=1024, required=False,
                                  help_text=_("Blank: the computer's working directory"))
    variables = forms.CharField(label=_("Variables"), required=False, widget=forms.Textarea(attrs={"rows": 3, **MONO}),
                                help_text=_("NAME=VALUE, one per line, such as GROUP=…"))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, label_suffix="", **kwargs)


def add_field_errors(form: forms.Form, errors: dict[str, list[str]]) -> None:
    """The refusals sites.services.site_errors found, under the fields the form has not refused itself."""
    renamed = {"queue_timeout_seconds": "queue_timeout"}
    for name, field_messages in errors.items():
        name = renamed.get(name, name)
        if name in form.errors:
            continue
        for message in field_messages:
            form.add_error(name if name in form.fields else None,
                           message if name in form.fields else f"{name}: {message}")


def add_errors(form: forms.Form, error, *, renamed: dict[str, str] | None = None) -> None:
    """A refusal of sites.services on the form: each named field gets its own sentences (the form shows
    all problems at once); sentences for fields the form does not show go above it."""
    renamed = {"queue_timeout_seconds": "queue_timeout", **(renamed or {})}
    rest = []
    for name, field_messages in (error.fields or {}).items():
        name = renamed.get(name, name)
        if name in form.fields:
            for message in field_messages:
                form.add_error(name, message)
        else:
            rest.extend(f"{name}: {message}" for message in field_messages)
    if rest or not error.fields:
        form.add_error(None, " ".join(rest) if rest else error.message)
