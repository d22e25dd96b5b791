"""The two runners of a cluster job as real processes against the live server, without a scheduler
(the job shell's part is played here: MMT_REPLICA_INDEX and MMT_CLUSTER_NODES, as an owner's job shell
may set them; test_slurm_two_nodes.py does the same through a real Slurm). What they prove is the end
of docs/sites-protocol.md "Cluster jobs": main1's runner waits for the subs before its finish ends
the Job, so a sub's last lines written after main1's code ended are all stored; a sub that runs on
past the wait is stopped and exits 0."""
from __future__ import annotations

from jobs.models import JobEvent, LogChunk
from sites import submissions
from tests.site_runner.conftest import site, site_work_dir  # noqa: F401  (fixtures)
from tests.sites.conftest import host_keys, launcher, site_fields  # noqa: F401  (fixtures)
from worker_agent.site import runner as site_runner

# main1 ends at once; sub1 writes its lines after that (2 s later), or runs on for `{sub_sleep}` s.
CODE = '''\
import os, sys, time
if os.environ["MMT_CLUSTER_ROLE"] == "main":
    print("main1 done", flush=True)
    sys.exit(0)
time.sleep({sub_sleep})
for i in range(50):
    print(f"sub1 line {i:02d}", flush=True)
'''


def code(sub_sleep: float) -> list[str]:
    return ["python", "-c", CODE.replace("{sub_sleep}", str(sub_sleep))]


def replica_text(job, replica: str) -> str:
    text, at = [], 0
    for chunk in LogChunk.objects.filter(job_id=job.pk, replica=replica, stream="stdout").order_by("offset"):
        assert chunk.offset == at, f"{replica} chunk at byte {chunk.offset}, expected {at}"
        text.append(chunk.data)
        at += len(chunk.data.encode())
    return "".join(text)


def start_both(site, job):  # noqa: F811
    spec_dir, _ = site.submit(job)
    nodes = {"MMT_CLUSTER_NODES": "127.0.0.1,127.0.0.1", "MMT_MASTER_PORT": site_runner.free_port()}
    return (site.start_runner(spec_dir, MMT_REPLICA_INDEX=0, **nodes),
            site.start_runner(spec_dir, MMT_REPLICA_INDEX=1, **nodes))


def test_main1_waits_for_sub1_so_its_lines_written_after_main1s_end_are_all_stored(site):  # noqa: F811
    job = site.job(code(2), cluster_size=2)
    main, sub = start_both(site, job)
    assert main.wait() == 0, main.output()
    assert sub.wait() == 0, sub.output()
    job = site.wait_status(job, "finished", "failed", "canceled")
    assert (job.status, job.end_replica) == ("finished", "main1"), (job.error, main.output(), sub.output())
    assert replica_text(job, "main1") == "main1 done\n"
    assert replica_text(job, "sub1") == "".join(f"sub1 line {i:02d}\n" for i in range(50)), sub.output()
    kinds = list(JobEvent.objects.filter(job_id=job.pk).order_by("id").values_list("kind", flat=True))
    assert kinds.index("replica_ended") < len(kinds) - 1, kinds  # sub1 ended before the Job did
    assert "did not finish within" not in main.output()


def test_a_sub_running_past_the_wait_is_stopped_once_main1_ends_the_job(site, monkeypatch):  # noqa: F811
    monkeypatch.setattr(submissions, "REPLICA_WAIT_SECONDS", 2)  # the live server runs in this process
    job = site.job(code(300), cluster_size=2)
    main, sub = start_both(site, job)
    assert main.wait() == 0, main.output()
    assert "sub1 did not finish within 2 s of main1's end: main1 ends the Job now" in main.output()
    assert sub.wait(timeout=60) == 0, sub.output()  # met the revoked token, stopped its code, exits 0
    assert "sub1 is stopped and exits 0" in sub.output()
    job = site.wait_status(job, "finished", "failed", "canceled")
    assert (job.status, job.end_replica, replica_text(job, "sub1")) == ("finished", "main1", "")
