"""Who reads and who writes datasets. Viewers read every dataset of their project; members create
datasets and versions. API tokens also need `registry:write` to write (the scope result.json
declarations of datasets need, seed 001), checked by the views' required_scopes."""
from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import Http404

from datasets.models import Dataset, DatasetVersion
from mado import access as identity
from mado.choices import Role


def visible_in(user, project):
    if not identity.has_role(user, project, Role.VIEWER):
        return Dataset.objects.none()
    return Dataset.objects.filter(project=project)


def can_write(user, project) -> bool:
    return identity.has_role(user, project, Role.MEMBER)


def require_write(user, project) -> None:
    if not can_write(user, project):
        raise PermissionDenied(f"Writing datasets needs the member role in project {project.slug}; "
                               "ask a project admin.")


def dataset_for(user, project, key: str) -> Dataset:
    """A dataset of the project by id (digits) or by name (any case); names are never all digits."""
    datasets = visible_in(user, project)
    dataset = (datasets.filter(pk=int(key)) if key.isascii() and key.isdigit() and len(key) < 19
               else datasets.filter(name__iexact=key)).first()
    if dataset is None:
        raise Http404(f"No dataset {key} in project {project.slug}; check the name or id.")
    return dataset


def version_for(dataset: Dataset, pk: int) -> DatasetVersion:
    version = dataset.versions.filter(pk=pk).select_related("dataset", "created_by", "job").first()
    if version is None:
        raise Http404(f"No version {pk} in dataset {dataset.name}; check the version id.")
    return version
