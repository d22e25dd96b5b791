"""How jobs end besides success: exit 0 with a result.json that does not match the outputs (failed,
end reason invalid_result, the validator's message), a non-zero exit code (failed, exit_code), a
command that cannot be started (failed, start_failed), and a walltime reached (failed, timed_out).
Each ends once, with its GPUs released."""
from __future__ import annotations

from jobs.models import Artifact

LIES = '''\
import json, os
with open(os.path.join(os.environ["MARKS"], os.environ["MARK"]), "a") as f:
    f.write(f"{os.getpid()}\\n")
out = os.environ["MMT_OUTPUTS_DIR"]
with open(os.path.join(out, "weights.bin"), "wb") as f:
    f.write(b"12345")
with open(os.environ["MMT_RESULT_FILE"], "w") as f:
    json.dump({"version": 1, "complete": True, "metrics": [],
               "artifacts": [{"path": "weights.bin", "sha256": "0" * 64, "size": 5}]}, f)
print("wrote a result.json that lies")
'''
FAILS = '''\
import os, sys
with open(os.path.join(os.environ["MARKS"], os.environ["MARK"]), "a") as f:
    f.write(f"{os.getpid()}\\n")
print("giving up", file=sys.stderr)
sys.exit(3)
'''


def test_invalid_result_non_zero_exit_and_unstartable_command_each_fail_once_with_their_reason(e2e):
    e2e.start_worker(MMT_WORKER_PARALLEL_JOBS=3)
    env = {"MARKS": str(e2e.marks)}
    lies = e2e.create_job(command=["python", str(e2e.script("lies.py", LIES))], env={**env, "MARK": "lies"},
                          gpu_ids=["0"])
    fails = e2e.create_job(command=["python", str(e2e.script("fails.py", FAILS))], env={**env, "MARK": "fails"},
                           gpu_ids=["1"])
    missing = e2e.create_job(command=["no-such-program-here", "--flag"])
    slow = e2e.create_job(command=["python", "-c", "import time; print('sleeping', flush=True); time.sleep(60)"],
                          walltime_seconds=2)
    for job in (lies, fails, missing, slow):
        e2e.wait_ended(job, timeout=90)

    lies = e2e.assert_ended_once(lies, "failed")
    assert (lies.exit_code, lies.end_reason) == (0, "invalid_result")
    assert "weights.bin" in lies.error and "sha256" in lies.error, lies.error
    assert not Artifact.objects.filter(job_id=lies.pk).exists(), "nothing of an invalid result is declared"
    assert e2e.stream(lies, "stdout") == "wrote a result.json that lies\n"

    fails = e2e.assert_ended_once(fails, "failed")
    assert (fails.exit_code, fails.end_reason) == (3, "exit_code")
    assert e2e.stream(fails, "stderr").endswith("giving up\n")

    missing = e2e.job(missing)
    assert (missing.status, missing.end_reason, missing.exit_code) == ("failed", "start_failed", None)
    assert "no-such-program-here" in missing.error, missing.error
    assert len(e2e.starts("lies")) == 1 and len(e2e.starts("fails")) == 1

    slow = e2e.assert_ended_once(slow, "failed")
    assert slow.end_reason == "timed_out" and "walltime of 2 s" in slow.error
    assert e2e.stream(slow, "stdout") == "sleeping\n"
    assert "Walltime of 2 s reached: sending SIGTERM" in e2e.stream(slow, "stderr")
