"""A job printing 20 MB of numbered lines as fast as it can: every line reaches the server once and in
order, over one follow stream, as log frames larger than the follow stream's chunks (docs/logs.md), and the
worker says how fast it delivered them. The 200 MB figure and the comparison with a raw `cat` stream are in
bench/log_throughput.py. The same job against an older server (JSON chunks) is test_log_frames_delivery.py."""
from __future__ import annotations

import re

from jobs.models import LogChunk
from tests.support import NUMBERED_LINES
from tests.test_log_frames import log_frames_routed  # noqa: F401  (fixture)

# The job records its pid (to prove it started once), then prints the numbered lines.
SCRIPT = ('''\
import os
with open(os.path.join(os.environ["MARKS"], os.environ["MARK"]), "a") as f:
    f.write(f"{os.getpid()}\\n")
''' + NUMBERED_LINES)
MB = 20
FOLLOW_CHUNK = 256 << 10


def run_numbered_lines(e2e):
    """The job, run to its end by a fresh worker, checked line by line; the sizes of its stdout rows."""
    worker = e2e.start_worker()
    script = e2e.script("volume.py", SCRIPT)
    job = e2e.create_job(command=["python", str(script), str(MB * 10 ** 6)],
                         env={"MARKS": str(e2e.marks), "MARK": "volume"})
    e2e.wait_ended(job, timeout=120)
    e2e.assert_ended_once(job, "finished")
    text = e2e.stream(job, "stdout")  # contiguous: no byte twice, none missing
    lines = text.splitlines()
    assert len(text.encode()) >= MB * 10 ** 6
    assert lines == [f"{i:010d} {'x' * 88}" for i in range(len(lines))]
    e2e.assert_delivered_in_order(job)
    assert len(e2e.starts("volume")) == 1
    assert worker.process.poll() is None
    chunks = LogChunk.objects.filter(job_id=job.pk, stream="stdout").order_by("id")
    first, last = chunks.first().created_at, chunks.last().created_at
    seconds = max((last - first).total_seconds(), 1e-3)
    print(f"\nlog delivery: {MB} MB in {seconds:.2f} s = {len(text.encode()) / seconds / 1e6:.1f} MB/s "
          f"({chunks.count()} chunks)")
    return job, [len(d.encode()) for d in chunks.values_list("data", flat=True)]


def test_twenty_megabytes_of_numbered_lines_arrive_once_in_order_as_frames_and_the_worker_says_how_fast(
        e2e, log_frames_routed):  # noqa: F811
    job, sizes = run_numbered_lines(e2e)
    assert max(sizes) > FOLLOW_CHUNK, "chunks merged into frames of up to 4 MiB"
    said = re.findall(rf"job {job.pk}: delivered (\d+\.\d) MB of logs in \d+\.\d s \((\d+\.\d) MB/s\)",
                      e2e.worker_output())
    assert said and float(said[-1][0]) >= 10.0, e2e.worker_output()[-3000:]
    assert "takes no log frames" not in e2e.worker_output()
