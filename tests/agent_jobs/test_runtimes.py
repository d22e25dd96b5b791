"""What runs for each runtime, asserted by exact equality: the python venv spec, `docker container create`
for CPU and GPU jobs, and `apptainer`/`singularity exec` for CPU and GPU jobs.

No real Apptainer or Singularity runs here (neither exists on these machines): the capability check is
asserted against a stand-in binary whose `exec --help` prints the real option list with or without the
flags Mado needs (tests/agent_jobs/conftest.py)."""
from __future__ import annotations

import copy
import os

import pytest

from tests.agent_jobs.conftest import fake_container_bin
from worker_agent import jobenv, runtimes
from worker_agent.runtimes import RuntimeRefused, TargetFacts, build_spec
from worker_agent.ssh import LocalConnection
from worker_agent.supervisor import spec_hash

TOKEN = "mado_mtj_9f8e7d6c5b4a39281706f5e4d3c2b1a0"
LEASE = "6c1f3a52-8d0e-4b7a-9e21-3f5d7c9b1a04"
WD = "/data/mmt"
JD = "/data/mmt/.mmt/jobs/12"


def payload(**changes) -> dict:
    job = {
        "id": 12, "lease_id": LEASE, "job_token": TOKEN, "status": "claimed", "project": "lab", "project_id": 1,
        "run_name": "job-12", "runtime": "python", "image": "", "command": ["python", "train.py", "--epochs", "3"],
        "source": None, "requirements": "numpy==1.26.4\n", "parameters": {"lr": 0.1}, "env": {"SEED": "7"},
        "gpu_ids": [], "walltime_seconds": None, "cancel_requested": False, "api_url": "https://mado.example.org/",
        "computer": {"id": 3, "name": "gpu-host-1", "kind": "ssh", "host": "gpu1", "port": 22, "ssh_user": "ml",
                     "ssh_key_path": "/home/w/.ssh/id", "known_hosts_path": "/home/w/.ssh/kh", "working_dir": WD,
                     "python_path": "/usr/bin/python3.11", "runtimes": ["python", "docker", "apptainer", "singularity"],
                     "dataset_transfer": "relay", "dataset_cache_limit_gib": 100},
    }
    job.update(changes)
    return job


FACTS = TargetFacts(uid=1001, gid=1002)
GIT_SOURCE = {"kind": "git", "url": "https://example.org/lab/train.git", "ref": "main"}
PARAMETERS_FILE = {"path": "inputs/parameters.json", "content": '{\n "lr": 0.1\n}\n', "mode": 0o600}


def common(runtime: str, **changes) -> dict:
    spec = {"format": 1, "job_id": "12", "lease_id": LEASE, "working_dir": WD, "runtime": runtime,
            "walltime_seconds": None, "grace_seconds": 10, "dirs": ["inputs", "outputs", "work"],
            "files": [PARAMETERS_FILE], "secrets": [TOKEN]}
    spec.update(changes)
    return spec


def table(paths: jobenv.Locations, **changes) -> dict:
    env = {"SEED": "7", "MMT_API_URL": "https://mado.example.org", "MMT_API_TOKEN": TOKEN,
           "MLFLOW_TRACKING_URI": "https://mado.example.org/mlflow", "MLFLOW_TRACKING_TOKEN": TOKEN,
           "MMT_RUN_ID": "12", "MMT_JOB_ID": "12", "MMT_PROJECT_ID": "1",
           "MMT_PARAMETERS_FILE": f"{paths.inputs_dir}/parameters.json", "MMT_OUTPUTS_DIR": paths.outputs_dir,
           "MMT_RESULT_FILE": f"{paths.outputs_dir}/result.json", "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.update(changes)
    return env


def with_hash(spec: dict) -> dict:
    return dict(spec, spec_hash=spec_hash(spec))


def assert_token_only_in_env_and_files(spec: dict) -> None:
    argvs = [spec["argv"]] + ([spec["docker"]["create"]] if spec.get("docker") else [])
    for argv in argvs:
        assert all(TOKEN not in word for word in argv), argv
    assert TOKEN not in repr({k: v for k, v in spec.items() if k not in ("env", "files", "secrets", "spec_hash")})


# -- environment ---------------------------------------------------------------------------------

def test_the_job_environment_is_exactly_the_table_plus_the_jobs_env():
    host = jobenv.host_locations(JD)
    assert jobenv.job_environment(payload(gpu_ids=["2", "5"]), host) == table(host, CUDA_VISIBLE_DEVICES="2,5")
    inside = jobenv.container_locations()
    assert jobenv.job_environment(payload(gpu_ids=["2", "5"]), inside, docker=True) == table(
        inside, CUDA_VISIBLE_DEVICES="0,1", NVIDIA_VISIBLE_DEVICES="2,5")
    assert jobenv.job_environment(payload(), inside, docker=True) == table(
        inside, CUDA_VISIBLE_DEVICES="", NVIDIA_VISIBLE_DEVICES="void")
    assert inside.outputs_dir == "/mmt/outputs" and inside.parameters_file == "/mmt/inputs/parameters.json"


def test_the_jobs_env_never_overrides_what_mado_sets():
    env = jobenv.job_environment(payload(env={"MMT_API_TOKEN": "stolen", "CUDA_VISIBLE_DEVICES": "0,1,2,3",
                                              "MLFLOW_RUN_ID": "x", "OMP_NUM_THREADS": "4"}),
                                 jobenv.host_locations(JD))
    assert env["MMT_API_TOKEN"] == TOKEN and env["CUDA_VISIBLE_DEVICES"] == ""
    assert "MLFLOW_RUN_ID" not in env and env["OMP_NUM_THREADS"] == "4"


def test_no_worker_credentials_reach_the_job(monkeypatch):
    monkeypatch.setenv("MMT_API_TOKEN", "mado_worker_secret")
    monkeypatch.setenv("MMT_API_TOKEN_FILE", "/etc/mado/worker-token")
    for runtime, image in (("python", ""), ("docker", "lab/train:1")):
        spec = build_spec(payload(runtime=runtime, image=image), FACTS)
        assert "mado_worker_secret" not in repr(spec) and "worker-token" not in repr(spec)


# -- python ----------------------------------------------------------------------------------------

def test_python_runtime_spec():
    spec = build_spec(payload(), FACTS)
    key = runtimes.venv_key("/usr/bin/python3.11", "numpy==1.26.4\n")
    venv = f"{WD}/.mmt-cache/venvs/{key}"
    assert spec == with_hash(common(
        "python",
        argv=[f"{venv}/bin/python", "train.py", "--epochs", "3"],
        env=table(jobenv.host_locations(JD)),
        pass_env=["PATH", "HOME", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "TMPDIR"],
        path_prepend=[f"{venv}/bin"],
        cwd=f"{JD}/work",
        venv={"python": "/usr/bin/python3.11", "dir": venv, "requirements": "numpy==1.26.4\n"},
    ))
    assert_token_only_in_env_and_files(spec)


def test_python_runtime_with_a_source_gpus_and_a_walltime():
    spec = build_spec(payload(command=["python3", "-m", "train"], source=GIT_SOURCE, gpu_ids=["0", "3"],
                              walltime_seconds=3600), FACTS, grace_seconds=5)
    key = runtimes.venv_key("/usr/bin/python3.11", "numpy==1.26.4\n")
    assert spec["argv"] == [f"{WD}/.mmt-cache/venvs/{key}/bin/python", "-m", "train"]
    assert spec["cwd"] == f"{JD}/source" and spec["dirs"] == ["inputs", "outputs", "work", "source"]
    assert spec["env"]["CUDA_VISIBLE_DEVICES"] == "0,3" and "NVIDIA_VISIBLE_DEVICES" not in spec["env"]
    assert (spec["walltime_seconds"], spec["grace_seconds"]) == (3600, 5)
    other = build_spec(payload(command=["bash", "run.sh"]), FACTS)
    assert other["argv"] == ["bash", "run.sh"]  # only python/python3 are replaced; PATH has the venv first


def test_venvs_are_shared_by_python_and_requirements():
    base = runtimes.venv_key("/usr/bin/python3", "numpy==1.26.4\ntorch==2.3.0\n")
    assert runtimes.venv_key("/usr/bin/python3", "# pinned\nnumpy==1.26.4   \n\n  torch==2.3.0  # gpu\n") == base
    assert runtimes.venv_key("/opt/py312/bin/python3", "numpy==1.26.4\ntorch==2.3.0\n") != base
    assert runtimes.venv_key("/usr/bin/python3", "numpy==1.26.4\ntorch==2.3.1\n") != base
    assert runtimes.venv_key("/usr/bin/python3", "") != base
    one = build_spec(payload(id=1, lease_id="a"), FACTS)
    two = build_spec(payload(id=2, lease_id="b", command=["python", "eval.py"]), FACTS)
    assert one["venv"] == two["venv"] and one["path_prepend"] == two["path_prepend"]


@pytest.mark.parametrize("requirements, option", [
    ("-r other.txt\n", "-r"),
    ("numpy\n--index-url https://evil.example/simple\n", "--index-url"),
    ("numpy==1.26.4 --hash=sha256:0123\n", "--hash"),
    ("-e .\n", "-e"),
    ("numpy \\\n  --extra-index-url https://x.example\n", "--extra-index-url"),
    ("  --trusted-host x.example\n", "--trusted-host"),
])
def test_pip_options_in_requirements_are_refused(requirements, option):
    with pytest.raises(RuntimeRefused) as refused:
        build_spec(payload(requirements=requirements), FACTS)
    assert refused.value.code == "pip_options_refused" and option in refused.value.message


def test_requirements_without_options_are_accepted():
    text = ("numpy==1.26.4  # not -r here\nmmtdemo @ file:///srv/wheels/mmtdemo-1.0-py3-none-any.whl\n"
            "torch>=2.2; platform_machine == 'x86_64'\n")
    assert runtimes.validate_requirements(text) == [
        "numpy==1.26.4", "mmtdemo @ file:///srv/wheels/mmtdemo-1.0-py3-none-any.whl",
        "torch>=2.2; platform_machine == 'x86_64'"]


# -- docker ----------------------------------------------------------------------------------------

def container_env_text(**changes) -> str:
    env = table(jobenv.container_locations(), **changes)
    return "".join(f"{k}={v}\n" for k, v in env.items())


def test_docker_cpu_job():
    spec = build_spec(payload(runtime="docker", image="lab/train:1.4", command=["python", "train.py"]), FACTS)
    lease = runtimes.lease_hash(LEASE)
    assert len(lease) == 16
    create = ["docker", "container", "create", "--pull", "never", "--name", "mmt-job-12", "--restart", "no", "--init",
              "--network", "host", "--user", "1001:1002", "--env-file", f"{JD}/container.env",
              "--label", "mado.job=12", "--label", f"mado.lease={lease}",
              "--mount", f"type=bind,src={JD}/inputs,dst=/mmt/inputs,readonly",
              "--mount", f"type=bind,src={JD}/outputs,dst=/mmt/outputs",
              "--mount", f"type=bind,src={JD}/work,dst=/mmt/work",
              "--workdir", "/mmt/work", "lab/train:1.4", "python", "train.py"]
    env_file = {"path": "container.env", "content": container_env_text(NVIDIA_VISIBLE_DEVICES="void"), "mode": 0o600}
    assert spec == with_hash(common(
        "docker",
        files=[PARAMETERS_FILE, env_file],
        argv=["docker", "start", "-a", "mmt-job-12"],
        env={},
        pass_env=list(runtimes.DOCKER_PASS_ENV),
        cwd=None,
        docker={"bin": "docker", "name": "mmt-job-12", "create": create},
    ))
    assert "CUDA_VISIBLE_DEVICES=\n" in env_file["content"]
    assert_token_only_in_env_and_files(spec)


def test_docker_gpu_job_with_a_source():
    spec = build_spec(payload(runtime="docker", image="lab/train@sha256:" + "a" * 64, command=["python", "train.py"],
                              gpu_ids=["1", "3"], source=GIT_SOURCE), FACTS)
    create = spec["docker"]["create"]
    assert create[create.index("--label") + 1:create.index("--workdir")] == [
        "mado.job=12", "--label", f"mado.lease={runtimes.lease_hash(LEASE)}",
        "--mount", f"type=bind,src={JD}/inputs,dst=/mmt/inputs,readonly",
        "--mount", f"type=bind,src={JD}/source,dst=/mmt/source,readonly",
        "--mount", f"type=bind,src={JD}/outputs,dst=/mmt/outputs",
        "--gpus", '"device=1,3"']
    assert create[create.index("--workdir"):] == ["--workdir", "/mmt/source", "lab/train@sha256:" + "a" * 64,
                                                  "python", "train.py"]
    env_file = spec["files"][1]
    assert env_file["content"] == container_env_text(CUDA_VISIBLE_DEVICES="0,1", NVIDIA_VISIBLE_DEVICES="1,3")
    assert_token_only_in_env_and_files(spec)


def test_docker_refuses_what_it_cannot_pass():
    with pytest.raises(RuntimeRefused) as refused:
        build_spec(payload(runtime="docker", image="--privileged"), FACTS)
    assert refused.value.code == "image_invalid"
    with pytest.raises(RuntimeRefused) as refused:
        build_spec(payload(runtime="docker", image="x:1", env={"NOTE": "two\nlines"}), FACTS)
    assert refused.value.code == "env_not_representable"
    with pytest.raises(RuntimeRefused) as refused:
        build_spec(payload(runtime="docker", image="x:1", computer=dict(payload()["computer"], working_dir="/a,b")),
                   FACTS)
    assert refused.value.code == "path_not_mountable"


# -- apptainer / singularity ---------------------------------------------------------------------

@pytest.fixture
def container_help(tmp_path):
    """`exec --help` read from stand-in binaries on the target, as the job loop reads them."""
    def read(name: str, drop: tuple[str, ...] = ()) -> TargetFacts:
        bindir = tmp_path / ("bin-" + "-".join(d.strip("-") for d in drop) if drop else "bin")
        fake_container_bin(bindir, name, drop=drop)
        connection = LocalConnection(env=dict(os.environ, PATH=f"{bindir}:/usr/bin:/bin"))
        return runtimes.read_facts(connection, python="/usr/bin/python3", runtime=name)
    return read


@pytest.mark.parametrize("name, prefix", [("apptainer", "APPTAINERENV_"), ("singularity", "SINGULARITYENV_")])
def test_apptainer_and_singularity_cpu_jobs(container_help, name, prefix):
    facts = container_help(name)
    assert (facts.uid, facts.gid) == (os.getuid(), os.getgid()) and "--containall" in facts.container_help
    spec = build_spec(payload(runtime=name, image="/images/train.sif", command=["python", "train.py"]), facts)
    inside = {prefix + k: v for k, v in table(jobenv.container_locations()).items()}
    assert spec == with_hash(common(
        name,
        argv=[name, "exec", "--cleanenv", "--containall", "--no-eval", "--no-home", "--no-mount",
              "hostfs,cwd,bind-paths", "--bind", f"{JD}/inputs:/mmt/inputs:ro",
              "--bind", f"{JD}/outputs:/mmt/outputs:rw", "--bind", f"{JD}/work:/mmt/work:rw",
              "--pwd", "/mmt/work", "/images/train.sif", "python", "train.py"],
        env={**inside, "CUDA_VISIBLE_DEVICES": ""},
        pass_env=["PATH", "HOME", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "TMPDIR"],
        cwd=f"{JD}/work",
    ))
    assert_token_only_in_env_and_files(spec)


@pytest.mark.parametrize("name, prefix", [("apptainer", "APPTAINERENV_"), ("singularity", "SINGULARITYENV_")])
def test_apptainer_and_singularity_gpu_jobs(container_help, name, prefix):
    spec = build_spec(payload(runtime=name, image="images/train.sif", command=["python", "train.py"],
                              gpu_ids=["2", "3"], source=GIT_SOURCE), container_help(name))
    assert spec["argv"] == [
        name, "exec", "--cleanenv", "--containall", "--no-eval", "--no-home", "--no-mount", "hostfs,cwd,bind-paths",
        "--bind", f"{JD}/inputs:/mmt/inputs:ro", "--bind", f"{JD}/source:/mmt/source:ro",
        "--bind", f"{JD}/outputs:/mmt/outputs:rw", "--nv", "--pwd", "/mmt/source",
        f"{WD}/images/train.sif", "python", "train.py"]
    inside = {prefix + k: v for k, v in table(jobenv.container_locations(), CUDA_VISIBLE_DEVICES="2,3").items()}
    assert spec["env"] == {**inside, "CUDA_VISIBLE_DEVICES": "2,3"}
    assert_token_only_in_env_and_files(spec)


@pytest.mark.parametrize("name", ["apptainer", "singularity"])
def test_a_container_binary_without_the_flags_is_refused(container_help, name):
    old = container_help(name, drop=("--no-eval", "--no-mount"))
    with pytest.raises(RuntimeRefused) as refused:
        build_spec(payload(runtime=name, image="/i.sif"), old)
    assert refused.value.code == "container_flags_missing"
    assert "--no-eval, --no-mount" in refused.value.message
    no_nv = container_help(name, drop=("--nv",))
    assert build_spec(payload(runtime=name, image="/i.sif"), no_nv)["argv"][0] == name  # CPU: --nv not needed
    with pytest.raises(RuntimeRefused) as refused:
        build_spec(payload(runtime=name, image="/i.sif", gpu_ids=["0"]), no_nv)
    assert refused.value.code == "container_flags_missing" and refused.value.message.count("--nv") == 1
    assert "--nvccli" in no_nv.container_help  # a longer flag does not count as --nv


def test_a_missing_container_binary_is_refused(tmp_path):
    connection = LocalConnection(env=dict(os.environ, PATH=f"{tmp_path}:/usr/bin:/bin"))
    facts = runtimes.read_facts(connection, python="/usr/bin/python3", runtime="apptainer")
    assert facts.container_help is None
    with pytest.raises(RuntimeRefused) as refused:
        build_spec(payload(runtime="apptainer", image="/i.sif"), facts)
    assert refused.value.code == "runtime_missing"


def test_specs_refuse_incomplete_jobs():
    for changes, code in (({"command": []}, "command_missing"),
                          ({"computer": dict(payload()["computer"], working_dir="")}, "working_dir_missing"),
                          ({"runtime": "slurm"}, "runtime_unsupported")):
        with pytest.raises(RuntimeRefused) as refused:
            build_spec(payload(**changes), FACTS)
        assert refused.value.code == code


def test_the_spec_hash_ignores_the_token_only():
    job = payload()
    again = copy.deepcopy(job)
    again["job_token"] = "mado_mtj_handed_out_again_by_resume"
    assert build_spec(job, FACTS)["spec_hash"] == build_spec(again, FACTS)["spec_hash"]
    assert build_spec(job, FACTS)["spec_hash"] != build_spec(payload(env={"SEED": "8"}), FACTS)["spec_hash"]
