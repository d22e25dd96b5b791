"""Choices of the tracking app: a Run's kind, status and lifecycle stage (MLflow's words for the last two)."""
from django.db import models
from django.utils.translation import pgettext_lazy


class RunKind(models.TextChoices):
    TRAINING = "training", pgettext_lazy("run kind", "Training")
    FINE_TUNING = "fine-tuning", pgettext_lazy("run kind", "Fine-tuning")
    INFERENCE = "inference", pgettext_lazy("run kind", "Inference")
    EVALUATION = "evaluation", pgettext_lazy("run kind", "Evaluation")
    PREPROCESSING = "preprocessing", pgettext_lazy("run kind", "Preprocessing")
    OTHER = "other", pgettext_lazy("run kind", "Other")


class RunStatus(models.TextChoices):
    """MLflow's RunStatus names, as its API sends them."""
    RUNNING = "RUNNING", pgettext_lazy("run status", "Running")
    SCHEDULED = "SCHEDULED", pgettext_lazy("run status", "Scheduled")
    FINISHED = "FINISHED", pgettext_lazy("run status", "Finished")
    FAILED = "FAILED", pgettext_lazy("run status", "Failed")
    KILLED = "KILLED", pgettext_lazy("run status", "Killed")


TERMINAL_RUN_STATUSES = (RunStatus.FINISHED, RunStatus.FAILED, RunStatus.KILLED)


class LifecycleStage(models.TextChoices):
    ACTIVE = "active", pgettext_lazy("run lifecycle", "Active")
    DELETED = "deleted", pgettext_lazy("run lifecycle", "Deleted")


DEFAULT_EXPERIMENT_NAME = "Default"
