"""Workers become rows of their service account (issue 13): unique per (account, worker_id), no longer
per token. Rows of the same account and name from earlier tokens keep their history under a suffixed
name, so the newest one is the worker from now on."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def bind_to_accounts(apps, schema_editor):
    Worker = apps.get_model("workers", "Worker")
    newest: dict = {}
    for worker in Worker.objects.select_related("token").order_by("-last_seen_at", "-pk"):
        worker.account_id = worker.token.user_id
        key = (worker.account_id, worker.worker_id)
        if key in newest:
            worker.worker_id = f"{worker.worker_id[:50]}-old-{worker.pk}"[:64]
        newest.setdefault(key, worker.pk)
        worker.save(update_fields=["account", "worker_id"])


class Migration(migrations.Migration):

    dependencies = [
        ("workers", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="worker", name="worker_unique_per_token"),
        migrations.AddField(
            model_name="worker", name="account",
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE, related_name="workers",
                                    to=settings.AUTH_USER_MODEL,
                                    help_text="The service account whose token the worker uses."),
        ),
        migrations.RunPython(bind_to_accounts, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="worker", name="account",
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="workers",
                                    to=settings.AUTH_USER_MODEL,
                                    help_text="The service account whose token the worker uses."),
        ),
        migrations.AddField(
            model_name="worker", name="stopped_at", field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddConstraint(
            model_name="worker",
            constraint=models.UniqueConstraint(fields=("account", "worker_id"), name="worker_unique_per_account"),
        ),
    ]
