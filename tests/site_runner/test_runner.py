"""The runner on the compute node against the real server (see conftest.py): a Job's whole life as a
site reports it — start, waiting_resources → running, logs in order, outputs and artifacts, finish —
and the ways it ends otherwise: a second runner, the scheduler's SIGTERM, a stop request, a bad spec
directory, a token that ended."""
from __future__ import annotations

import hashlib
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from jobs.models import Artifact, JobEvent, Metric
from mado.services import Actor
from sites.models import Submission
from tests.conftest import bearer
from tests.site_runner.conftest import SCHEDULER_JOB_ID, FlakyProxy, lib_runner, write_spec_dir
from tests.support import wait_for
from worker_agent import supervisor

TRAIN = '''\
import hashlib, json, os, sys
params = json.load(open(os.environ["MMT_PARAMETERS_FILE"]))
for i in range(params["lines"]):
    print(f"line {i:04d} 評価")
    if i % 50 == 0:
        print(f"progress {i}", file=sys.stderr)
out = os.environ["MMT_OUTPUTS_DIR"]
data = bytes(range(256)) * 64
with open(os.path.join(out, "model.bin"), "wb") as f:
    f.write(data)
result = {"version": 1, "complete": True,
          "artifacts": [{"path": "model.bin", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}],
          "metrics": [{"name": "train.loss", "value": 0.25, "step": 1}, {"name": "train.loss", "value": 0.125, "step": 2}]}
with open(os.environ["MMT_RESULT_FILE"], "w") as f:
    json.dump(result, f)
print("cwd", os.getcwd(), "api", os.environ["MMT_API_URL"], "job", os.environ["MMT_JOB_ID"])
'''

# Prints a numbered line every 0.1 s until stopped; says which signal stopped it.
TICKER = '''\
import signal, sys, time
def stop(signum, frame):
    print("got", signal.Signals(signum).name, flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
i = 0
while True:
    print(f"tick {i}", flush=True)
    i += 1
    time.sleep(0.1)
'''


def ticker_lines(text: str) -> list[int]:
    return [int(line.split()[1]) for line in text.splitlines() if line.startswith("tick ")]


def test_python_job_from_a_source_archive_finishes_with_logs_metrics_and_artifact(site):
    lines = 300
    job = site.job(["python", "train.py"], source=site.source({"train.py": TRAIN}), parameters={"lines": lines})
    spec_dir, spec = site.submit(job)
    assert site.status(job) == "submitted"
    assert (spec_dir / "job.json").stat().st_mode & 0o777 == 0o600

    runner = site.start_runner(spec_dir, MMT_ARRAY_INDEX=0)
    site.wait_status(job, "waiting_resources", "running", "finished")
    assert runner.wait() == 0, runner.output()

    job.refresh_from_db()
    assert (job.status, job.exit_code, job.end_reason) == ("finished", 0, "exit_code"), job.error
    assert job.started_at is not None and job.finished_at >= job.started_at
    stdout = site.log(job, "stdout")
    expected = "".join(f"line {i:04d} 評価\n" for i in range(lines))
    assert stdout.startswith(expected)
    workspace = f"{site.work_dir}/.mmt/jobs/{job.pk}"
    # The code ran in the unpacked source, and reaches the server at the site's runner API URL.
    assert stdout[len(expected):] == f"cwd {workspace}/source api {site.url} job {job.pk}\n"
    stderr = site.log(job, "stderr")
    assert [line for line in stderr.splitlines() if line.startswith("progress")] == \
        [f"progress {i}" for i in range(0, lines, 50)]

    assert [(m.name, m.value, m.step) for m in Metric.objects.filter(job=job).order_by("step")] == \
        [("train.loss", 0.25, 1), ("train.loss", 0.125, 2)]
    artifact = Artifact.objects.get(job=job)
    data = bytes(range(256)) * 64
    assert (artifact.path, artifact.size, artifact.sha256, artifact.complete) == \
        ("model.bin", len(data), hashlib.sha256(data).hexdigest(), True)

    row = Submission.objects.get(job=job)
    assert row.runner_hostname == socket.gethostname() and row.scheduler_job_id == SCHEDULER_JOB_ID
    kinds = list(JobEvent.objects.filter(job=job).order_by("id").values_list("kind", flat=True))
    assert kinds.index("runner_started") < kinds.index("started") < kinds.index("finished"), kinds
    assert spec["token"] not in runner.output()

    # The Job has ended, and its token with it: the same spec directory cannot report again.
    again = site.start_runner(spec_dir)
    assert again.wait() == 3
    assert "no longer valid" in again.output() and spec["token"] not in again.output()


MANY_OUTPUTS = '''\
import hashlib, json, os
out = os.environ["MMT_OUTPUTS_DIR"]
artifacts = []
for i in range(300):
    data = f"output {i} 評価\\n".encode() * (i % 7 + 1)
    path = f"parts/{i:03d}.txt"
    os.makedirs(os.path.join(out, "parts"), exist_ok=True)
    with open(os.path.join(out, path), "wb") as f:
        f.write(data)
    artifacts.append({"path": path, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
with open(os.environ["MMT_RESULT_FILE"], "w") as f:
    json.dump({"version": 1, "complete": True, "artifacts": artifacts}, f)
'''


def test_a_site_job_sends_its_many_small_outputs_in_one_batch_request_each_verified(site, monkeypatch):
    """The runner sends small outputs as the worker does (issue 18): many files per request, each checked
    against its declared size and sha256 by the server, not one request per file."""
    from jobs import outputs

    requests = {"batch": 0, "single": 0}
    real_batch, real_single = outputs.receive_batch, outputs.receive_artifact
    monkeypatch.setattr(outputs, "receive_batch",
                        lambda *a, **k: requests.__setitem__("batch", requests["batch"] + 1) or real_batch(*a, **k))
    monkeypatch.setattr(outputs, "receive_artifact",
                        lambda *a, **k: requests.__setitem__("single", requests["single"] + 1) or real_single(*a, **k))
    job = site.job(["python", "many.py"], source=site.source({"many.py": MANY_OUTPUTS}))
    spec_dir, _spec = site.submit(job)
    runner = site.start_runner(spec_dir, MMT_ARRAY_INDEX=0)
    site.wait_status(job, "finished", "failed")
    assert runner.wait() == 0, runner.output()
    job.refresh_from_db()
    assert job.status == "finished", job.error
    stored = {a.path: a for a in Artifact.objects.filter(job=job)}
    assert len(stored) == 300 and all(a.complete for a in stored.values())
    for i in (0, 6, 299):
        data = f"output {i} 評価\n".encode() * (i % 7 + 1)
        artifact = stored[f"parts/{i:03d}.txt"]
        assert (artifact.size, artifact.sha256) == (len(data), hashlib.sha256(data).hexdigest())
        assert artifact.file.open("rb").read() == data
    assert requests == {"batch": 1, "single": 0}, requests


def test_second_runner_of_the_same_job_exits_3_and_the_first_one_goes_on(site):
    job = site.job(["python", "-c", TICKER])
    spec_dir, spec = site.submit(job)
    first = site.start_runner(spec_dir)
    site.wait_status(job, "running")

    second = site.start_runner(spec_dir)
    assert second.wait(timeout=30) == 3
    assert "another runner already reports this Job" in second.output(), second.output()
    assert spec["token"] not in second.output()
    assert site.status(job) == "running"

    first.signal(signal.SIGTERM)
    assert first.wait() == 1, first.output()
    assert site.status(job) == "failed"


def test_sigterm_from_the_scheduler_ends_the_job_timed_out_and_keeps_its_logs(site):
    job = site.job(["python", "-c", TICKER])
    spec_dir, _ = site.submit(job)
    runner = site.start_runner(spec_dir)
    site.wait_status(job, "running")
    wait_for(lambda: len(ticker_lines(site.log(job, "stdout"))) >= 10, timeout=20, what="ten ticks stored")

    runner.signal(signal.SIGTERM)  # what Slurm's --signal=B:TERM@120 does before the time limit
    assert runner.wait(timeout=40) == 1, runner.output()

    job.refresh_from_db()
    assert (job.status, job.end_reason) == ("failed", "timed_out"), job.error
    assert "time limit" in job.error
    stdout = site.log(job, "stdout")
    ticks = ticker_lines(stdout)
    assert len(ticks) >= 10 and ticks == list(range(len(ticks)))  # everything up to the stop, in order
    assert stdout.endswith("got SIGTERM\n")  # the code had its SIGTERM, and what it said then arrived
    assert "SIGTERM received" in runner.output()
    # Nothing of the Job is left running.
    state = json.loads(Path(f"{site.work_dir}/.mmt/jobs/{job.pk}/state.json").read_text())
    assert state["status"] == "canceled" and not supervisor.is_alive(state["pid"], state["identity"])


def test_stop_request_cancels_the_running_job(site):
    job = site.job(["python", "-c", TICKER])
    spec_dir, _ = site.submit(job)
    runner = site.start_runner(spec_dir)
    site.wait_status(job, "running")

    answer = bearer(site.world.member_token(site.world.project_admin)).post(f"/api/jobs/{job.pk}/stop")
    assert answer.status_code == 200, answer.content
    asked = time.monotonic()
    assert runner.wait(timeout=40) == 1, runner.output()
    # The next heartbeat (every 5 s) carries the request; SIGTERM stops the code at once.
    assert time.monotonic() - asked < 15

    job.refresh_from_db()
    assert (job.status, job.end_reason) == ("canceled", "canceled")
    stdout = site.log(job, "stdout")
    assert stdout.endswith("got SIGTERM\n") and ticker_lines(stdout) == list(range(len(ticker_lines(stdout))))
    assert "A stop was requested" in runner.output()


def test_non_zero_exit_and_invalid_result_end_failed(site):
    failing = site.job(["python", "-c", "import sys; print('bye'); sys.exit(3)"])
    spec_dir, _ = site.submit(failing)
    assert site.start_runner(spec_dir).wait() == 1
    failing.refresh_from_db()
    assert (failing.status, failing.exit_code, failing.end_reason) == ("failed", 3, "exit_code")
    assert site.log(failing, "stdout") == "bye\n"

    wrong = ("import json, os; open(os.environ['MMT_OUTPUTS_DIR'] + '/a.txt', 'w').write('x'); "
             "json.dump({'version': 1, 'complete': True, 'artifacts': [{'path': 'a.txt', 'sha256': '0' * 64, "
             "'size': 1}]}, open(os.environ['MMT_RESULT_FILE'], 'w'))")
    invalid = site.job(["python", "-c", wrong])
    spec_dir, _ = site.submit(invalid)
    runner = site.start_runner(spec_dir)
    assert runner.wait() == 1
    invalid.refresh_from_db()
    assert (invalid.status, invalid.exit_code, invalid.end_reason) == ("failed", 0, "invalid_result")
    assert "a.txt" in invalid.error and "sha256" in invalid.error
    assert not Artifact.objects.filter(job=invalid).exists()


def run_lib_runner(spec_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """`python SPEC_DIR/lib/worker_agent/site/runner.py …` with nothing but the standard library (-I -S)."""
    return subprocess.run([sys.executable, "-I", "-S", str(lib_runner(spec_dir)), *args], capture_output=True,
                          text=True, timeout=30, check=False)


def test_bad_spec_directory_exits_2_with_what_to_fix(tmp_path):
    spec_dir = write_spec_dir(tmp_path / "spec", api_url="http://127.0.0.1:9", token="mado_mtj_" + "A" * 43,
                              job={"id": 5}, runner_python=sys.executable)

    missing = run_lib_runner(spec_dir, str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "nowhere cannot be read" in missing.stderr and "MMT_SPEC_DIR" in missing.stderr

    (spec_dir / "job.json").write_text("{not json")
    broken = run_lib_runner(spec_dir, str(spec_dir))
    assert broken.returncode == 2 and "job.json is not valid JSON" in broken.stderr

    (spec_dir / "job.json").write_text(json.dumps({"format": 2, "api_url": "http://x", "token": "t", "job": {"id": 5}}))
    newer = run_lib_runner(spec_dir, str(spec_dir))
    assert newer.returncode == 2 and "format 2" in newer.stderr

    (spec_dir / "job.json").write_text(json.dumps({"format": 1, "api_url": "ftp://x", "token": "t", "job": {"id": 5}}))
    url = run_lib_runner(spec_dir, str(spec_dir))
    assert url.returncode == 2 and "api_url" in url.stderr

    (spec_dir / "job.json").write_text(json.dumps({"format": 1, "api_url": "http://x", "token": "t", "job": {}}))
    no_job = run_lib_runner(spec_dir, str(spec_dir))
    assert no_job.returncode == 2 and "numeric id" in no_job.stderr

    usage = run_lib_runner(spec_dir)
    assert usage.returncode == 2 and "usage: mado-tracking runner SPEC_DIR" in usage.stderr


class NotedCut(FlakyProxy):
    """A FlakyProxy that notes what its cut did: the request lines it answered 503 and the connections it
    dropped, so that a test ends each part of the cut once the runner has met it."""

    def __init__(self, url: str):
        self.answered_503: list[str] = []
        self.dropped: list[int] = []
        super().__init__(url)

    def _serve(self, client) -> None:
        mode = self.mode  # read once: the test moves it from 503 to reset to None while connections arrive
        if mode == "503":
            with client:
                request = client.recv(65536)
                client.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                               b"Connection: close\r\n\r\n")
            self.answered_503.append(request.split(b"\r\n", 1)[0].decode("ascii", "replace"))
        elif mode == "reset":
            client.close()
            self.dropped.append(1)
        else:
            super()._serve(client)


def printed_lines(path: str) -> str:
    """What the Job's code has printed so far (stdout.log in its workspace), up to its last whole line."""
    text = Path(path).read_text(errors="replace")
    return text[:text.rfind("\n") + 1]


def test_a_network_cut_delays_logs_and_heartbeats_but_loses_and_repeats_nothing(site):
    """503s, then connections dropped, while the code prints: the runner retries with backoff, the Job
    stays running, and every line arrives once and in order after the network is back."""
    job = site.job(["python", "-c", TICKER])
    spec_dir, spec = site.submit(job)
    proxy = NotedCut(site.url)
    try:
        write_spec_dir(spec_dir, api_url=proxy.url, token=spec["token"], job=spec["job"],
                       runner_python=sys.executable)
        runner = site.start_runner(spec_dir)
        site.wait_status(job, "running")
        wait_for(lambda: ticker_lines(site.log(job, "stdout")), timeout=20, what="the first ticks")

        # The cut lasts until the runner has met both of its kinds: a log delivery answered 503, then a
        # connection dropped (that delivery's retry, or a heartbeat); the code prints on meanwhile.
        proxy.mode = "503"
        wait_for(lambda: any(" /api/runner/jobs/" in line and "/logs " in line for line in proxy.answered_503),
                 timeout=30, what=lambda: f"a log delivery answered 503 (answered so far: {proxy.answered_503})")
        proxy.mode = "reset"
        wait_for(lambda: proxy.dropped, timeout=30, what="a connection of the runner dropped")
        during = len(ticker_lines(site.log(job, "stdout")))
        printed = len(ticker_lines(printed_lines(f"{site.work_dir}/.mmt/jobs/{job.pk}/stdout.log")))
        proxy.mode = None
        assert printed > during, f"the refused delivery's lines are not stored ({printed} printed, {during} stored)"
        # The lines printed before and during the cut arrive now, after those stored before it.
        wait_for(lambda: len(ticker_lines(site.log(job, "stdout"))) >= printed, timeout=40,
                 what=lambda: f"the {printed} lines printed by the cut's end ({during} stored at its end)")
        assert site.status(job) == "running"

        runner.signal(signal.SIGTERM)
        assert runner.wait(timeout=60) == 1, runner.output()
    finally:
        proxy.close()
    ticks = ticker_lines(site.log(job, "stdout"))  # contiguous from byte 0, no chunk twice
    assert ticks == list(range(len(ticks)))
    assert "not delivered yet" in runner.output()
    job.refresh_from_db()
    assert (job.status, job.end_reason) == ("failed", "timed_out")


def test_a_runner_that_read_the_token_of_an_adopted_claim_starts_with_the_new_one_from_job_json(site):
    """A launcher whose claim answer was lost claims again (adopt: true) and gets new job tokens; a batch
    job that read job.json before the launcher rewrote it is refused once (401), re-reads job.json and
    starts with the new token. With no newer token there, the 401 stands."""
    from sites import submissions
    from worker_agent.site.runner import Refused, Runner, load_spec

    job = site.job(["python", "-c", "print('adopted')"])
    [lost] = submissions.launcher_claim(site.launcher, site.target.pk, 1)
    [item] = lost["jobs"]
    spec_dir = write_spec_dir(Path(item["spec_dir"]), runner_python=lost["runner_python"],
                              api_url=lost["api_url"], token=item["token"], job=item["job"])
    stale = Runner(load_spec(str(spec_dir)))
    unchanged = Runner(load_spec(str(spec_dir)))

    [adopted] = submissions.launcher_claim(site.launcher, site.target.pk, 1)
    assert adopted["adopt"] is True and adopted["job_ids"] == [job.pk]
    [new_item] = adopted["jobs"]
    assert new_item["token"] != item["token"]
    submissions.report(Actor(None), {"job_ids": [job.pk], "outcome": "submitted",
                                     "scheduler_job_id": SCHEDULER_JOB_ID}, launcher=site.launcher)

    try:
        unchanged.start()
    except Refused as exc:
        assert exc.status == 401
    else:
        raise AssertionError("the old token must be refused")

    write_spec_dir(spec_dir, runner_python=adopted["runner_python"], api_url=adopted["api_url"],
                   token=new_item["token"], job=new_item["job"])
    answer = stale.start()
    assert answer["job"]["id"] == job.pk
    assert site.status(job) == "waiting_resources"
