"""What the supervisor runs for a job: the spec handed to `supervisor.py start`, built from the claim
payload (docs/worker-protocol.md, "Jobs") and a few facts about the target, as plain data (argv lists,
environment dicts, files to write), so every runtime is checked by exact equality in tests.

- python: a venv per (computer's Python, requirements) under `<working_dir>/.mmt-cache/venvs/<key>/`,
  built by the supervisor before the job (logged into stderr.log) and reused by later jobs with the
  same key; pip options inside requirements are refused before anything runs on the target;
  `python`/`python3` as the command's first word becomes the venv's interpreter, and the venv's `bin`
  is put in front of PATH.
- docker: `docker container create --pull never --name mmt-job-<id> --restart no --init --network host
  --user <uid>:<gid> --env-file <workspace>/container.env --label mado.job=<id> --label mado.lease=<h>`
  with read-only bind mounts of /mmt/inputs, /mmt/source and each input dataset version's cache
  directory at /mmt/datasets/<versionId>, a writable /mmt/outputs, and
  `--gpus "device=<ids>"` only with reserved GPUs; then `docker start -a`. The environment of the job
  lives only in container.env (mode 600).
- apptainer / singularity: first the capability check (`<bin> exec --help` lists every required flag,
  else `container_flags_missing`), then `<bin> exec --cleanenv --containall --no-eval --no-home
  --no-mount hostfs,cwd,bind-paths --bind src:dst:ro … [--nv] --pwd <dir> <image> <command…>` with
  the environment in `APPTAINERENV_*` / `SINGULARITYENV_*` (never argv) and CUDA_VISIBLE_DEVICES set to
  the reserved host ids.

The supervisor also accepts a bare `process` runtime (a host command without venv); no job uses it."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from worker_agent import jobenv
from worker_agent.core import ship
from worker_agent.supervisor import DEFAULT_GRACE, spec_hash, workspace
from worker_agent.supervisor import program as supervisor_program

CONTAINER_RUNTIMES = ("apptainer", "singularity")
REQUIRED_CONTAINER_FLAGS = ("--cleanenv", "--containall", "--no-eval", "--no-home", "--no-mount", "--pwd")
GPU_CONTAINER_FLAGS = ("--nv",)
NO_MOUNT = "hostfs,cwd,bind-paths"
# What the docker CLI itself may need from the target's environment (the container gets none of it).
DOCKER_PASS_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT",
                   "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY")
PYTHON_NAMES = ("python", "python3")


class RuntimeRefused(Exception):
    """The job cannot run as given; `code` becomes the job's error code, `message` says what to fix."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


# -- facts about the target ------------------------------------------------------------------------

@dataclass(frozen=True)
class TargetFacts:
    uid: int
    gid: int
    container_help: str | None = None  # output of `<bin> exec --help`; None when the binary is missing


def facts_binary(runtime: str) -> str:
    """The binary whose `exec --help` the facts carry: a container runtime's, or none ("")."""
    return runtime if runtime in CONTAINER_RUNTIMES else ""


def facts_from(data: dict) -> TargetFacts:
    """TargetFacts from the supervisor's `target_facts` answer (on its own or in a poll)."""
    return TargetFacts(uid=int(data["uid"]), gid=int(data["gid"]), container_help=data.get("help"))


def read_facts(connection, *, python: str, runtime: str, timeout: float = 90.0) -> TargetFacts:
    """The target user's uid/gid (for docker's --user) and the container binary's `exec --help`, from
    the supervisor program's `facts` command (usually they come with the poll before a start)."""
    ran = ship.run(connection, python, supervisor_program(), ["facts", facts_binary(runtime)], timeout=timeout)
    try:
        return facts_from(json.loads(ran.stdout.decode("utf-8").strip().splitlines()[-1]))
    except (ValueError, IndexError, KeyError, TypeError):
        raise RuntimeRefused("python_missing", f"The target's Python ({python or 'python3'}) could not run a "
                                               "standard-library script; run the connection check.") from None


def missing_container_flags(help_text: str, *, gpus: bool) -> list[str]:
    wanted = REQUIRED_CONTAINER_FLAGS + (GPU_CONTAINER_FLAGS if gpus else ())
    return [flag for flag in wanted if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text)]


def check_container_flags(runtime: str, help_text: str | None, *, gpus: bool) -> None:
    if help_text is None:
        raise RuntimeRefused("runtime_missing", f"{runtime} is not installed on the target (or `{runtime} exec "
                                                "--help` did not run): install it or choose another runtime.")
    missing = missing_container_flags(help_text, gpus=gpus)
    if missing:
        raise RuntimeRefused("container_flags_missing",
                             f"{runtime} on the target does not support {', '.join(missing)}, which Mado needs to "
                             f"isolate the job: update {runtime} (Apptainer 1.1 or later, SingularityCE 3.10 or "
                             "later).")


# -- requirements -----------------------------------------------------------------------------------

def _logical_lines(text: str) -> list[tuple[int, str]]:
    lines, buffer, first = [], "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        if not buffer:
            first = number
        line = re.sub(r"(^|\s)#.*$", "", raw)
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        lines.append((first, (buffer + line).strip()))
        buffer = ""
    if buffer.strip():
        lines.append((first, buffer.strip()))
    return [(n, line) for n, line in lines if line]


def validate_requirements(text: str) -> list[str]:
    """The requirement lines; pip options anywhere in them (`-r`, `--index-url`, `-e`, `--hash`, …) are
    refused, because they would change where packages come from or run other files."""
    requirements = []
    for number, line in _logical_lines(text or ""):
        option = next((word for word in line.split() if word.startswith("-")), None)
        if option is not None:
            raise RuntimeRefused("pip_options_refused",
                                 f"Line {number} of the requirements has the pip option {option.split('=')[0]}; "
                                 "options are not allowed in requirements. Give package names and versions only "
                                 "(or `name @ URL`), and configure package indexes on the target.")
        requirements.append(line)
    return requirements


def venv_key(python_path: str, requirements: str) -> str:
    """Jobs with the same Python and the same requirement lines share one venv."""
    lines = validate_requirements(requirements)
    material = json.dumps({"python": python_path, "requirements": lines}, separators=(",", ":"))
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:32]


def venv_dir(working_dir: str, key: str) -> str:
    return f"{working_dir.rstrip('/')}/.mmt-cache/venvs/{key}"


# -- the spec ---------------------------------------------------------------------------------------

def lease_hash(lease_id: str) -> str:
    return hashlib.sha256(str(lease_id).encode("utf-8")).hexdigest()[:16]


def _check_image(image: str, runtime: str) -> str:
    image = (image or "").strip()
    if not image or image.startswith("-") or any(c.isspace() for c in image):
        raise RuntimeRefused("image_invalid", f"A {runtime} job needs an image name without spaces that does not "
                                              "start with '-'.")
    return image


def _check_mountable(path: str, forbidden: str, runtime: str) -> None:
    bad = [c for c in forbidden if c in path]
    if bad:
        raise RuntimeRefused("path_not_mountable", f"The workspace {path} contains {' '.join(bad)}, which {runtime} "
                                                   "cannot bind-mount: choose a working directory without it.")


def build_spec(job: dict, facts: TargetFacts, *, grace_seconds: float = DEFAULT_GRACE,
               cluster: dict | None = None, hold: bool = False) -> dict:
    """The spec for `supervisor.py start`, for a claimed `job` (the claim payload).

    `cluster`, for one replica of a cluster job (docs/cluster-jobs.md): `name` (main1, sub1, …), `env`
    (`jobenv.cluster_environment`) and `hosts` (replica name → address). The replica gets its own
    workspace `<working_dir>/.mmt/jobs/<jobId>-<name>/` (replicas may share a computer), the hosts file
    `inputs/cluster-hosts` named by MMT_CLUSTER_HOSTS_FILE, and in Docker `--add-host` per replica.
    `job`'s `computer` and `gpu_ids` must be the replica's own.

    `hold`: the supervisor prepares (venv, container) and then waits for `release` before it starts the
    job's process; the worker's cluster replicas use it to start together once all are prepared."""
    computer = job.get("computer") or {}
    working_dir = str(computer.get("working_dir") or "").rstrip("/")
    if not working_dir.startswith("/"):
        raise RuntimeRefused("working_dir_missing", "The computer has no working directory (an absolute path on "
                                                    "the target): set one in its settings.")
    command = [str(word) for word in job.get("command") or []]
    if not command:
        raise RuntimeRefused("command_missing", "The job has no command.")
    runtime = str(job.get("runtime") or "python")
    job_id = str(job["id"]) if not cluster else f"{job['id']}-{cluster['name']}"
    job_dir = workspace(working_dir, job_id)
    if cluster:
        job = _with_cluster(job, cluster, container=runtime in ("docker", *CONTAINER_RUNTIMES), job_dir=job_dir)
    host = jobenv.host_locations(job_dir)
    gpu_ids = [str(g) for g in job.get("gpu_ids") or []]
    has_source = bool(job.get("source"))
    parameters = json.dumps(job.get("parameters") or {}, indent=1, sort_keys=True) + "\n"
    spec = {
        "format": 1,
        "job_id": job_id,
        "lease_id": str(job["lease_id"]),
        "working_dir": working_dir,
        "runtime": runtime,
        "walltime_seconds": job.get("walltime_seconds") or None,
        "grace_seconds": grace_seconds,
        "dirs": ["inputs", "outputs", "work"] + (["source"] if has_source else []),
        "files": [{"path": "inputs/parameters.json", "content": parameters, "mode": 0o600}],
        "secrets": jobenv.secret_values(job),
    }
    if cluster:
        spec["files"].append({"path": CLUSTER_HOSTS_PATH, "mode": 0o644,
                              "content": jobenv.hosts_file_text(cluster.get("hosts") or {})})
    if job.get("input_datasets"):
        spec["files"].append({"path": "inputs/datasets.json", "mode": 0o600, "content": jobenv.dataset_versions_file(
            job, container=runtime in ("docker", *CONTAINER_RUNTIMES))})
    if runtime == "python":
        spec.update(_python(job, computer, working_dir, command, host, has_source))
    elif runtime == "docker":
        spec.update(_docker(job, facts, job_dir, command, gpu_ids, has_source, job_id=job_id,
                            add_hosts=jobenv.docker_add_hosts(cluster["hosts"]) if cluster else []))
        spec["files"].append({"path": "container.env", "content": spec.pop("container_env"), "mode": 0o600})
    elif runtime in CONTAINER_RUNTIMES:
        spec.update(_apptainer(job, facts, runtime, working_dir, job_dir, command, gpu_ids, has_source))
    else:
        raise RuntimeRefused("runtime_unsupported", f"The worker cannot run the runtime {runtime!r}.")
    if hold:
        spec["hold"] = True
    spec["spec_hash"] = spec_hash(spec)
    return spec


CLUSTER_HOSTS_PATH = f"inputs/{jobenv.CLUSTER_HOSTS_FILE}"


def _with_cluster(job: dict, cluster: dict, *, container: bool, job_dir: str) -> dict:
    """The job as one replica sees it: the cluster variables join its env (the job's own env cannot set
    MMT_ names, so they are added after jobenv's filter, through `cluster_env`)."""
    inputs = jobenv.container_locations().inputs_dir if container else jobenv.host_locations(job_dir).inputs_dir
    env = dict(cluster.get("env") or {}, MMT_CLUSTER_HOSTS_FILE=f"{inputs}/{jobenv.CLUSTER_HOSTS_FILE}")
    return dict(job, cluster_env=env)


def _python(job, computer, working_dir, command, host, has_source) -> dict:
    python_path = str(computer.get("python_path") or "python3")
    requirements = str(job.get("requirements") or "")
    directory = venv_dir(working_dir, venv_key(python_path, requirements))
    interpreter = f"{directory}/bin/python"
    argv = [interpreter if command[0] in PYTHON_NAMES else command[0], *command[1:]]
    return {
        "argv": argv,
        "env": jobenv.job_environment(job, host),
        "pass_env": list(jobenv.PASSTHROUGH),
        "path_prepend": [f"{directory}/bin"],
        "cwd": host.source_dir if has_source else host.work_dir,
        "venv": {"python": python_path, "dir": directory, "requirements": requirements},
    }


def _mounts(job: dict, job_dir: str, has_source: bool) -> list[tuple[str, str, bool]]:
    """(host path, container path, read-only) of every bind mount: the input dataset versions from
    the computer's cache appear read-only at /mmt/datasets/<versionId>."""
    inside = jobenv.container_locations()
    host = jobenv.host_locations(job_dir)
    mounts = [(host.inputs_dir, inside.inputs_dir, True)]
    working_dir = str((job.get("computer") or {}).get("working_dir") or "")
    for version in job.get("input_datasets") or []:
        mounts.append((jobenv.cached_data_dir(working_dir, version["digest"]),
                       jobenv.container_dataset_dir(version["id"]), True))
    if has_source:
        mounts.append((host.source_dir, inside.source_dir, True))
    mounts.append((host.outputs_dir, inside.outputs_dir, False))
    if not has_source:
        mounts.append((host.work_dir, inside.work_dir, False))
    return mounts


def _docker(job, facts, job_dir, command, gpu_ids, has_source, *, job_id: str, add_hosts: list[str]) -> dict:
    image = _check_image(str(job.get("image") or ""), "docker")
    _check_mountable(job_dir, ',"', "docker")
    name = f"mmt-job-{job_id}"
    inside = jobenv.container_locations()
    env = jobenv.job_environment(job, inside, docker=True)
    bad = sorted(k for k, v in env.items() if "\n" in v or "\r" in v or "\0" in v)
    if bad:
        raise RuntimeRefused("env_not_representable", f"Docker cannot pass values with line breaks ({', '.join(bad)}): "
                                                      "remove them from the job's environment.")
    create = ["docker", "container", "create", "--pull", "never", "--name", name, "--restart", "no", "--init",
              "--network", "host", "--user", f"{facts.uid}:{facts.gid}", "--env-file", f"{job_dir}/container.env",
              "--label", f"mado.job={job_id}", "--label", f"mado.lease={lease_hash(job['lease_id'])}", *add_hosts]
    for src, dst, readonly in _mounts(job, job_dir, has_source):
        create += ["--mount", f"type=bind,src={src},dst={dst}" + (",readonly" if readonly else "")]
    if gpu_ids:
        create += ["--gpus", f'"device={",".join(gpu_ids)}"']
    create += ["--workdir", inside.source_dir if has_source else inside.work_dir, image, *command]
    return {
        "argv": ["docker", "start", "-a", name],
        "env": {},
        "pass_env": list(DOCKER_PASS_ENV),
        "cwd": None,
        "docker": {"bin": "docker", "name": name, "create": create},
        "container_env": "".join(f"{k}={v}\n" for k, v in env.items()),
    }


def _apptainer(job, facts, runtime, working_dir, job_dir, command, gpu_ids, has_source) -> dict:
    check_container_flags(runtime, facts.container_help, gpus=bool(gpu_ids))
    image = _check_image(str(job.get("image") or ""), runtime)
    if "://" not in image and not image.startswith("/"):
        image = f"{working_dir}/{image}"  # a relative image path is relative to the working directory
    _check_mountable(job_dir, ":,", runtime)
    inside = jobenv.container_locations()
    prefix = "APPTAINERENV_" if runtime == "apptainer" else "SINGULARITYENV_"
    env = {prefix + k: v for k, v in jobenv.job_environment(job, inside).items()}
    env.update(jobenv.gpu_variables(gpu_ids, docker=False))
    argv = [runtime, "exec", "--cleanenv", "--containall", "--no-eval", "--no-home", "--no-mount", NO_MOUNT]
    for src, dst, readonly in _mounts(job, job_dir, has_source):
        argv += ["--bind", f"{src}:{dst}" + (":ro" if readonly else ":rw")]
    if gpu_ids:
        argv.append("--nv")
    argv += ["--pwd", inside.source_dir if has_source else inside.work_dir, image, *command]
    return {
        "argv": argv,
        "env": env,
        "pass_env": list(jobenv.PASSTHROUGH),
        "cwd": jobenv.host_locations(job_dir).work_dir,
    }
