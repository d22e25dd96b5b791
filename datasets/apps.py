from django.apps import AppConfig


class DatasetsConfig(AppConfig):
    name = "datasets"
    verbose_name = "Datasets"

    def ready(self):
        from computers.page_blocks import register_details_block
        from datasets import services
        from datasets.models import DatasetCacheReport
        from jobs import inputs, outputs

        # The dataset cache the computer's worker last reported (what it holds, against its limit).
        register_details_block("datasets.cache", template="datasets/partials/_dataset_cache.html",
                               context=lambda request, target: {
                                   "dataset_cache": DatasetCacheReport.objects.filter(target=target).first()})

        # jobs may not import datasets (DESIGN §2): a Job's `input_datasets` are dataset versions, and the
        # `datasets` that its result.json declares become versions when it finishes.
        inputs.register_provider(inputs.InputsProvider(
            clean=services.clean_input_datasets, attach=services.attach_inputs, summary=services.job_inputs_summary,
            claim_payload=services.claim_payload, page_versions=services.input_versions,
            choices=services.input_choices, prefetch=services.PREFETCH_JOB_INPUTS, max_count=services.MAX_INPUTS))
        outputs.register_section_handler(
            "datasets", "datasets.versions", register=services.register_job_outputs,
            check=lambda job, declared: services.check_declarations(job.project, declared))
