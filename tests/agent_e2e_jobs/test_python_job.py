"""A python-runtime job from an uploaded source archive, with requirements installed from a wheel made
here (pip --no-index --find-links, configured on the target: nothing is downloaded), writing outputs
and result.json: logs, artifacts (one big enough to go in parts), result metrics and GPU telemetry
land; a second job with the same requirements reuses the venv."""
from __future__ import annotations

import hashlib
import io
import os
import re
from pathlib import Path

import pytest
from django.conf import settings

from jobs import outputs
from jobs.models import Artifact, Metric
from mado.services import Actor
from tests.agent_e2e_jobs.conftest import FAKE_PYNVML, build_wheel, source_archive, wait_until

TRAIN = '''\
import hashlib, json, os, sys, time
import mmt_e2e_dep
with open(os.path.join(os.environ["MARKS"], os.environ["MARK"]), "a") as f:
    f.write(f"{os.getpid()}\\n")
params = json.load(open(os.environ["MMT_PARAMETERS_FILE"]))
for i in range(params["lines"]):
    print(f"line {i:05d} {mmt_e2e_dep.VALUE}")
    if i % 100 == 0:
        print(f"progress {i:05d}", file=sys.stderr)
time.sleep(params["sleep"])
out = os.environ["MMT_OUTPUTS_DIR"]
os.makedirs(os.path.join(out, "model"), exist_ok=True)
artifacts = []
def write(rel, data):
    with open(os.path.join(out, rel), "wb") as f:
        f.write(data)
    artifacts.append({"path": rel, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})
write("model/weights.bin", bytes(range(256)) * 4096)
if params["big_mib"]:
    write("model/big.bin", hashlib.sha256(b"seed").digest() * (params["big_mib"] * 2 ** 15 + 1000))
write("notes.txt", "評価: ok\\n".encode())
result = {"version": 1, "complete": True, "artifacts": artifacts,
          "metrics": [{"name": "train.loss", "value": 0.25, "step": 1},
                      {"name": "train.loss", "value": 0.125, "step": 2}]}
with open(os.environ["MMT_RESULT_FILE"], "w") as f:
    json.dump(result, f)
print("done")
'''


@pytest.fixture
def pip_from_local_wheel(e2e):
    """The target user's pip config: no index, the wheels directory only (restored afterwards)."""
    wheels = e2e.working_dir / "wheels"
    wheels.mkdir()
    build_wheel(wheels)
    config = Path(e2e.sshd.home) / ".config" / "pip" / "pip.conf"
    saved = config.read_bytes() if config.exists() else None
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f"[global]\nno-index = true\nfind-links = {wheels}\n")
    for path in (wheels, *wheels.iterdir(), config.parent.parent, config.parent, config):
        os.chown(path, e2e.uid, e2e.gid)
    yield wheels
    if saved is None:
        config.unlink()
    else:
        config.write_bytes(saved)


def test_a_python_job_with_requirements_delivers_logs_outputs_and_metrics(e2e, pip_from_local_wheel, tmp_path):
    nvml = tmp_path / "nvml"
    nvml.mkdir()
    (nvml / "pynvml.py").write_text(FAKE_PYNVML)
    worker = e2e.start_worker(PYTHONPATH=str(nvml))
    archive = outputs.store_source(Actor(e2e.world.member), e2e.world.project,
                                   io.BytesIO(source_archive({"train.py": TRAIN})))
    source = {"kind": "archive", "id": archive.pk}
    env = {"MARKS": str(e2e.marks)}
    first = e2e.create_job(command=["python", "train.py"], source=source, requirements="mmt-e2e-dep==0.1\n",
                           gpu_ids=["0"], env={**env, "MARK": "first"},
                           parameters={"lines": 3000, "sleep": 2.5, "big_mib": 65})
    job = e2e.wait_ended(first, timeout=120)
    job = e2e.assert_ended_once(first, "finished")
    assert job.exit_code == 0 and job.end_reason == "exit_code"

    stdout = e2e.stream(first, "stdout")
    assert stdout.splitlines() == [f"line {i:05d} from-the-local-wheel" for i in range(3000)] + ["done"]
    stderr = e2e.stream(first, "stderr")
    assert "[mado] Creating a venv" in stderr and "[mado] Installing the requirements." in stderr
    assert [line for line in stderr.splitlines() if line.startswith("progress")] == \
        [f"progress {i:05d}" for i in range(0, 3000, 100)]
    e2e.assert_delivered_in_order(first)
    assert len(e2e.starts("first")) == 1, "the job's process was started exactly once"

    artifacts = {a.path: a for a in Artifact.objects.filter(job_id=first.pk)}
    assert sorted(artifacts) == ["model/big.bin", "model/weights.bin", "notes.txt"]
    assert all(a.complete for a in artifacts.values())
    big = artifacts["model/big.bin"]
    assert big.size > 64 * 2 ** 20
    stored = Path(settings.MEDIA_ROOT) / big.file.name
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == big.sha256
    assert (Path(settings.MEDIA_ROOT) / artifacts["notes.txt"].file.name).read_text() == "評価: ok\n"
    log_text = worker.output()
    assert re.search(r"uploading model/big\.bin \(\d/3\): 33554432 of \d+ bytes \(\d+%\)", log_text), log_text[-3000:]

    metrics = list(Metric.objects.filter(job_id=first.pk).values_list("name", "value", "step"))
    assert ("train.loss", 0.25, 1) in metrics and ("train.loss", 0.125, 2) in metrics
    gpu = [m for m in metrics if m[0].startswith("system/gpu/")]
    assert ("system/gpu/0/utilization", 37.0, 1) in gpu and ("system/gpu/0/memory", 1536.0, 1) in gpu
    assert {m[0] for m in gpu} == {"system/gpu/0/utilization", "system/gpu/0/memory"}, "only the reserved GPU"

    second = e2e.create_job(command=["python", "train.py"], source=source, requirements="mmt-e2e-dep==0.1\n",
                            env={**env, "MARK": "second"}, parameters={"lines": 10, "sleep": 0, "big_mib": 0})
    e2e.wait_ended(second, timeout=60)
    e2e.assert_ended_once(second, "finished")
    assert "[mado] Reusing the venv" in e2e.stream(second, "stderr")
    assert "Creating a venv" not in e2e.stream(second, "stderr")
    venvs = [p for p in (e2e.working_dir / ".mmt-cache" / "venvs").iterdir() if p.is_dir()]
    assert len(venvs) == 1
    assert e2e.stream(second, "stdout").splitlines()[-1] == "done"
    wait_until(lambda: e2e.journal() == [], timeout=5, what="the journal to be empty once the jobs completed")
    assert not re.search(r"(?:mado_mtj|mmtj)_[A-Za-z0-9_\-]{20,}", log_text), "a job token in the worker's log"
    assert worker.process.poll() is None
