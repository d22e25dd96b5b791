"""Compute groups (docs/cluster-jobs.md): global administrators group SSH computers, and a multi-node
cluster job spreads its replicas over a group. The service functions and the form of their page."""
from __future__ import annotations

from django import forms
from django.db import transaction
from django.utils.translation import gettext_lazy as _

from computers import locks
from computers.choices import Kind
from computers.models import ComputeGroup, ComputeTarget
from mado.errors import Conflict, ServiceError
from mado.services import Actor, audit, require_global_admin
from mado.validation import NAME_PATTERN

GROUP_KINDS = (Kind.SSH, Kind.LOCAL)


def groupable():
    """SSH computers (and Local ones, which exist only in development)."""
    return ComputeTarget.objects.filter(kind__in=GROUP_KINDS).order_by("name")


class GroupForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=64,
                           help_text=_("Letters, digits, '.', '_' or '-'. Multi-node cluster Jobs name it."))
    description = forms.CharField(label=_("Description"), max_length=500, required=False)
    computers = forms.MultipleChoiceField(label=_("Computers"), required=False, widget=forms.CheckboxSelectMultiple,
                                          help_text=_("The SSH computers a multi-node cluster Job may place its "
                                                      "replicas on. One worker must serve all of them."))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["computers"].choices = [(str(c.pk), c.name) for c in groupable()]

    def service_data(self) -> dict:
        data = self.cleaned_data
        return {"name": data["name"], "description": data["description"], "computers": data["computers"]}


def _check_admin(actor: Actor) -> None:
    require_global_admin(actor, "Only global administrators create, change and delete compute groups.",
                         "admin_required")


def _clean(data: dict, group: ComputeGroup | None) -> tuple[dict, list[ComputeTarget]]:
    name = str(data.get("name") or "").strip()
    if not NAME_PATTERN.match(name):
        raise ServiceError("Name the group with 1–64 letters, digits, '.', '_' or '-'.", "invalid_group",
                           fields={"name": ["Letters, digits, '.', '_' or '-'."]})
    taken = ComputeGroup.objects.filter(name__iexact=name).exclude(pk=group.pk if group else None)
    if taken.exists():
        raise ServiceError(f"A compute group named {name} exists already; choose another name.", "invalid_group",
                           fields={"name": ["Taken."]})
    ids = [str(i) for i in data.get("computers") or []]
    computers = list(groupable().filter(pk__in=[i for i in ids if i.isascii() and i.isdigit() and len(i) < 19]))
    if len(computers) != len(set(ids)):
        raise ServiceError("Only SSH computers join a compute group; choose them from the list.", "invalid_group",
                           fields={"computers": ["Not an SSH computer."]})
    return {"name": name, "description": str(data.get("description") or "")[:500]}, computers


def save_group(actor: Actor, data: dict, group: ComputeGroup | None = None) -> ComputeGroup:
    _check_admin(actor)
    with transaction.atomic():
        values, computers = _clean(data, group)
        before = _snapshot(group) if group else None
        if group is None:
            group = ComputeGroup.objects.create(created_by=actor.user, **values)
        else:
            ComputeGroup.objects.filter(pk=group.pk).update(**values)
            group.refresh_from_db()
        group.computers.set(computers)
        audit(actor, "compute_group.create" if before is None else "compute_group.update", group,
              before=before, after=_snapshot(group))
    return group


def delete_group(actor: Actor, group: ComputeGroup) -> None:
    """Refused while its Jobs wait or run: they would lose the computers they are to be placed on."""
    _check_admin(actor)
    with transaction.atomic():
        active = [job.pk for job in locks.active_group_jobs(group)[:5]]
        if active:
            raise Conflict(f"Jobs {', '.join(map(str, active))} use the compute group {group.name}; stop them or "
                           "wait until they end, then delete it.", "group_in_use")
        audit(actor, "compute_group.delete", group, before=_snapshot(group))
        group.delete()


def _snapshot(group: ComputeGroup) -> dict:
    return {"name": group.name, "description": group.description,
            "computers": sorted(group.computers.values_list("name", flat=True))}
