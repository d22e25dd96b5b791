"""A job printing 20 MB of numbered lines as fast as it can: every line reaches the server once and in
order, over one follow stream. The 200 MB figure and the comparison with a raw `cat` stream are in
bench/log_throughput.py."""
from __future__ import annotations

from jobs.models import LogChunk
from tests.support import NUMBERED_LINES

# The job records its pid (to prove it started once), then prints the numbered lines.
SCRIPT = ('''\
import os
with open(os.path.join(os.environ["MARKS"], os.environ["MARK"]), "a") as f:
    f.write(f"{os.getpid()}\\n")
''' + NUMBERED_LINES)
MB = 20


def test_twenty_megabytes_of_numbered_lines_arrive_once_and_in_order(e2e):
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
    chunks = LogChunk.objects.filter(job_id=job.pk, stream="stdout").order_by("id")
    first, last = chunks.first().created_at, chunks.last().created_at
    seconds = max((last - first).total_seconds(), 1e-3)
    print(f"\nlog delivery: {MB} MB in {seconds:.2f} s = {len(text.encode()) / seconds / 1e6:.1f} MB/s "
          f"({chunks.count()} chunks)")
    assert worker.process.poll() is None
