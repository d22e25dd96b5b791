"""The writers of an experiment's life after creation (MLflow's UpdateExperiment, DeleteExperiment,
RestoreExperiment): rename, delete with its Runs, restore with the Runs deleted with it. Each writes an
AuditEvent. Creating experiments stays in tracking.services."""
from __future__ import annotations

from django.db import IntegrityError, transaction

from mado import access as identity
from mado.choices import Role
from mado.services import Actor, audit
from tracking.access import job_id_of
from tracking.choices import LifecycleStage
from tracking.errors import MlflowError, denied, invalid
from tracking.models import Experiment, Run, now_ms
from tracking.validation import experiment_name


def _check_can_change(actor: Actor, principal, experiment: Experiment) -> None:
    if job_id_of(principal) is not None:
        raise denied("A job token writes only to its own Job's Run; it cannot rename, delete or restore "
                     "experiments. Use a personal token with runs:write for that.")
    if not identity.has_role(actor.user, experiment.project, Role.MEMBER):
        raise denied("Changing experiments needs the member role in this project; ask a project admin.")


def rename_experiment(actor: Actor, principal, experiment: Experiment, new_name) -> Experiment:
    _check_can_change(actor, principal, experiment)
    if experiment.lifecycle_stage != LifecycleStage.ACTIVE:
        raise MlflowError("Cannot rename a non-active experiment.", "INVALID_STATE")
    if new_name in (None, ""):
        raise invalid("Missing value for required parameter 'new_name'. See the API docs for more information "
                      "about request parameters.")
    name = experiment_name(new_name)
    if name == experiment.name:
        return experiment
    taken = Experiment.objects.filter(project=experiment.project, name=name).first()
    if taken is not None:
        raise _name_taken(taken)
    before = experiment.name
    try:
        with transaction.atomic():
            experiment.name, experiment.last_update_time = name, now_ms()
            experiment.save(update_fields=["name", "last_update_time"])
            audit(actor, "experiment.rename", experiment, project=experiment.project, before={"name": before},
                  after={"name": name})
    except IntegrityError:
        raise MlflowError(f"Experiment '{name}' already exists.", "RESOURCE_ALREADY_EXISTS") from None
    return experiment


def _name_taken(taken: Experiment) -> MlflowError:
    if taken.lifecycle_stage == LifecycleStage.DELETED:
        return MlflowError(f"Experiment {taken.name!r} already exists in deleted state. Restore it, or pick "
                           "another name.", "RESOURCE_ALREADY_EXISTS")
    return MlflowError(f"Experiment '{taken.name}' already exists.", "RESOURCE_ALREADY_EXISTS")


def delete_experiment(actor: Actor, principal, experiment: Experiment) -> Experiment:
    """As MLflow: the experiment and its active Runs become deleted (hidden from searches, restorable).
    The project's default experiment, where every Job's Run goes, cannot be deleted (MLflow's "0" neither)."""
    _check_can_change(actor, principal, experiment)
    if experiment.is_default:
        raise invalid(f"Cannot delete the default experiment '{experiment.name}' (MLflow's experiment '0'): every "
                      "Job's Run is recorded in it. This is an internally reserved experiment.")
    if experiment.lifecycle_stage == LifecycleStage.DELETED:
        raise invalid(f"Cannot delete experiment {experiment.pk}: it is already deleted.")
    when = now_ms()
    with transaction.atomic():
        runs = Run.objects.filter(experiment=experiment, lifecycle_stage=LifecycleStage.ACTIVE).update(
            lifecycle_stage=LifecycleStage.DELETED, deleted_time=when)
        experiment.lifecycle_stage, experiment.last_update_time = LifecycleStage.DELETED, when
        experiment.save(update_fields=["lifecycle_stage", "last_update_time"])
        audit(actor, "experiment.delete", experiment, project=experiment.project,
              before={"lifecycle_stage": LifecycleStage.ACTIVE}, after={"lifecycle_stage": LifecycleStage.DELETED,
                                                                        "runs_deleted": runs})
    return experiment


def restore_experiment(actor: Actor, principal, experiment: Experiment) -> Experiment:
    """The Runs deleted with the experiment come back; Runs deleted on their own before it stay deleted
    (MLflow restores all of them: a Run a researcher deleted on purpose should not reappear)."""
    _check_can_change(actor, principal, experiment)
    if experiment.lifecycle_stage != LifecycleStage.DELETED:
        raise invalid(f"Cannot restore experiment {experiment.pk}: it is not deleted.")
    deleted_at = experiment.last_update_time
    with transaction.atomic():
        runs = Run.objects.filter(experiment=experiment, lifecycle_stage=LifecycleStage.DELETED,
                                  deleted_time__gte=deleted_at).update(lifecycle_stage=LifecycleStage.ACTIVE,
                                                                       deleted_time=None)
        experiment.lifecycle_stage, experiment.last_update_time = LifecycleStage.ACTIVE, now_ms()
        experiment.save(update_fields=["lifecycle_stage", "last_update_time"])
        audit(actor, "experiment.restore", experiment, project=experiment.project,
              before={"lifecycle_stage": LifecycleStage.DELETED}, after={"lifecycle_stage": LifecycleStage.ACTIVE,
                                                                         "runs_restored": runs})
    return experiment
