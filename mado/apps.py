from django.apps import AppConfig


class MadoConfig(AppConfig):
    name = "mado"
    verbose_name = "Identity"
