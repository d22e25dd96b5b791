"""Launcher.allowed_hosts (issue 14, finding 2): the hosts a launcher may log in to. A new launcher may
log in nowhere until a global administrator sets its list; a launcher that already serves sites starts
with exactly the hosts and jump hosts those sites name, so nothing that worked stops and nothing new opens."""
import re

from django.db import migrations, models

JUMP_HOST = re.compile(r"^(?:[^@]+@)?(?P<host>\[[^\]]+\]|[^:]+)(?::[0-9]+)?$")


def hosts_of_existing_sites(apps, schema_editor):
    Launcher = apps.get_model("sites", "Launcher")
    SiteSettings = apps.get_model("sites", "SiteSettings")
    for launcher in Launcher.objects.all():
        hosts: list[str] = []
        for site in SiteSettings.objects.filter(launcher=launcher).order_by("target_id"):
            names = [site.host] if site.host else []
            for item in site.jump_hosts or []:
                match = JUMP_HOST.match(str(item))
                if match:
                    names.append(match["host"].strip("[]"))
            for name in names:
                # The exact name, never a pattern: a host holding glob characters could not be saved anyway.
                name = name.strip().lower()
                if name and not any(ch in name for ch in "*?[]") and name not in hosts:
                    hosts.append(name)
        if hosts:
            launcher.allowed_hosts = hosts
            launcher.save(update_fields=["allowed_hosts"])


class Migration(migrations.Migration):

    dependencies = [
        ("sites", "0004_submission_replica_runners"),
    ]

    operations = [
        migrations.AddField(
            model_name="launcher",
            name="allowed_hosts",
            field=models.JSONField(
                blank=True, default=list, verbose_name="Allowed hosts",
                help_text="Host name patterns such as *.hpc.example.ac.jp or login[1-4].example.org; sites of "
                          "this launcher may name only matching hosts and jump hosts. Empty: nowhere."),
        ),
        migrations.RunPython(hosts_of_existing_sites, migrations.RunPython.noop),
    ]
