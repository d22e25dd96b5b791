from django.apps import AppConfig


class ComputersConfig(AppConfig):
    name = "computers"

    def ready(self):
        from computers import services
        from mado import periodic

        periodic.register("computers.expire_stale", lambda: services.expire_stale(force=True), every_seconds=5)
