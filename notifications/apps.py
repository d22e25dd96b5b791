from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"

    def ready(self):
        # Lower layers never import this app: it follows their audit rows (one post_save receiver,
        # inside the writer's transaction, so an event and its deliveries commit or vanish together)
        # and registers its delivery loop with the periodic runner.
        from django.db.models.signals import post_save

        from jobs import hooks
        from mado import periodic
        from mado.models import AuditEvent
        from notifications import delivery, services

        post_save.connect(services.on_audit_event, sender=AuditEvent, dispatch_uid="notifications.on_audit_event")
        periodic.register("notifications.deliver", lambda: delivery.deliver_due(wait=False), every_seconds=1)
        # "Notify me when it ends" on the Create job form and `notify_me` in POST /api/projects/{p}/jobs.
        hooks.register_after_create("notifications.notify_me", services.after_job_created, options=("notify_me",))
