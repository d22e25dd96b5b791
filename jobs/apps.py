from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"

    def ready(self):
        from mado import periodic
        from jobs import services

        periodic.register("jobs.requeue_unstarted", lambda: services.requeue_unstarted(force=True), every_seconds=5)
        periodic.register("jobs.not_responding", services.report_unresponsive, every_seconds=5)
