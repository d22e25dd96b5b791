"""How many output files a job may leave (issue 14, seed 001): the worker's MMT_WORKER_MAX_OUTPUT_FILES is
the setting a user changes, and the server accepts what it allows up to its own maximum,
MADO_MAX_OUTPUT_FILES. A job over the limit fails, and its error names the setting that decided: the
worker's, unless the server's maximum is the lower one. A real `mado-tracking-worker run` over the
loopback sshd; the server's maximum is set for the live server in this process."""
from __future__ import annotations

from jobs.models import Artifact

WRITES = """\
import hashlib, json, os, sys
out = os.environ["MMT_OUTPUTS_DIR"]
artifacts = []
for i in range(int(sys.argv[1])):
    data = f"file {i}\\n".encode()
    os.makedirs(os.path.join(out, f"part{i}"), exist_ok=True)  # directories do not count
    with open(os.path.join(out, f"part{i}", "out.txt"), "wb") as f:
        f.write(data)
    artifacts.append({"path": f"part{i}/out.txt", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
with open(os.environ["MMT_RESULT_FILE"], "w") as f:
    json.dump({"version": 1, "complete": True, "artifacts": artifacts}, f)
"""


def test_the_worker_setting_decides_up_to_the_server_maximum(e2e, settings):
    settings.MAX_OUTPUT_FILES = 8
    script = e2e.script("writes.py", WRITES)

    def job_writing(count: int):
        return e2e.create_job(command=["python", str(script), str(count)])

    worker = e2e.start_worker(MMT_WORKER_MAX_OUTPUT_FILES=6)
    within = job_writing(6)
    job = e2e.wait_ended(within, timeout=120)
    assert (job.status, job.error) == ("finished", ""), (job.error, worker.output()[-3000:])
    assert Artifact.objects.filter(job_id=within.pk, complete=True).count() == 6

    over_the_worker = job_writing(7)
    job = e2e.wait_ended(over_the_worker, timeout=60)
    assert (job.status, job.end_reason) == ("failed", "invalid_result"), job.error
    assert "holds 7 files; the limit is 6" in job.error, job.error
    assert "raise MMT_WORKER_MAX_OUTPUT_FILES on the worker" in job.error, job.error
    worker.stop()

    # The worker allows more than the server's maximum: the server's decides, and its message says so.
    worker = e2e.start_worker(MMT_WORKER_MAX_OUTPUT_FILES=20)
    over_the_server = job_writing(9)
    job = e2e.wait_ended(over_the_server, timeout=60)
    assert (job.status, job.end_reason) == ("failed", "invalid_result"), (job.error, worker.output()[-3000:])
    assert "holds 9 files; the limit is 8" in job.error, job.error
    assert "MADO_MAX_OUTPUT_FILES" in job.error and "raise MMT_WORKER_MAX_OUTPUT_FILES" not in job.error, job.error
    assert not Artifact.objects.filter(job_id=over_the_server.pk).exists()
