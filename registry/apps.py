from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "registry"
    verbose_name = "Model registry"

    def ready(self):
        from jobs import outputs
        from registry import logged_models, services
        from tracking import artifacts

        outputs.register_models_handler("registry.models", check=services.check_job_models,
                                        register=services.register_job_models)
        # A logged model's files: mlflow-artifacts:/<experiment>/models/<model_id>/artifacts/…
        artifacts.register_tree("models", logged_models.tree_of)
