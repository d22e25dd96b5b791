from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    verbose_name = "Model registry"

    def ready(self):
        from jobs import outputs
        from registry import services

        outputs.register_models_handler("registry.models", check=services.check_job_models,
                                        register=services.register_job_models)
