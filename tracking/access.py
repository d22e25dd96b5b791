"""Who sees and writes which experiments and Runs. Reads: viewers of the project. Writes: members (and,
for tokens, the runs:write scope, checked by the API); a job token writes only to its own Job's Run."""
from __future__ import annotations

from mado import access as identity
from mado.choices import Role
from mado.db import PreparedLookup
from tracking.errors import denied, not_found
from tracking.models import Experiment, Run


def experiments_visible_in(user, project):
    if not identity.has_role(user, project, Role.VIEWER):
        return Experiment.objects.none()
    return Experiment.objects.filter(project=project)


def runs_visible_in(user, project):
    if not identity.has_role(user, project, Role.VIEWER):
        return Run.objects.none()
    return Run.objects.filter(project=project)


def experiment_for(user, project, experiment_id) -> Experiment:
    experiment = experiments_visible_in(user, project).filter(pk=experiment_id).first()
    if experiment is None:
        raise not_found(f"No Experiment with id={experiment_id} exists.")
    return experiment


# The Run an MLflow call names, in the caller's project: every MLflow call about a Run makes this lookup, so
# it is compiled once (mado.db). The caller's role comes with the token (mado.authentication).
RUN_IN_PROJECT = PreparedLookup(lambda project_id, run_id: Run.objects.filter(
    project_id=project_id, pk=run_id).select_related("experiment", "created_by").order_by()[:1], -1, "<run>")


def run_for(user, project, run_id: str) -> Run:
    run = RUN_IN_PROJECT.first(project.pk, run_id) if identity.has_role(user, project, Role.VIEWER) else None
    if run is None:
        raise not_found(f"Run with id={run_id} not found")
    return run


def job_id_of(principal) -> int | None:
    """The Job whose token this is, or None for other principals."""
    return principal.token.job_id if getattr(principal, "is_job", False) else None


def check_can_write(user, principal, run: Run) -> None:
    """PERMISSION_DENIED unless the caller may write to this Run."""
    job_id = job_id_of(principal)
    if job_id is not None and run.job_id != job_id:
        raise denied(f"This job token writes only to its own Job's Run; Run {run.run_id} is not that Run. Use "
                     "MLFLOW_RUN_ID (mlflow.start_run() without arguments) or a personal token with runs:write.")
    if not identity.has_role(user, run.project, Role.MEMBER):
        raise denied("Writing to Runs needs the member role in this project; ask a project admin.")


def check_can_create(user, principal, project) -> None:
    if job_id_of(principal) is not None:
        raise denied("A job token writes only to its own Job's Run; it cannot create experiments or other Runs. "
                     "Use a personal token with runs:write for that.")
    if not identity.has_role(user, project, Role.MEMBER):
        raise denied("Creating experiments and Runs needs the member role in this project; ask a project admin.")
