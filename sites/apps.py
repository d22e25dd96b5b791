from django.apps import AppConfig


class SitesConfig(AppConfig):
    name = "sites"

    def ready(self):
        from mado import periodic
        from sites import checks, submissions

        # Site deadlines (submit_failed, queue_timeout) and site check expiry, while nobody looks.
        periodic.register("sites.expire_overdue", lambda: submissions.expire_overdue(force=True), every_seconds=5)
        periodic.register("sites.expire_checks", lambda: checks.expire_checks(force=True), every_seconds=5)
