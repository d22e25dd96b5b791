"""LatestMetric.points: how many points each series holds, kept by the statement that stores them (the
Run panel's change stamp). Series stored before are counted once here."""

from django.db import migrations, models


def count_points(apps, schema_editor):
    metric = apps.get_model("tracking", "Metric")._meta.db_table
    latest = apps.get_model("tracking", "LatestMetric")._meta.db_table
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"UPDATE {latest} SET points = (SELECT count(*) FROM {metric} m WHERE m.run_id = "
                       f"{latest}.run_id AND m.key = {latest}.key)")


class Migration(migrations.Migration):

    dependencies = [
        ('tracking', '0002_metric_point_once'),
    ]

    operations = [
        migrations.AddField(
            model_name='latestmetric',
            name='points',
            field=models.BigIntegerField(default=0),
        ),
        migrations.RunPython(count_points, migrations.RunPython.noop, elidable=True),
    ]
