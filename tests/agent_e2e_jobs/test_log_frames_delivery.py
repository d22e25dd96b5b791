"""Against a server without the log-frames endpoint (an older one: its catch-all answers 404) a real worker
falls back to JSON chunks of at most 256 KiB, with the same result as the log frames of test_log_volume.py:
20 MB of numbered lines once and in order.

This module is also the URLconf of the older server: the log-frames path answers as unknown paths do."""
from __future__ import annotations

from django.urls import re_path

from mado import urls as mado_urls
from mado.exceptions import json_not_found
from tests.agent_e2e_jobs.test_log_volume import FOLLOW_CHUNK, run_numbered_lines

urlpatterns = [re_path(r"^api/worker/jobs/[0-9]+/log-frames$", json_not_found), *mado_urls.urlpatterns]
handler400, handler404, handler500 = mado_urls.handler400, mado_urls.handler404, mado_urls.handler500


def test_an_older_server_gets_json_chunks_with_the_same_result(e2e, settings):
    settings.ROOT_URLCONF = __name__
    job, sizes = run_numbered_lines(e2e)
    assert max(sizes) <= FOLLOW_CHUNK
    assert f"job {job.pk}: the server takes no log frames; sending logs as JSON chunks" in e2e.worker_output()
