import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("jobs", "0007_job_unresponsive_reported_at"), ("workers", "0001_initial")]

    operations = [
        migrations.AddField(model_name="job", name="released_by",
                            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL,
                                                    related_name="+", to="workers.worker")),
        migrations.AddField(model_name="job", name="released_at", field=models.DateTimeField(blank=True, null=True)),
    ]
