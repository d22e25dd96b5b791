from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("jobs", "0006_input_failed_end_reason")]

    operations = [
        migrations.AddField(model_name="job", name="unresponsive_reported_at",
                            field=models.DateTimeField(blank=True, null=True)),
    ]
