from django.apps import AppConfig
from django.db.models import Q


class JobsConfig(AppConfig):
    name = "jobs"

    def ready(self):
        from computers import locks
        from computers.page_blocks import register_details_block
        from jobs import gpu_board, services
        from jobs.choices import ACTIVE_STATUSES
        from jobs.models import Job
        from mado import periodic

        # A cluster job holds every computer one of its replicas runs on, not only main1's.
        locks.register_holders(
            of_computer=lambda target: Job.objects.filter(Q(target=target) | Q(replicas__target=target),
                                                          status__in=ACTIVE_STATUSES).distinct().order_by("pk"),
            of_group=lambda group: Job.objects.filter(compute_group=group, status__in=ACTIVE_STATUSES).order_by("pk"))

        # A computer's details show which Job holds each of its GPUs now (the GPU board's row).
        register_details_block("jobs.gpus", template="computers/partials/_gpu_block.html",
                               context=gpu_board.details_block)

        periodic.register("jobs.requeue_unstarted", lambda: services.requeue_unstarted(force=True), every_seconds=5)
        periodic.register("jobs.not_responding", services.report_unresponsive, every_seconds=5)
