"""A metric point is stored once (MLflow's primary key: run, key, step, timestamp, value, is_nan), and NaN
as MLflow's server stores it (value 0, is_nan). Points stored before: NaN rewritten, duplicates removed."""

from django.db import migrations, models


def nan_as_mlflow_and_points_once(apps, schema_editor):
    connection = schema_editor.connection
    metric = apps.get_model("tracking", "Metric")._meta.db_table
    latest = apps.get_model("tracking", "LatestMetric")._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":  # SQLite cannot have stored NaN
            for table in (metric, latest):
                cursor.execute(f"UPDATE {table} SET is_nan = TRUE, value = 0 WHERE value = 'NaN'::float8")
        cursor.execute(f"DELETE FROM {metric} WHERE id NOT IN (SELECT MIN(id) FROM {metric} "
                       "GROUP BY run_id, key, step, timestamp, value, is_nan)")


class Migration(migrations.Migration):

    dependencies = [
        ('tracking', '0001_initial'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='metric',
            name='metric_history',
        ),
        migrations.AddField(
            model_name='latestmetric',
            name='is_nan',
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name='metric',
            name='is_nan',
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(nan_as_mlflow_and_points_once, migrations.RunPython.noop, elidable=True),
        migrations.AddConstraint(
            model_name='metric',
            constraint=models.UniqueConstraint(fields=('run', 'key', 'step', 'timestamp', 'value', 'is_nan'), name='metric_point_once'),
        ),
    ]
