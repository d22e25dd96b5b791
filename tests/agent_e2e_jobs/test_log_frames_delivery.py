"""A real worker delivers a job's stdout as log frames (docs/logs.md): 20 MB of numbered lines arrive once
and in order in chunks larger than the follow stream's 256 KiB, and the worker says how fast it went.
Against a server without the log-frames endpoint (an older one: its catch-all answers 404) the same
worker falls back to JSON chunks of at most 256 KiB, with the same result.

This module is also the URLconf of the older server: the log-frames path answers as unknown paths do."""
from __future__ import annotations

import re

from django.urls import re_path

from jobs.models import LogChunk
from mado import urls as mado_urls
from mado.exceptions import json_not_found
from tests.support import NUMBERED_LINES
from tests.test_log_frames import log_frames_routed  # noqa: F401  (fixture)

urlpatterns = [re_path(r"^api/worker/jobs/[0-9]+/log-frames$", json_not_found), *mado_urls.urlpatterns]
handler400, handler404, handler500 = mado_urls.handler400, mado_urls.handler404, mado_urls.handler500
MB = 20
FOLLOW_CHUNK = 256 << 10


def run_numbered_lines(e2e):
    worker = e2e.start_worker()
    script = e2e.script("volume.py", NUMBERED_LINES)
    job = e2e.create_job(command=["python", str(script), str(MB * 10 ** 6)])
    e2e.wait_ended(job, timeout=120)
    e2e.assert_ended_once(job, "finished")
    text = e2e.stream(job, "stdout")  # contiguous: no byte twice, none missing
    lines = text.splitlines()
    assert len(text.encode()) >= MB * 10 ** 6
    assert lines == [f"{i:010d} {'x' * 88}" for i in range(len(lines))]
    e2e.assert_delivered_in_order(job)
    assert worker.process.poll() is None
    sizes = [len(d.encode()) for d in LogChunk.objects.filter(job_id=job.pk, stream="stdout").values_list("data",
                                                                                                          flat=True)]
    return job, sizes


def test_a_large_log_arrives_as_frames_once_and_in_order_and_the_worker_says_how_fast(e2e, log_frames_routed):  # noqa: F811
    job, sizes = run_numbered_lines(e2e)
    assert max(sizes) > FOLLOW_CHUNK, "chunks merged into frames of up to 4 MiB"
    said = re.findall(rf"job {job.pk}: delivered (\d+\.\d) MB of logs in \d+\.\d s \((\d+\.\d) MB/s\)",
                      e2e.worker_output())
    assert said and float(said[-1][0]) >= 10.0, e2e.worker_output()[-3000:]
    assert "takes no log frames" not in e2e.worker_output()


def test_an_older_server_gets_json_chunks_with_the_same_result(e2e, settings):
    settings.ROOT_URLCONF = __name__
    job, sizes = run_numbered_lines(e2e)
    assert max(sizes) <= FOLLOW_CHUNK
    assert f"job {job.pk}: the server takes no log frames; sending logs as JSON chunks" in e2e.worker_output()
