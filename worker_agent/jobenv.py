"""The environment handed to job code (seed 001, "What the running code receives"; REFERENCE §2).

Job code gets exactly the variables of the seed's table that apply, the job's own `env`, and
`PYTHONUNBUFFERED=1`. From the target's own environment only `PASSTHROUGH` is kept, and only for code
that runs on the host (the python runtime); the supervisor copies those values on the target, because
they are the target's, not the worker's. In containers the paths are the container's (`/mmt/...`) and
nothing of the host's environment goes in.

The job token (`job_token` of the claim) is the only credential: it goes into `MMT_API_TOKEN` and
`MLFLOW_TRACKING_TOKEN`. The worker's own token is never an input of this module, so it cannot
reach a job. Neither token is ever put into an argv: see `runtimes.py`, which hands environments to
the supervisor in `spec.json` (mode 600) and to Docker in an env file (mode 600)."""
from __future__ import annotations

import json
from dataclasses import dataclass

PASSTHROUGH = ("PATH", "HOME", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "TMPDIR")
TOKEN_VARIABLES = ("MMT_API_TOKEN", "MLFLOW_TRACKING_TOKEN")
# Names that Mado sets; the server refuses them in a job's env, and the job's env never overrides them here.
RESERVED_PREFIXES = ("MMT_", "MLFLOW_", "CUDA_", "NVIDIA_")
# The server's MLflow-compatible endpoint under the API URL (a payload's `mlflow_tracking_uri` wins).
MLFLOW_PATH = "/mlflow"

CONTAINER_ROOT = "/mmt"
DATASET_CACHE = ".mmt-cache/datasets"  # under the working directory; worker_agent/target/dataset_cache.py


@dataclass(frozen=True)
class Locations:
    """Where the job finds its files, as the job sees them (host paths, or paths in the container)."""
    inputs_dir: str
    outputs_dir: str
    source_dir: str
    work_dir: str

    @property
    def parameters_file(self) -> str:
        return f"{self.inputs_dir}/parameters.json"

    @property
    def datasets_file(self) -> str:
        return f"{self.inputs_dir}/datasets.json"

    @property
    def result_file(self) -> str:
        return f"{self.outputs_dir}/result.json"


def host_locations(job_dir: str) -> Locations:
    """The workspace `<working_dir>/.mmt/jobs/<jobId>/` as the python runtime sees it."""
    job_dir = job_dir.rstrip("/")
    return Locations(inputs_dir=f"{job_dir}/inputs", outputs_dir=f"{job_dir}/outputs",
                     source_dir=f"{job_dir}/source", work_dir=f"{job_dir}/work")


def container_locations() -> Locations:
    return Locations(inputs_dir=f"{CONTAINER_ROOT}/inputs", outputs_dir=f"{CONTAINER_ROOT}/outputs",
                     source_dir=f"{CONTAINER_ROOT}/source", work_dir=f"{CONTAINER_ROOT}/work")


def gpu_variables(gpu_ids: list[str], *, docker: bool) -> dict[str, str]:
    """`CUDA_VISIBLE_DEVICES` for the reserved GPUs. Outside Docker (python runtime, Apptainer and
    Singularity) CUDA sees the host's ids; Docker hands only the reserved GPUs into the container, where
    CUDA numbers them from 0, and `NVIDIA_VISIBLE_DEVICES` names the host's ids (`void` without GPUs).
    Without GPUs, CUDA_VISIBLE_DEVICES is empty: CUDA then sees no device and the job runs on CPU."""
    ids = [str(g) for g in gpu_ids]
    if not docker:
        return {"CUDA_VISIBLE_DEVICES": ",".join(ids)}
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(ids))),
            "NVIDIA_VISIBLE_DEVICES": ",".join(ids) if ids else "void"}


def job_environment(job: dict, locations: Locations, *, docker: bool = False) -> dict[str, str]:
    """The variables Mado sets for one job plus the job's own `env` (Mado's names win over the job's).

    `job` is the claim payload of docs/worker-protocol.md ("Jobs"). Host variables of `PASSTHROUGH` are
    not included: the supervisor adds them on the target for host runtimes."""
    token = str(job.get("job_token") or "")
    api_url = str(job.get("api_url") or "").rstrip("/")
    env = {str(k): str(v) for k, v in (job.get("env") or {}).items() if not str(k).startswith(RESERVED_PREFIXES)}
    env.update({
        "MMT_API_URL": api_url,
        "MMT_API_TOKEN": token,
        "MLFLOW_TRACKING_URI": str(job.get("mlflow_tracking_uri") or (api_url + MLFLOW_PATH)),
        "MLFLOW_TRACKING_TOKEN": token,
        # The Job's Run (claim payload `run_id`, `experiment_id`): mlflow.start_run() continues it. A server
        # older than Runs sends neither; the job id then stands for the Run, and MLflow is not pointed at it.
        "MMT_RUN_ID": str(job.get("run_id") or job["id"]),
        "MMT_JOB_ID": str(job["id"]),
        "MMT_PROJECT_ID": str(job.get("project_id") or ""),
        "MMT_PARAMETERS_FILE": locations.parameters_file,
        "MMT_OUTPUTS_DIR": locations.outputs_dir,
        "MMT_RESULT_FILE": locations.result_file,
        "PYTHONUNBUFFERED": "1",
    })
    if job.get("run_id"):
        env["MLFLOW_RUN_ID"] = str(job["run_id"])
    if job.get("experiment_id"):
        env["MLFLOW_EXPERIMENT_ID"] = str(job["experiment_id"])
    if job.get("input_datasets"):
        container = locations.inputs_dir.startswith(CONTAINER_ROOT + "/")
        env["MMT_INPUT_DATASET_DIRS"] = json.dumps(dataset_dirs(job, container=container), sort_keys=True)
        env["MMT_DATASET_VERSIONS_FILE"] = locations.datasets_file
    env.update(gpu_variables(list(job.get("gpu_ids") or []), docker=docker))
    # One replica of a cluster job: its cluster variables (cluster_environment), put here by runtimes.build_spec.
    env.update({str(k): str(v) for k, v in (job.get("cluster_env") or {}).items()})
    return env


def cached_data_dir(working_dir: str, digest: str) -> str:
    """A complete version's files in the computer's dataset cache (read-only)."""
    return f"{working_dir.rstrip('/')}/{DATASET_CACHE}/{str(digest).removeprefix('sha256:')}/data"


def container_dataset_dir(version_id) -> str:
    return f"{CONTAINER_ROOT}/datasets/{version_id}"


def dataset_dirs(job: dict, *, container: bool) -> dict[str, str]:
    """`MMT_INPUT_DATASET_DIRS`: version id → its directory, as the job sees it."""
    working_dir = str((job.get("computer") or {}).get("working_dir") or "")
    return {str(v["id"]): container_dataset_dir(v["id"]) if container else cached_data_dir(working_dir, v["digest"])
            for v in job.get("input_datasets") or []}


def dataset_versions_file(job: dict, *, container: bool) -> str:
    """The content of `MMT_DATASET_VERSIONS_FILE`: what each input version is, and where."""
    dirs = dataset_dirs(job, container=container)
    items = [{"id": v["id"], "dataset": v.get("dataset"), "number": v.get("number"), "digest": v["digest"],
              "file_count": v.get("file_count"), "total_size": v.get("total_size"), "dir": dirs[str(v["id"])]}
             for v in job.get("input_datasets") or []]
    return json.dumps({"items": items}, indent=1, sort_keys=True) + "\n"


def secret_values(job: dict) -> list[str]:
    """Strings that must never appear in an argv, a log line the worker writes, or a state file."""
    token = str(job.get("job_token") or "")
    return [token] if token else []


# -- cluster jobs (docs/cluster-jobs.md, "What the agent does" 4) ----------------------------------

LOOPBACK = "127.0.0.1"
CLUSTER_HOSTS_FILE = "cluster-hosts"  # in the replica's workspace (python runtime: MMT_CLUSTER_HOSTS_FILE)
# For launchers (docs/cluster-jobs.md, "Hostfiles"), next to it in inputs/: `NAME slots=N` lines, which
# OpenMPI's --hostfile and DeepSpeed's --hostfile read alike (MMT_CLUSTER_HOSTFILE), and one name a line
# (MMT_CLUSTER_NODEFILE). Both list the replicas in RANK order, main1 first.
CLUSTER_HOSTFILE = "cluster-hostfile"
CLUSTER_NODEFILE = "cluster-nodes"


def replica_number(name: str) -> int:
    """The number in a replica's name, as the peer counts: `main1` → 1, `sub2` → 2."""
    digits = "".join(ch for ch in str(name) if ch.isdigit())
    if not digits:
        raise ValueError(f"replica name {name!r} has no number; replicas are named main1, sub1, sub2, …")
    return int(digits)


def cluster_environment(*, replica: dict, replicas: list[dict], mode: str, main_addr: str,
                        master_port: int) -> dict[str, str]:
    """The cluster variables of one replica. `replica` and `replicas` are items of the claim's
    `replicas` (at least `index`, `name`, `role`); `main_addr` is main1's address as *this* replica
    reaches it (see `main_address` for SSH and Local computers); `master_port` is the port chosen on
    main1's computer, the same for every replica. GPU variables are not here: `gpu_variables`."""
    ordered = sorted(replicas, key=lambda r: int(r["index"]))
    size = len(ordered)
    index = int(replica["index"])
    name = str(replica["name"])
    return {
        "MMT_CLUSTER_HOST": name,
        "MMT_CLUSTER_HOSTS": ",".join(str(r["name"]) for r in ordered),
        "MMT_CLUSTER_IDX": str(replica_number(name)),
        "MMT_CLUSTER_SIZE": str(size),
        "MMT_CLUSTER_ROLE": str(replica.get("role") or ("main" if index == 0 else "sub")),
        "MMT_CLUSTER_MODE": str(mode),
        "MMT_CLUSTER_MAIN_ADDR": str(main_addr),
        "MASTER_ADDR": str(main_addr),
        "MASTER_PORT": str(int(master_port)),
        "WORLD_SIZE": str(size),
        "RANK": str(index),
        "NODE_RANK": str(index),
        # Each replica sees only its own GPUs, numbered from 0.
        "LOCAL_RANK": "0",
    }


def computer_address(computer: dict) -> str:
    """How other replicas reach a computer: its `host`; loopback for a Local computer."""
    if str(computer.get("kind") or "") == "local" or not computer.get("host"):
        return LOOPBACK
    return str(computer["host"])


def same_computer(a: dict, b: dict) -> bool:
    if a.get("id") is not None and b.get("id") is not None:
        return str(a["id"]) == str(b["id"])
    return (a.get("host"), a.get("port")) == (b.get("host"), b.get("port"))


def main_address(replica: dict, replicas: list[dict]) -> str:
    """`MMT_CLUSTER_MAIN_ADDR` for `replica`: main1's computer's address, loopback when main1's
    computer is a Local computer or the replica shares main1's computer."""
    main = min(replicas, key=lambda r: int(r["index"]))
    main_computer = dict(main.get("computer") or {})
    if same_computer(dict(replica.get("computer") or {}), main_computer):
        return LOOPBACK
    return computer_address(main_computer)


def hosts_file_text(replicas_with_addresses) -> str:
    """The cluster hosts file: one `ADDRESS NAME` line per replica (main1 first). Takes a mapping
    name → address, or replica dicts with `name` and `address` (and optionally `index`)."""
    if isinstance(replicas_with_addresses, dict):
        pairs = list(replicas_with_addresses.items())
    else:
        items = sorted(replicas_with_addresses, key=lambda r: int(r.get("index", 0)))
        pairs = [(r["name"], r["address"]) for r in items]
    lines = []
    for name, address in pairs:
        name, address = str(name), str(address)
        if not name or not address or any(ch.isspace() for ch in name + address):
            raise ValueError(f"hosts file entry {name!r} → {address!r} must be one word each")
        lines.append(f"{address} {name}")
    return "\n".join(lines) + "\n"


def docker_add_hosts(replicas_with_addresses) -> list[str]:
    """`--add-host NAME:ADDRESS` per replica, for containers (the hosts file's lines as docker options)."""
    args: list[str] = []
    for line in hosts_file_text(replicas_with_addresses).splitlines():
        address, name = line.split(" ", 1)
        args += ["--add-host", f"{name}:{address}"]
    return args


def replica_slots(replica: dict) -> int:
    """A replica's slots in the hostfile: its GPU count, or 1 without GPUs (one process per replica)."""
    return max(1, len(replica.get("gpu_ids") or []))


def _ordered_names(replicas: list[dict]) -> list[str]:
    names = [str(r["name"]) for r in sorted(replicas, key=lambda r: int(r["index"]))]
    for name in names:
        if not name or any(ch.isspace() for ch in name):
            raise ValueError(f"replica name {name!r} must be one word")
    return names


def hostfile_text(replicas: list[dict]) -> str:
    """`MMT_CLUSTER_HOSTFILE`: `NAME slots=N` per replica in RANK order (line RANK+1 is that replica)."""
    slots = {str(r["name"]): replica_slots(r) for r in replicas}
    return "".join(f"{name} slots={slots[name]}\n" for name in _ordered_names(replicas))


def nodefile_text(replicas: list[dict]) -> str:
    """`MMT_CLUSTER_NODEFILE`: one replica name a line, in RANK order."""
    return "".join(f"{name}\n" for name in _ordered_names(replicas))


def cluster_file_variables(inputs_dir: str) -> dict[str, str]:
    """The hostfile variables, as the job sees `inputs_dir` (a host path, or /mmt/inputs in containers)."""
    inputs_dir = inputs_dir.rstrip("/")
    return {"MMT_CLUSTER_HOSTFILE": f"{inputs_dir}/{CLUSTER_HOSTFILE}",
            "MMT_CLUSTER_NODEFILE": f"{inputs_dir}/{CLUSTER_NODEFILE}"}
