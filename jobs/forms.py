"""The New job form. It turns what a person types (a one-line command, JSON parameters, a walltime
such as 2h30m) into the data jobs.services.create_job takes; the service decides what is allowed
(which computer, runtime and GPUs) and its refusals are shown under the fields."""
from __future__ import annotations

import re
import shlex

from django import forms
from django.apps import apps
from django.core.exceptions import FieldDoesNotExist
from django.utils.translation import gettext_lazy as _

from computers import access as computer_access
from computers.choices import Kind, Runtime
from computers.models import ComputeGroup, ComputeTarget
from jobs import hooks, inputs
from jobs.choices import MAX_CLUSTER_SIZE, ClusterMode
from jobs.services import CONTAINER_RUNTIMES, MAX_SITE_GPUS
from mado.forms import add_service_error as shared_add_service_error
from mado.validation import BIGINT_MAX, JsonRefused, as_int, loads_storable

# Service error fields that have a different name in this form.
SERVICE_FIELDS = {"walltime_seconds": "walltime"}
WALLTIME_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
WALLTIME_PARTS = re.compile(r"(\d+)\s*([dhms])")


class OpenChoiceField(forms.ChoiceField):
    """A select whose value is checked by the service, not against the options: the service's
    message ("gpu-host-1 supports python, docker") says more than "Select a valid choice"."""

    def valid_value(self, value) -> bool:
        return True


class OpenMultipleChoiceField(forms.MultipleChoiceField):
    def valid_value(self, value) -> bool:
        return True


class JobForm(forms.Form):
    name = forms.CharField(label=_("Run name"), max_length=200, required=False,
                           help_text=_("Shown in Jobs and in the Request stop dialog. Empty: job-<number>."))
    # Not required here: a multi-node cluster Job names a compute group instead (the service decides).
    computer = OpenChoiceField(label=_("Computer"), required=False)
    runtime = OpenChoiceField(label=_("Runtime"), required=False)
    image = forms.CharField(label=_("Image"), max_length=1024, required=False,
                            help_text=_("Docker image, or the SIF image for Apptainer and Singularity. "
                                        "Only for container runtimes."))
    command = forms.CharField(label=_("Command"), max_length=10000,
                              widget=forms.TextInput(attrs={"placeholder": "python train.py --epochs 10",
                                                            "spellcheck": "false", "autocomplete": "off"}),
                              help_text=_("One line, split into arguments like a shell does; quote arguments "
                                          "with spaces. Nothing is expanded."))
    requirements = forms.CharField(label=_("Requirements"), required=False,
                                   widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false",
                                                                "placeholder": "torch==2.3.1"}),
                                   help_text=_("requirements.txt lines installed with pip before the command."))
    parameters = forms.CharField(label=_("Parameters (JSON)"), required=False, initial="{}",
                                 widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
                                 help_text=_("A JSON object such as {\"lr\": 0.01}. The Job reads it from the file "
                                             "that MMT_PARAMETERS_FILE names."))
    gpu_ids = OpenMultipleChoiceField(label=_("GPU IDs"), required=False, widget=forms.CheckboxSelectMultiple,
                                      help_text=_("The checked GPUs are reserved for this Job and not given to "
                                                  "other Jobs. None checked: the Job runs on CPU only."))
    # Sites only: their scheduler picks the GPUs, so a site Job asks how many (GPU IDs are for SSH/Local).
    gpu_count = forms.IntegerField(label=_("GPUs"), min_value=0, max_value=MAX_SITE_GPUS, initial=0, required=False,
                                   help_text=_("For a site: how many GPUs its scheduler gives the Job (such as Slurm "
                                               "--gres=gpu:N). 0: CPU only. SSH and Local computers use GPU IDs "
                                               "instead; a cluster Job uses GPUs per replica."))
    input_datasets = OpenMultipleChoiceField(
        label=_("Input datasets"), required=False, widget=forms.CheckboxSelectMultiple,
        help_text=_("Dataset versions copied into the computer's dataset cache before the Job starts; the Job finds "
                    "them through MMT_INPUT_DATASET_DIRS (read-only)."))
    walltime = forms.CharField(label=_("Walltime"), max_length=40, required=False,
                               widget=forms.TextInput(attrs={"placeholder": "2h30m"}),
                               help_text=_("Longest run time, such as 90m, 2h30m, 1d or 01:30:00. "
                                           "Empty: no limit."))

    cluster_mode = forms.ChoiceField(label=_("Cluster mode"), choices=ClusterMode.choices, required=False,
                                     initial=ClusterMode.SINGLE_NODE,
                                     help_text=_("Single node: every replica runs on the chosen computer. Multi-node: "
                                                 "replicas are placed on the computers of a compute group, all on one "
                                                 "computer when one can hold them all, to keep the network out."))
    cluster_size = forms.IntegerField(label=_("Cluster size"), min_value=1, max_value=MAX_CLUSTER_SIZE, initial=1,
                                      required=False,
                                      help_text=_("How many replicas run, main1 included (main1, sub1, sub2, …). "
                                                  "1: an ordinary Job."))
    gpus_per_replica = forms.IntegerField(label=_("GPUs per replica"), min_value=0, max_value=64, initial=0,
                                          required=False,
                                          help_text=_("For a cluster Job, instead of GPU IDs: each replica gets this "
                                                      "many GPUs of its own, picked when the Job starts."))
    compute_group = OpenChoiceField(label=_("Compute group"), required=False,
                                    help_text=_("Where a multi-node cluster Job runs."))
    # Read by an app above jobs through jobs.hooks (notifications); shown only when one is installed.
    notify_me = forms.BooleanField(label=_("Notify me when it ends"), required=False,
                                   help_text=_("An e-mail to the address of your account when this Job finishes "
                                               "or fails."))
    # Read by tracking through jobs.hooks (`run_kind`): the kind of the Job's Run. Its choices come from the
    # installed tracking app's Run model (jobs may not import tracking); without it the field is removed.
    run_kind = forms.ChoiceField(label=_("Run kind"), required=False,
                                 help_text=_("What this Job's Run does. The Runs page filters by it; only training "
                                             "and fine-tuning Runs register the models that result.json declares."))

    def __init__(self, data=None, *, user, project=None, initial=None):
        super().__init__(data, initial=initial)
        self.fields["input_datasets"].choices = inputs.choices(user, project)  # none without datasets
        self.computers = list(computer_access.usable_by(user).filter(enabled=True).order_by("name"))
        self.fields["computer"].choices = [("", "—")] + [(str(c.pk), c.name) for c in self.computers]
        if len(self.computers) == 1 and not self._raw("computer"):
            self.initial["computer"] = str(self.computers[0].pk)
        self.target = self._chosen_target()
        runtimes = self.target.runtimes if self.target else []
        self.fields["runtime"].choices = [(r, Runtime(r).label if r in Runtime.values else r) for r in runtimes]
        if runtimes and not self._raw("runtime"):
            self.initial["runtime"] = Runtime.PYTHON if Runtime.PYTHON in runtimes else runtimes[0]
        self.fields["gpu_ids"].choices = [(g, f"GPU {g}") for g in (self.target.gpu_ids if self.target else [])]
        if self.target is None:
            # A multi-node Job has no computer: any runtime; its group must have a computer for it.
            self.fields["runtime"].choices = Runtime.choices
        self.fields["compute_group"].choices = [("", "—")] + [(str(g.pk), g.name) for g in ComputeGroup.objects.all()]
        if not hooks.offers("notify_me"):
            del self.fields["notify_me"]
        kinds = run_kind_choices()
        if kinds:
            self.fields["run_kind"].choices = kinds
            self.fields["run_kind"].initial = "other" if "other" in dict(kinds) else kinds[0][0]
        else:
            del self.fields["run_kind"]

    @property
    def has_groups(self) -> bool:
        return len(self.fields["compute_group"].choices) > 1

    @property
    def offers_gpu_count(self) -> bool:
        """The GPUs count is for sites, whose scheduler picks the GPUs; other computers name GPU IDs."""
        return bool(self.target and self.target.kind == Kind.SITE)

    @property
    def offers_image(self) -> bool:
        """The image field only matters on a computer with a container runtime."""
        return bool(self.target and any(r in CONTAINER_RUNTIMES for r in self.target.runtimes))

    def _raw(self, name: str):
        return (self.data if self.is_bound else self.initial).get(name)

    def _chosen_target(self) -> ComputeTarget | None:
        chosen = str(self._raw("computer") or "")
        return next((c for c in self.computers if str(c.pk) == chosen), None)

    def clean(self):
        data = super().clean()
        multi = (data.get("cluster_size") or 1) > 1 and data.get("cluster_mode") == ClusterMode.MULTI_NODE
        if not multi and not data.get("computer"):
            self.add_error("computer", forms.Field.default_error_messages["required"])
        return data

    def clean_command(self) -> list[str]:
        text = self.cleaned_data["command"]
        try:
            argv = shlex.split(text)
        except ValueError:
            raise forms.ValidationError(_("Close the quotes in the command: it is split like a shell line."))
        if not argv:
            raise forms.ValidationError(_("Give the command to run, such as python train.py."))
        return argv

    def clean_parameters(self) -> dict:
        text = (self.cleaned_data.get("parameters") or "").strip()
        if not text:
            return {}
        try:
            # The API's rules for stored JSON: finite numbers, bounded nesting, no lone surrogates.
            value = loads_storable(text)
        except JsonRefused as refused:
            raise forms.ValidationError(refused.message)
        except ValueError as error:
            raise forms.ValidationError(_("This is not valid JSON: %(error)s") % {"error": error})
        if not isinstance(value, dict):
            raise forms.ValidationError(_("Parameters are a JSON object, such as {\"lr\": 0.01}."))
        return value

    def clean_walltime(self) -> int | None:
        text = (self.cleaned_data.get("walltime") or "").strip().lower()
        if not text:
            return None
        seconds = parse_walltime(text)
        if seconds is None:
            raise forms.ValidationError(_("Write the walltime as 90m, 2h30m, 1d or 01:30:00."))
        return seconds

    def service_data(self) -> dict:
        data = self.cleaned_data
        values = {"name": data["name"], "computer": data["computer"], "runtime": data["runtime"] or None,
                  "image": data["image"], "command": data["command"], "requirements": data["requirements"],
                  "parameters": data["parameters"], "gpu_ids": list(data["gpu_ids"]),
                  "walltime_seconds": data["walltime"], "input_datasets": list(data.get("input_datasets") or [])}
        if "notify_me" in self.fields:
            values["notify_me"] = bool(data.get("notify_me"))
        if "run_kind" in self.fields and data.get("run_kind"):
            values["run_kind"] = data["run_kind"]
        if data.get("gpu_count") is not None and self.offers_gpu_count:
            values["gpu_count"] = data["gpu_count"]
        size = data.get("cluster_size") or 1
        if size > 1:
            # Resources are per replica (docs/cluster-jobs.md): GPUs per replica replace GPU IDs.
            mode = data.get("cluster_mode") or ClusterMode.SINGLE_NODE
            values.update(cluster_size=size, cluster_mode=mode, gpus_per_replica=data.get("gpus_per_replica") or 0,
                          gpu_ids=[])
            values.pop("gpu_count", None)
            if mode == ClusterMode.MULTI_NODE:
                values.update(computer=None, compute_group=data.get("compute_group") or None)
        return values


def run_kind_choices() -> list[tuple[str, str]]:
    """The kinds a Job's Run may have, as the installed tracking app defines them (its Run model's `kind`
    field), or [] when no app reads the `run_kind` option."""
    if not hooks.offers("run_kind"):
        return []
    for config in apps.get_app_configs():
        try:
            field = config.get_model("Run")._meta.get_field("kind")
        except (LookupError, FieldDoesNotExist):
            continue
        return [(str(value), label) for value, label in field.choices]
    return []


def parse_walltime(text: str) -> int | None:
    """Seconds from "5400", "90m", "2h30m", "1d 12h" or "01:30:00"; None when it is none of those."""
    text = text.strip().lower()
    if (seconds := as_int(text, low=0, high=BIGINT_MAX)) is not None:
        return seconds
    if re.fullmatch(r"\d+(:\d{1,2}){1,2}", text):
        numbers = [int(part) for part in text.split(":")]
        if any(n >= 60 for n in numbers[1:]):
            return None
        while len(numbers) < 3:
            numbers.append(0)  # 01:30 is one hour thirty
        hours, minutes, seconds = numbers
        return hours * 3600 + minutes * 60 + seconds
    if re.fullmatch(r"(\s*\d+\s*[dhms])+\s*", text):
        return sum(int(n) * WALLTIME_UNITS[unit] for n, unit in WALLTIME_PARTS.findall(text))
    return None



def add_service_error(form: forms.Form, error) -> None:
    """create_job names its own fields; some differ from the form's (see SERVICE_FIELDS)."""
    shared_add_service_error(form, error, renamed=SERVICE_FIELDS)
