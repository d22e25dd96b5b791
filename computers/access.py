"""Who sees, uses and manages which computers (seed 002 "Permissions"). Every view, serializer and
template asks these helpers; no other module decides these rules."""
from __future__ import annotations

from django.db.models import Q, QuerySet
from django.http import Http404
from django.utils.translation import gettext as _

from computers.choices import Kind, Visibility
from computers.models import ComputeTarget
from mado import access as identity


def listed_to(user) -> QuerySet[ComputeTarget]:
    """Every signed-in user sees every computer's name, kind, owner, visibility and state."""
    if not user.is_authenticated:
        return ComputeTarget.objects.none()
    return ComputeTarget.objects.select_related("owner")


def usable_by(user) -> QuerySet[ComputeTarget]:
    """Where the user's jobs may run: Public computers, and Private ones of the user, or — for a
    service account — of the person who created it."""
    if not user.is_authenticated:
        return ComputeTarget.objects.none()
    account = identity.service_account_of(user)
    owner_id = account.created_by_id if account is not None else user.pk
    return ComputeTarget.objects.filter(Q(visibility=Visibility.PUBLIC) | Q(owner_id=owner_id))


def manageable_by(user) -> QuerySet[ComputeTarget]:
    """Change, enable/disable, check: the owner and global administrators."""
    if not user.is_authenticated or identity.is_job_principal(user):
        return ComputeTarget.objects.none()
    if identity.is_global_admin(user):
        return ComputeTarget.objects.all()
    return ComputeTarget.objects.filter(owner=user)


def served_by_worker(worker_user) -> QuerySet[ComputeTarget]:
    """SSH and Local computers whose checks and jobs a worker may take (seeds 001 and 002): the ones
    its service account may run Jobs on — Public computers, and Private ones of the person who created
    the service account. Which jobs comes from its token (the project); the worker's target ids narrow
    this further. Workers never take site computers (launchers do)."""
    if identity.service_account_of(worker_user) is None:
        return ComputeTarget.objects.none()
    return usable_by(worker_user).filter(kind__in=[Kind.SSH, Kind.LOCAL])


def unnamed_checks_served_by(worker) -> QuerySet[ComputeTarget]:
    """The computers whose checks that name no worker this worker takes (seed 002): those in its
    MMT_WORKER_TARGET_IDS that it serves at all. A worker without target ids takes only the checks that
    name it. The claim and the refusal at request time both ask this."""
    if not worker.target_ids:
        return ComputeTarget.objects.none()
    return served_by_worker(worker.account).filter(pk__in=worker.target_ids)


def workers_for_unnamed_check(target: ComputeTarget) -> list:
    """Online workers that would take a check of `target` that names no worker."""
    from workers.models import Worker

    # Target ids filtered in Python: SQLite (the demo database) has no JSON containment lookup.
    return [w for w in Worker.objects.online().select_related("account").order_by("worker_id")
            if w.target_ids and target.pk in w.target_ids
            and unnamed_checks_served_by(w).filter(pk=target.pk).exists()]


def can_manage(user, target: ComputeTarget) -> bool:
    if not user.is_authenticated or identity.is_job_principal(user):
        return False  # a job's code never sees connection details, not even of its creator's computer
    return identity.is_global_admin(user) or target.owner_id == user.pk


def can_use(user, target: ComputeTarget) -> bool:
    return usable_by(user).filter(pk=target.pk).exists()


def can_see_connection(user, target: ComputeTarget) -> bool:
    """Host, port, user, key paths and known_hosts: owner and global administrators only."""
    return can_manage(user, target)


def can_add(user, kind: str) -> bool:
    if kind in (Kind.SSH, Kind.LOCAL):
        return identity.is_global_admin(user)
    return user.is_authenticated  # sites: anyone signed in (the Sites issue builds them)


def can_choose_worker(user) -> bool:
    """Choosing a worker, its key candidates and directory reads: global administrators."""
    return identity.is_global_admin(user)


def detailed_to(user) -> QuerySet[ComputeTarget]:
    """Computers whose details (GPUs, the jobs holding them) the user sees: those they may use or manage.
    Others are only listed by name and state."""
    return usable_by(user) | manageable_by(user)


def detail_for(user, pk: int) -> ComputeTarget:
    """A computer the user may use or manage; otherwise 404, so unusable computers' details do not leak."""
    target = detailed_to(user).select_related("owner", "last_check_worker").filter(pk=pk).first()
    if target is None:
        raise Http404(_("No computer with this id that you can use or manage."))
    return target


def managed_for(user, pk: int) -> ComputeTarget:
    """A computer the user may manage. One that they may use but not manage is 403; others 404."""
    from django.core.exceptions import PermissionDenied

    target = detail_for(user, pk)
    if not can_manage(user, target):
        raise PermissionDenied(_("Only the computer's owner and global administrators can change or check it."))
    return target


def workers_to_choose(user):
    """Online workers that report key candidates, offered in Worker for this connection."""
    from workers.models import Worker

    if not can_choose_worker(user):
        return []
    # Filtered in Python: SQLite (the demo database) has no JSON containment lookup.
    return [w for w in Worker.objects.online().select_related("project")
            .order_by("worker_id", "project__slug", "-last_seen_at") if w.reports_candidates]
