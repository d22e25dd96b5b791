from django.apps import AppConfig


class MadoConfig(AppConfig):
    name = "mado"
    verbose_name = "Identity"

    def ready(self):
        from mado import schema  # noqa: F401  registers the OpenAPI auth extensions
