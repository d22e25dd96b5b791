"""Registers the Run panel on the job page (jobs.page_blocks). Imported by TrackingConfig.ready()."""
from jobs.page_blocks import register_job_block
from tracking import views

register_job_block("tracking.run", template="tracking/partials/_run_panel.html",
                   context=views.job_block_context, version=views.job_block_version,
                   replaces=("metrics",))  # the Run panel draws the Job's metric series
