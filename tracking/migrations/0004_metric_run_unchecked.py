"""Metric.run without a database foreign key: PostgreSQL checked it once per stored point, a third of
storing a 1000-point batch (see tracking.models.Metric). Dropping the constraint is instant."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tracking', '0003_latestmetric_points'),
    ]

    operations = [
        migrations.AlterField(
            model_name='metric',
            name='run',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='metric_points', to='tracking.run'),
        ),
    ]
