"""Worker.reported_online: the presence last announced by the periodic runner (issue 20). Existing rows
start as they are now, so the first sweep announces nothing for workers that went away long ago."""
from datetime import timedelta

from django.db import migrations, models
from django.db.models import Q
from django.utils import timezone


def current_presence(apps, schema_editor):
    Worker = apps.get_model("workers", "Worker")
    Worker.objects.filter(Q(last_seen_at__lt=timezone.now() - timedelta(seconds=120)) | Q(stopped_at__isnull=False)
                          ).update(reported_online=False)


class Migration(migrations.Migration):
    dependencies = [("workers", "0002_worker_account")]

    operations = [
        migrations.AddField(model_name="worker", name="reported_online", field=models.BooleanField(default=True)),
        migrations.RunPython(current_presence, migrations.RunPython.noop),
    ]
