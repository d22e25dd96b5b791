from django.db import models
from django.utils.translation import gettext_lazy as _


class VersionStatus(models.TextChoices):
    UPLOADING = "uploading", _("Uploading")
    COMPLETE = "complete", _("Complete")
