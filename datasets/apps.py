from django.apps import AppConfig


class DatasetsConfig(AppConfig):
    name = "datasets"
    verbose_name = "Datasets"

    def ready(self):
        from computers.page_blocks import register_details_block
        from datasets.models import DatasetCacheReport

        # The dataset cache the computer's worker last reported (what it holds, against its limit).
        register_details_block("datasets.cache", template="datasets/partials/_dataset_cache.html",
                               context=lambda request, target: {
                                   "dataset_cache": DatasetCacheReport.objects.filter(target=target).first()})
