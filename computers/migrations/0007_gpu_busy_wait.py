"""How long a job waits for its GPUs to be free of processes outside Mado (issue 22, seed 002): a
computer setting, seconds, default 600 (10 minutes), 0 = off."""
import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('computers', '0006_worker_checks_only'),
    ]

    operations = [
        migrations.AddField(
            model_name='computetarget',
            name='gpu_busy_wait_seconds',
            field=models.PositiveIntegerField(default=600, validators=[django.core.validators.MaxValueValidator(86400)], verbose_name='Wait for GPUs busy outside Mado (seconds)'),
        ),
    ]
