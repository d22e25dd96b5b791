from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers"

    def ready(self):
        from mado import periodic
        from workers import services

        periodic.register("workers.presence", services.sweep_presence, every_seconds=5)
