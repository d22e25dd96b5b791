"""ConnectionCheck keeps only workers' checks (issue 17): sites 0006 moved the launchers' checks to
sites.SiteCheck, so the site columns go, and one open check per computer no longer needs their
condition."""
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('computers', '0005_compute_groups'),
        ('sites', '0006_sitecheck'),
        ('workers', '0003_worker_reported_online'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='connectioncheck',
            name='one_open_check_per_target',
        ),
        migrations.RemoveConstraint(
            model_name='connectioncheck',
            name='one_open_check_per_site_user',
        ),
        migrations.RemoveField(
            model_name='connectioncheck',
            name='account_name',
        ),
        migrations.RemoveField(
            model_name='connectioncheck',
            name='launcher',
        ),
        migrations.RemoveField(
            model_name='connectioncheck',
            name='site_user',
        ),
        migrations.AddConstraint(
            model_name='connectioncheck',
            constraint=models.UniqueConstraint(condition=models.Q(('status__in', ('queued', 'claimed'))), fields=('target',), name='one_open_check_per_target'),
        ),
    ]
