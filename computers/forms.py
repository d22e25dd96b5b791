"""Forms of the Computers pages: step 1 "Connection", step 2 "Settings after connecting", and Edit
computer (both steps as tabs). They parse what the browser sends; the rules and their messages live
in computers.services, so the pages and the API refuse the same things with the same words."""
from __future__ import annotations

from django import forms
from django.conf import settings
from django.utils.translation import gettext_lazy as _

from computers.choices import CpuArch, DatasetTransfer, Kind, Runtime, Visibility
from computers.models import CONNECTION_FIELDS

CONNECTION_VALUES = ["name", "visibility", *CONNECTION_FIELDS]
SETTINGS_VALUES = ["working_dir", "python_path", "cpu_arch", "runtimes", "gpu_ids", "concurrency", "dataset_transfer",
                   "dataset_cache_limit_gib", "gpu_busy_wait_seconds", "enabled"]


def kind_choices() -> list[tuple[str, str]]:
    """SSH always; Local only in development mode. Sites get their own form (the Sites issue)."""
    choices = [(Kind.SSH.value, Kind.SSH.label)]
    if settings.DEV_MODE:
        choices.append((Kind.LOCAL.value, Kind.LOCAL.label))
    return choices


def worker_label(worker) -> str:
    return worker.label  # name, project and host: two workers may share a name


class ConnectionForm(forms.Form):
    """Step 1 of Add computer, and the Connection tab of Edit computer."""

    name = forms.CharField(label=_("Name"), max_length=64, required=False,
                           help_text=_("Shown on screen and in Task choices"))
    kind = forms.ChoiceField(label=_("Type"), choices=(), initial=Kind.SSH, required=False)
    visibility = forms.ChoiceField(
        label=_("Visibility"), choices=Visibility.choices, initial=Visibility.PRIVATE,
        help_text=_("With Private (the default), only Jobs of the owner and of the Service Accounts the owner "
                    "created run. Choose Public to run Jobs from any Project"))
    host = forms.CharField(label=_("Host"), max_length=255, required=False)
    port = forms.IntegerField(label=_("Port"), initial=22, required=False)
    ssh_user = forms.CharField(label=_("SSH user"), max_length=64, required=False, help_text=_("User to connect as"))
    ssh_key_path = forms.CharField(
        label=_("SSH key path"), max_length=1024, required=False,
        help_text=_("Path of the private key on the worker machine. Files on the chosen worker's machine are "
                    "offered as candidates"))
    known_hosts_path = forms.CharField(
        label=_("known_hosts path"), max_length=1024, required=False,
        help_text=_("Path of known_hosts on the worker machine, with candidates as for the key"))
    worker = forms.ChoiceField(
        label=_("Worker for this connection"), required=False,
        help_text=_("The worker that checks the connection. When only one worker is online, it is already chosen"))

    def __init__(self, *args, workers=(), **kwargs):
        super().__init__(*args, label_suffix="", **kwargs)
        self.workers = list(workers)
        self.fields["kind"].choices = kind_choices()
        self.fields["worker"].choices = [("", "—")] + [(str(w.pk), worker_label(w)) for w in self.workers]
        if len(self.workers) == 1 and not self.initial.get("worker"):
            self.initial["worker"] = str(self.workers[0].pk)  # only one online: already chosen
        _path_inputs(self)

    def chosen_worker(self):
        """The worker picked in Worker for this connection, if it is still offered (online)."""
        value = self["worker"].value()
        return next((w for w in self.workers if str(w.pk) == str(value or "")), None)

    def connection_values(self, *, with_kind: bool) -> dict:
        data = {name: self.cleaned_data.get(name) for name in CONNECTION_VALUES}
        data["name"] = (data["name"] or "").strip()
        if data["port"] is None:
            data["port"] = ""  # the service says "Port must be between 1 and 65535."
        if with_kind:
            data["kind"] = self.cleaned_data.get("kind") or Kind.SSH
        return data


class SettingsForm(forms.Form):
    """Step 2 of Add computer, and the Settings after connecting tab of Edit computer."""

    working_dir = forms.CharField(
        label=_("Working directory"), max_length=1024, required=False,
        help_text=_("Where Job files and the dataset cache go on the target. The SSH user must be able to write "
                    "here. Not filled in automatically: choose a candidate or type it"))
    python_path = forms.CharField(label=_("Python executable path"), max_length=1024, required=False,
                                  help_text=_("Python 3.11 or later on the target"))
    cpu_arch = forms.ChoiceField(label=_("CPU architecture"), choices=CpuArch.choices, initial=CpuArch.AMD64)
    runtimes = forms.MultipleChoiceField(label=_("Supported runtimes"), choices=Runtime.choices, required=False,
                                         widget=forms.CheckboxSelectMultiple)
    gpu_detected = forms.MultipleChoiceField(label=_("GPUs (detected)"), choices=(), required=False,
                                             widget=forms.CheckboxSelectMultiple)
    gpu_ids = forms.CharField(
        label=_("GPU IDs (one per line)"), required=False, widget=forms.Textarea(attrs={"rows": 3}),
        help_text=_("GPU numbers Jobs may use. The checked GPUs are filled in. Empty for a CPU-only target"))
    concurrency = forms.IntegerField(
        label=_("Concurrent jobs"), required=False,
        help_text=_("Maximum Jobs running at once. Defaults to the number of selected GPUs (1 without GPUs)"))
    dataset_transfer = forms.ChoiceField(label=_("Dataset transfer"), choices=DatasetTransfer.choices,
                                         initial=DatasetTransfer.RELAY,
                                         help_text=_("How input datasets are fetched"))
    dataset_cache_limit_gib = forms.IntegerField(label=_("Dataset cache limit (GiB)"), required=False, initial=100,
                                                 help_text=_("Limit of the dataset cache on the target"))
    gpu_busy_wait_seconds = forms.IntegerField(
        label=_("Wait for GPUs busy outside Mado (seconds)"), required=False, initial=600,
        help_text=_("A job whose GPUs a process outside Mado uses waits this long, then goes back to the queue. "
                    "0 starts it at once. Default 600 (10 minutes)"))
    enabled = forms.BooleanField(label=_("Enabled"), required=False,
                                 help_text=_("When enabled, Jobs start running on this computer"))

    def __init__(self, *args, gpus=(), **kwargs):
        kwargs.setdefault("label_suffix", "")  # EditForm reaches here through ConnectionForm, which set it
        super().__init__(*args, **kwargs)
        self.gpus = list(gpus)
        self.fields["gpu_detected"].choices = [(str(g.get("index")), gpu_label(g)) for g in self.gpus]
        _path_inputs(self)

    def settings_values(self) -> dict:
        data = {name: self.cleaned_data.get(name) for name in SETTINGS_VALUES}
        data["working_dir"] = strip_trailing_slash(data["working_dir"] or "")
        data["python_path"] = (data["python_path"] or "").strip()
        data["gpu_ids"] = (data["gpu_ids"] or "").split()
        data["concurrency"] = "" if data["concurrency"] is None else data["concurrency"]
        if data["dataset_cache_limit_gib"] is None:
            data["dataset_cache_limit_gib"] = ""
        if data["gpu_busy_wait_seconds"] is None:
            data["gpu_busy_wait_seconds"] = ""  # the service's default, 600
        data["enabled"] = bool(data["enabled"])
        return data


class EditForm(ConnectionForm, SettingsForm):
    """Edit computer: both tabs in one form, so Save saves the changes on both together.

    `locked` names the fields that cannot change while Jobs are queued or running (computers.locks):
    they are disabled, keep the computer's values (the initial ones) whatever is sent, and say why
    beside them (`locked_reason`)."""

    def __init__(self, *args, locked=(), locked_reason="", **kwargs):
        super().__init__(*args, **kwargs)  # ConnectionForm's workers=, then SettingsForm's gpus=
        del self.fields["kind"]  # the type of a computer does not change
        self.locked = [name for name in locked if name in self.fields]
        if "gpu_ids" in self.locked:
            self.locked.append("gpu_detected")  # the checkboxes fill GPU IDs
        for name in self.locked:
            self.fields[name].disabled = True
            self.fields[name].locked_reason = locked_reason


class SuggestedSettingsForm(forms.Form):
    """Suggested settings in the details: GPUs and runtimes the last check found."""

    gpu_ids = forms.MultipleChoiceField(label=_("GPUs"), choices=(), required=False,
                                        widget=forms.CheckboxSelectMultiple)
    runtimes = forms.MultipleChoiceField(label=_("Runtimes"), choices=(), required=False,
                                         widget=forms.CheckboxSelectMultiple)

    def __init__(self, *args, gpus=(), runtimes=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["gpu_ids"].choices = [(str(g.get("index")), gpu_label(g)) for g in gpus]
        labels = dict(Runtime.choices)
        self.fields["runtimes"].choices = [(r, labels.get(r, r)) for r in runtimes]


# Path inputs complete from a <datalist>: key paths from the chosen worker, the working directory and
# Python from the check and from directories the worker read.
PATH_LISTS = {"ssh_key_path": "ssh-key-options", "known_hosts_path": "known-hosts-options",
              "working_dir": "working_dir-options", "python_path": "python_path-options"}


def _path_inputs(form) -> None:
    for name, list_id in PATH_LISTS.items():
        if name in form.fields:
            form.fields[name].widget.attrs.update(list=list_id, autocomplete="off", spellcheck="false")


def gpu_label(gpu: dict) -> str:
    parts = [str(gpu.get("index"))]
    if gpu.get("name"):
        parts.append(str(gpu["name"]))
    if isinstance(gpu.get("memory_mib"), int):
        parts.append(f"{gpu['memory_mib'] / 1024:.0f} GiB")
    return " · ".join(parts)


def strip_trailing_slash(path: str) -> str:
    """A directory picked from the candidates ends with "/"; store it without, except the root."""
    path = path.strip()
    return path.rstrip("/") or path[:1]
