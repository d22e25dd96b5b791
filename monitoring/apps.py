from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    """Prometheus metrics at /metrics (issue 21): the top layer, reading every app below it."""

    name = "monitoring"
    verbose_name = "Monitoring"

    def ready(self):
        from django.core import checks

        from monitoring.checks import metrics_allowed_addresses

        checks.register(metrics_allowed_addresses)
