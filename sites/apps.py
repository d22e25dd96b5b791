from django.apps import AppConfig


class SitesConfig(AppConfig):
    name = "sites"

    def ready(self):
        from computers import kinds
        from computers.choices import Kind
        from jobs import executors
        from mado import periodic
        from sites import checks, executor, services, submissions, views

        kinds.register(Kind.SITE, kinds.KindHandlers(update=services.update_site, add_view=views.add_site,
                                                     details_context=views.site_details_context,
                                                     checks=checks.checks_of))
        # A stop reaches the site as a scheduler cancellation, or in the runner's next heartbeat.
        executors.register(Kind.SITE, executors.Executor(
            validate=executor.validate, created=executor.created, stop=submissions.stop,
            summary=submissions.submission_summary, manual_instructions=executor.manual_instructions,
            submitter=executor.submitter, error_for=submissions.job_error_for))

        # Site deadlines (submit_failed, queue_timeout) and site check expiry, while nobody looks.
        periodic.register("sites.expire_overdue", lambda: submissions.expire_overdue(force=True), every_seconds=5)
        periodic.register("sites.expire_checks", lambda: checks.expire_checks(force=True), every_seconds=5)
