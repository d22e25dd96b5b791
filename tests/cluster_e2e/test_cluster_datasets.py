"""A cluster job with an input dataset version, end to end: a real worker process, the Django live
server and a real loopback sshd as the computer that runs both replicas. Each replica checks the
sha256 of every input file itself (tests/datasets_transfer CHECK_JOB); the version crosses once, and
the job's pin lapses as soon as its replicas (workspaces `<jobId>-<replica>`) have ended."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.datasets_transfer.conftest import CHECK_JOB, PROGRAM, make_version, sample_files, tree

MB = 1 << 20
# The job ends with main1 and stops what still runs: main1 waits until sub1 has checked its inputs.
CHECK_THEN_MEET = CHECK_JOB + '''
import time
name, marks = os.environ["MMT_CLUSTER_HOST"], os.environ["MARKS"]
if name != "main1":
    open(os.path.join(marks, name), "w").close()
else:
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(marks, "sub1")):
        assert time.monotonic() < deadline, "sub1 never checked its inputs"
        time.sleep(0.1)
'''


def test_both_replicas_read_their_inputs_bit_exact_and_the_pin_lapses_when_they_end(cluster, sshd, settings,
                                                                                  tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    files = sample_files(40, 3 * MB)
    version = make_version(cluster.world.member, cluster.world.project, "speech", files)
    computer = cluster.computer("box", host="127.0.0.1", port=sshd.port, key_path=sshd.key_path,
                                known_hosts_path=sshd.known_hosts_path, gpu_ids=["0", "1"], concurrency=2)
    script = cluster.script("check_inputs.py", CHECK_THEN_MEET)
    marks = cluster.directory(f"cluster-e2e-{cluster.tag}-marks")
    cluster.working_dirs.append(marks)
    cluster.start_worker(sshd.client_dir)
    job = cluster.create_job(computer=computer.pk, cluster_size=2, gpus_per_replica=1, command=["python", str(script)],
                             input_datasets=[version.pk], parameters={"manifests": {str(version.pk): version.manifest()}},
                             env={"MARKS": str(marks)})

    ended = cluster.wait_ended(job)
    assert ended.status == "finished", (ended.status, ended.end_reason, ended.error, cluster.worker_output()[-5000:])
    for name in ("main1", "sub1"):
        assert f"verified {len(files)} files of versions ['{version.pk}']" in cluster.stream(job, name), name
    output = cluster.worker_output()
    assert len(re.findall(rf"version {version.pk} \(speech v1\) fetched by relay", output)) == 1, output[-3000:]
    assert len(re.findall(rf"version {version.pk} \(speech v1\) is in the computer's cache already", output)) == 1

    root = Path(computer.working_dir) / ".mmt-cache" / "datasets"
    assert tree(root / version.digest.removeprefix("sha256:") / "data") == files
    usage = json.loads(subprocess.run([sys.executable, "-I", PROGRAM, "usage", str(root)], capture_output=True,
                                      check=True, timeout=60).stdout.splitlines()[-1])
    [entry] = usage["entries"]
    assert entry["complete"] and entry["pinned_by"] == [], "both replicas ended: the version may be evicted now"
