"""Site checks get their own table (issue 17): the rows of computers.ConnectionCheck that a launcher
answers (launcher set) move to sites.SiteCheck with their ids, so the check pages' addresses and the
audit rows that name a check (`site.check.finish`, where the launcher's own message is kept) still
find it. computers 0006 then drops the site columns from ConnectionCheck."""
import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.core.management.color import no_style
from django.db import migrations, models

SHARED = ["requested_by_id", "status", "failure_reason", "result", "created_at", "claimed_at", "finished_at",
          "target_id", "launcher_id", "site_user_id", "account_name"]


def move_site_checks(apps, schema_editor):
    ConnectionCheck = apps.get_model("computers", "ConnectionCheck")
    SiteCheck = apps.get_model("sites", "SiteCheck")
    rows = ConnectionCheck.objects.filter(launcher__isnull=False)
    SiteCheck.objects.bulk_create(
        [SiteCheck(id=row.pk, **{field: getattr(row, field) for field in SHARED}) for row in rows.iterator()],
        batch_size=500)
    rows.delete()
    # The ids were given: the next check takes the one after the highest (PostgreSQL keeps a sequence).
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        for sql in connection.ops.sequence_reset_sql(no_style(), [SiteCheck]):
            cursor.execute(sql)


def move_back(apps, schema_editor):
    """Undone: the site checks go back among the workers' checks, under new ids (theirs may be taken)."""
    ConnectionCheck = apps.get_model("computers", "ConnectionCheck")
    SiteCheck = apps.get_model("sites", "SiteCheck")
    rows = SiteCheck.objects.order_by("id").iterator()
    ConnectionCheck.objects.bulk_create([ConnectionCheck(**{field: getattr(row, field) for field in SHARED})
                                         for row in rows], batch_size=500)


class Migration(migrations.Migration):

    dependencies = [
        ('computers', '0005_compute_groups'),
        ('sites', '0005_launcher_allowed_hosts'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='SiteCheck',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('status', models.CharField(choices=[('queued', 'Waiting for the worker to start checking…'), ('claimed', 'The worker is checking the connection…'), ('succeeded', 'Connection verified'), ('failed', 'Could not verify connection'), ('expired', 'Expired')], default='queued', max_length=12)),
                ('failure_reason', models.CharField(blank=True, max_length=32)),
                ('result', models.JSONField(blank=True, null=True)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('claimed_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('account_name', models.CharField(blank=True, max_length=64)),
                ('launcher', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='checks', to='sites.launcher')),
                ('requested_by', models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('site_user', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('target', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='site_checks', to='computers.computetarget')),
            ],
            options={
                'ordering': ['-created_at', '-id'],
                'abstract': False,
                'constraints': [models.UniqueConstraint(condition=models.Q(('site_user__isnull', True), ('status__in', ('queued', 'claimed'))), fields=('target',), name='one_open_site_check_per_target'), models.UniqueConstraint(condition=models.Q(('site_user__isnull', False), ('status__in', ('queued', 'claimed'))), fields=('target', 'site_user'), name='one_open_site_check_per_user')],
            },
        ),
        migrations.RunPython(move_site_checks, move_back),
    ]
