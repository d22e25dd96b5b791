from django.apps import AppConfig


class TrackingConfig(AppConfig):
    name = "tracking"
    verbose_name = "Tracking"

    def ready(self):
        from jobs import hooks
        from tracking import page_blocks  # noqa: F401  (registers the Run panel of the job page)
        from tracking import services

        hooks.register_after_create("tracking.run", services.create_job_run, options=("run_kind",))
        hooks.register_after_start("tracking.run", services.start_job_run)
        hooks.register_after_end("tracking.run", services.end_job_run)
        hooks.register_claim_payload("tracking.run", services.claim_payload, reads=("run",))
        hooks.register_metrics_recorded("tracking.run", services.record_job_metrics)
