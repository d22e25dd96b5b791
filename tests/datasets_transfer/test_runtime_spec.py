"""What a job with input versions receives, by exact equality (no target needed): MMT_INPUT_DATASET_DIRS
and MMT_DATASET_VERSIONS_FILE for host and container runtimes, and the read-only mounts at
/mmt/datasets/<versionId> for docker and apptainer."""
from __future__ import annotations

import json

from tests.agent_jobs.test_runtimes import WD, payload
from worker_agent.runtimes import TargetFacts, build_spec

DIGEST = "sha256:" + "ab" * 32
INPUTS = [{"id": 41, "dataset": {"id": 3, "name": "speech"}, "number": 2, "digest": DIGEST, "file_count": 9,
           "total_size": 1234, "manifest_url": "/m", "files_url": "/f/", "worker_manifest_url": "/wm",
           "worker_files_url": "/wf/"}]
CACHED = f"{WD}/.mmt-cache/datasets/{'ab' * 32}/data"
HELP = "--cleanenv --containall --no-eval --no-home --no-mount --pwd --nv"


def test_python_jobs_read_the_cache_directory_itself():
    spec = build_spec(payload(input_datasets=INPUTS), TargetFacts(uid=1000, gid=1000))
    assert json.loads(spec["env"]["MMT_INPUT_DATASET_DIRS"]) == {"41": CACHED}
    assert spec["env"]["MMT_DATASET_VERSIONS_FILE"] == f"{WD}/.mmt/jobs/12/inputs/datasets.json"
    [info] = [f for f in spec["files"] if f["path"] == "inputs/datasets.json"]
    assert json.loads(info["content"])["items"] == [
        {"id": 41, "dataset": {"id": 3, "name": "speech"}, "number": 2, "digest": DIGEST, "file_count": 9,
         "total_size": 1234, "dir": CACHED}]


def test_docker_mounts_each_version_read_only():
    spec = build_spec(payload(runtime="docker", image="train:1", input_datasets=INPUTS), TargetFacts(1000, 1000))
    assert f"type=bind,src={CACHED},dst=/mmt/datasets/41,readonly" in spec["docker"]["create"]
    env = dict(line.split("=", 1) for line in spec["files"][-1]["content"].splitlines())
    assert json.loads(env["MMT_INPUT_DATASET_DIRS"]) == {"41": "/mmt/datasets/41"}
    assert env["MMT_DATASET_VERSIONS_FILE"] == "/mmt/inputs/datasets.json"


def test_apptainer_binds_each_version_read_only():
    spec = build_spec(payload(runtime="apptainer", image="/img.sif", input_datasets=INPUTS),
                      TargetFacts(1000, 1000, container_help=HELP))
    assert f"{CACHED}:/mmt/datasets/41:ro" in spec["argv"]
    assert json.loads(spec["env"]["APPTAINERENV_MMT_INPUT_DATASET_DIRS"]) == {"41": "/mmt/datasets/41"}


def test_jobs_without_inputs_get_no_dataset_variables():
    spec = build_spec(payload(), TargetFacts(uid=1000, gid=1000))
    assert "MMT_INPUT_DATASET_DIRS" not in spec["env"]
    assert not [f for f in spec["files"] if f["path"] == "inputs/datasets.json"]
