"""Specs of runtimes.py run by the supervisor: a python-runtime job with a real venv built from a wheel made
here (no network), reused by the next job; and the docker runtime's flow (create once, `start -a`, exit
code from inspect, `stop`/`rm`, re-attach after the supervisor was killed) against a stand-in `docker`
script, because no Docker daemon runs on these machines (see conftest.py)."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import zipfile
from pathlib import Path

from tests.agent_jobs.conftest import PYTHON, Local, wait_for
from worker_agent import runtimes
from worker_agent.runtimes import TargetFacts, build_spec
from worker_agent.ssh import LocalConnection
from worker_agent.supervisor import Remote

TOKEN = "mado_mtj_0d1e2f3a4b5c6d7e8f90a1b2c3d4e5f6"
WORKER_TOKEN = "mado_svc_worker_secret_0123456789"


def make_wheel(directory: Path) -> Path:
    files = {
        "mmtdemo/__init__.py": b"VALUE = 'mmtdemo works'\n",
        "mmtdemo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: mmtdemo\nVersion: 1.0\n",
        "mmtdemo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: mado-test\nRoot-Is-Purelib: true\n"
                                       b"Tag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("mmtdemo-1.0.dist-info/RECORD,,")
    files["mmtdemo-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = directory / "mmtdemo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


def job_payload(job_id: int, working_dir: Path, **changes) -> dict:
    job = {"id": job_id, "lease_id": f"lease-{job_id}", "job_token": TOKEN, "project_id": 4, "runtime": "python",
           "image": "", "command": ["python", "-c", "print('hi')"], "source": None, "requirements": "",
           "parameters": {"lr": 0.5}, "env": {"SEED": "3"}, "gpu_ids": [], "walltime_seconds": None,
           "api_url": "http://127.0.0.1:8000",
           "computer": {"kind": "local", "working_dir": str(working_dir), "python_path": PYTHON,
                        "runtimes": ["python", "docker"]}}
    job.update(changes)
    return job


SEES = """
import json, os, sys, mmtdemo
print(mmtdemo.VALUE)
print(sys.executable)
params = json.load(open(os.environ["MMT_PARAMETERS_FILE"]))
with open(os.path.join(os.environ["MMT_OUTPUTS_DIR"], "seen.json"), "w") as f:
    json.dump({"env": dict(os.environ), "params": params, "cwd": os.getcwd()}, f)
"""


def test_python_runtime_builds_a_venv_from_requirements_and_reuses_it(working_dir, tmp_path):
    wheel = make_wheel(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    # What the target's login session has: the worker's own token must not pass from there either.
    target_env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "MMT_API_TOKEN": WORKER_TOKEN,
                  "UNRELATED": "x"}
    connection = LocalConnection(env=target_env)
    requirements = f"mmtdemo @ file://{wheel}\n"
    job = job_payload(1, working_dir, command=["python", "-c", SEES], requirements=requirements)
    spec = build_spec(job, TargetFacts(uid=os.getuid(), gid=os.getgid()))
    remote = Remote(connection, working_dir=str(working_dir), job_id=1, python=PYTHON)
    assert remote.start(spec)["started"] is True
    done = wait_for(lambda: (s := remote.poll())["status"] in ("exited", "failed_to_start") and s, 120,
                    what="the python job")
    job_dir = Path(remote.job_dir)
    stderr = (job_dir / "stderr.log").read_text()
    assert done["status"] == "exited" and done["exit_code"] == 0, stderr
    venv = working_dir / ".mmt-cache" / "venvs" / runtimes.venv_key(PYTHON, requirements)
    assert (job_dir / "stdout.log").read_text() == f"mmtdemo works\n{venv}/bin/python\n"
    assert "[mado] Creating a venv with /usr/bin/python3" in stderr and "[mado] The venv is ready." in stderr
    seen = json.loads((job_dir / "outputs" / "seen.json").read_text())
    assert seen["params"] == {"lr": 0.5} and seen["cwd"] == f"{job_dir}/work"
    assert seen["env"] == {
        "PATH": f"{venv}/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "SEED": "3",
        "MMT_API_URL": "http://127.0.0.1:8000", "MMT_API_TOKEN": TOKEN, "MLFLOW_TRACKING_URI": "http://127.0.0.1:8000/mlflow",
        "MLFLOW_TRACKING_TOKEN": TOKEN, "MMT_RUN_ID": "1", "MMT_JOB_ID": "1", "MMT_PROJECT_ID": "4",
        "MMT_PARAMETERS_FILE": f"{job_dir}/inputs/parameters.json", "MMT_OUTPUTS_DIR": f"{job_dir}/outputs",
        "MMT_RESULT_FILE": f"{job_dir}/outputs/result.json", "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}
    ready = venv / ".mmt-ready"
    assert ready.exists()
    built_at = (venv / "bin" / "python").lstat().st_mtime_ns

    # A second job with the same requirements uses the same venv, built once.
    second = Remote(connection, working_dir=str(working_dir), job_id=2, python=PYTHON)
    second.start(build_spec(job_payload(2, working_dir, command=["python", "-c", SEES], requirements=requirements),
                            TargetFacts(uid=os.getuid(), gid=os.getgid())))
    done = wait_for(lambda: (s := second.poll())["status"] in ("exited", "failed_to_start") and s, 60,
                    what="the second python job")
    stderr = Path(second.job_dir, "stderr.log").read_text()
    assert done["exit_code"] == 0, stderr
    assert stderr == f"[mado] Reusing the venv for these requirements ({venv.name}).\n"
    assert (venv / "bin" / "python").lstat().st_mtime_ns == built_at
    assert sorted(p.name for p in venv.parent.iterdir()) == [venv.name, venv.name + ".lock"]


def test_failing_requirements_fail_the_start(working_dir, tmp_path):
    spec = build_spec(job_payload(3, working_dir, requirements=f"mmtdemo @ file://{tmp_path}/missing.whl\n"),
                      TargetFacts(uid=os.getuid(), gid=os.getgid()))
    local = Local(working_dir, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    local.start(spec)
    done = local.wait_status("3", "failed_to_start", "exited", timeout=120)
    assert done["status"] == "failed_to_start" and done["error_code"] == "requirements_failed"
    assert "Installing the requirements failed (pip exit code 1)" in done["error"]
    assert "missing.whl" in local.read("3", "stderr.log")  # pip's own explanation is in the job's log
    venv = Path(spec["venv"]["dir"])
    assert not (venv / ".mmt-ready").exists()


# -- docker, against the stand-in ---------------------------------------------------------------

def docker_local(working_dir: Path, fake_docker) -> Local:
    return Local(working_dir, env={"PATH": f"{fake_docker.bindir}:/usr/bin:/bin", "HOME": str(working_dir)})


def docker_spec(working_dir: Path, job_id: int, script: str, **changes) -> dict:
    job = job_payload(job_id, working_dir, runtime="docker", image="mado/test:1", command=["python3", "-c", script],
                      **changes)
    return build_spec(job, TargetFacts(uid=os.getuid(), gid=os.getgid()), grace_seconds=1)


def test_a_docker_job_is_created_once_started_attached_and_removed(working_dir, fake_docker):
    local = docker_local(working_dir, fake_docker)
    script = ("import hashlib, os, sys\nprint(os.environ['MMT_OUTPUTS_DIR'], os.environ['NVIDIA_VISIBLE_DEVICES'], "
              "hashlib.sha256(os.environ['MMT_API_TOKEN'].encode()).hexdigest()[:12])\n"
              "print('to stderr', file=sys.stderr)\nsys.exit(4)\n")
    spec = docker_spec(working_dir, 31, script)
    local.start(spec)
    done = local.wait_status("31", "exited", "failed_to_start")
    assert done["exit_code"] == 4, local.read("31", "stderr.log")
    assert local.read("31", "stdout.log") == f"/mmt/outputs void {hashlib.sha256(TOKEN.encode()).hexdigest()[:12]}\n"
    assert local.read("31", "stderr.log") == "to stderr\n"
    assert fake_docker.verbs() == ["container create", "start", "container inspect", "rm"]
    assert fake_docker.calls()[0] == spec["docker"]["create"][1:]
    assert fake_docker.calls()[-1] == ["rm", "-v", "mmt-job-31"]
    assert fake_docker.container("mmt-job-31") is None
    env_file = Path(local.job_dir("31"), "container.env")
    assert oct(env_file.stat().st_mode & 0o777) == "0o600" and f"MMT_API_TOKEN={TOKEN}\n" in env_file.read_text()
    assert all(TOKEN not in word for call in fake_docker.calls() for word in call)


def test_a_docker_job_is_stopped_with_docker_stop_then_removed(working_dir, fake_docker):
    local = docker_local(working_dir, fake_docker)
    script = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda s, f: (print('got SIGTERM', flush=True), sys.exit(0)))\n"
              "print('ready', flush=True)\nwhile True: time.sleep(0.05)\n")
    local.start(docker_spec(working_dir, 32, script))
    wait_for(lambda: "ready" in local.read("32", "stdout.log"), what="the container to be ready")
    done = local.cancel("32")
    assert done["status"] == "canceled" and done["exit_code"] == 0
    assert local.read("32", "stdout.log") == "ready\ngot SIGTERM\n"
    assert ["stop", "-t", "1", "mmt-job-32"] in fake_docker.calls()
    assert fake_docker.verbs()[-1] == "rm" and fake_docker.container("mmt-job-32") is None


def test_a_recovering_supervisor_reattaches_and_never_starts_the_container_again(working_dir, fake_docker):
    local = docker_local(working_dir, fake_docker)
    script = "import time\nfor i in range(60):\n    print(f'n {i}', flush=True)\n    time.sleep(0.05)\n"
    spec = docker_spec(working_dir, 33, script)
    local.start(spec)
    running = local.wait_status("33", "running")
    wait_for(lambda: local.read("33", "stdout.log").count("\n") >= 5, what="some output")
    # The supervisor and its `docker start -a` client both die; the container runs on.
    os.kill(running["supervisor"]["pid"], signal.SIGKILL)
    os.kill(running["pid"], signal.SIGKILL)
    polled = local.wait_status("33", "unknown")
    assert polled["recoverable"] is True and polled["process_alive"] is False
    assert fake_docker.container("mmt-job-33")["status"] == "running"
    again = local.start(spec)
    assert again["started"] is False and again["recoveries"] == 1
    done = local.wait_status("33", "exited", timeout=30)
    assert done["exit_code"] == 0
    verbs = fake_docker.verbs()
    assert (verbs.count("container create"), verbs.count("start"), verbs.count("attach"), verbs.count("rm")) == \
        (1, 1, 1, 1), verbs
    assert local.read("33", "stdout.log").splitlines() == [f"n {i}" for i in range(60)]
    assert "Re-attaching to the job's container (running)" in local.read("33", "stderr.log")


def test_a_held_docker_replica_is_created_then_waits_and_a_stop_removes_its_container(working_dir, fake_docker):
    """Cluster replicas (`hold`): `docker container create` is the preparation; `start -a` only after
    `release`; stopped while held, the container is removed and never started."""
    local = docker_local(working_dir, fake_docker)
    job = job_payload(35, working_dir, runtime="docker", image="mado/test:1", command=["python3", "-c", "print('up')"])
    local.start(build_spec(job, TargetFacts(uid=os.getuid(), gid=os.getgid()), grace_seconds=1, hold=True))
    held = wait_for(lambda: (s := local.poll("35")).get("held") and s, what="the held state")
    assert held["status"] == "starting" and fake_docker.verbs() == ["container create"]
    local.call("release", "35")
    done = local.wait_status("35", "exited")
    assert done["exit_code"] == 0 and local.read("35", "stdout.log") == "up\n"
    assert fake_docker.verbs() == ["container create", "start", "container inspect", "rm"]

    job = job_payload(36, working_dir, runtime="docker", image="mado/test:1", command=["python3", "-c", "print('up')"])
    local.start(build_spec(job, TargetFacts(uid=os.getuid(), gid=os.getgid()), grace_seconds=1, hold=True))
    wait_for(lambda: local.poll("36").get("held"), what="the held state")
    assert local.cancel("36")["status"] == "canceled"
    assert fake_docker.verbs()[4:] == ["container create", "rm"] and fake_docker.container("mmt-job-36") is None
    assert local.read("36", "stdout.log") == ""


def test_a_docker_job_whose_image_is_missing_fails_to_start(working_dir, fake_docker):
    local = docker_local(working_dir, fake_docker)
    spec = build_spec(job_payload(34, working_dir, runtime="docker", image="missing:image", command=["true"]),
                      TargetFacts(uid=os.getuid(), gid=os.getgid()))
    local.start(spec)
    done = local.wait_status("34", "failed_to_start")
    assert done["error_code"] == "docker_create_failed"
    assert "No such image: missing:image" in local.read("34", "stderr.log")
    assert fake_docker.verbs() == ["container create"]
