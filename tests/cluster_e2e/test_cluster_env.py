"""The replica environment of a cluster job (docs/cluster-jobs.md, "What the agent does" 4): pure
functions of worker_agent/jobenv.py, shared by the SSH/Local agent and the Slurm site runner."""
from __future__ import annotations

import pytest

from worker_agent import jobenv

NODE_A = {"id": 3, "name": "node-a", "kind": "ssh", "host": "10.0.0.1", "port": 22}
NODE_B = {"id": 4, "name": "node-b", "kind": "ssh", "host": "10.0.0.2", "port": 22}
REPLICAS = [
    {"index": 0, "name": "main1", "role": "main", "gpu_ids": ["0"], "computer": NODE_A},
    {"index": 1, "name": "sub1", "role": "sub", "gpu_ids": ["1"], "computer": NODE_A},
    {"index": 2, "name": "sub2", "role": "sub", "gpu_ids": ["0"], "computer": NODE_B},
]


def test_every_replica_gets_the_peer_and_torch_variables():
    env = jobenv.cluster_environment(replica=REPLICAS[2], replicas=REPLICAS, mode="multi-node",
                                     main_addr="10.0.0.1", master_port=29500)
    assert env == {
        "MMT_CLUSTER_HOST": "sub2", "MMT_CLUSTER_HOSTS": "main1,sub1,sub2", "MMT_CLUSTER_IDX": "2",
        "MMT_CLUSTER_SIZE": "3", "MMT_CLUSTER_ROLE": "sub", "MMT_CLUSTER_MODE": "multi-node",
        "MMT_CLUSTER_MAIN_ADDR": "10.0.0.1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
        "WORLD_SIZE": "3", "RANK": "2", "NODE_RANK": "2", "LOCAL_RANK": "0"}
    main = jobenv.cluster_environment(replica=REPLICAS[0], replicas=list(reversed(REPLICAS)), mode="multi-node",
                                      main_addr="127.0.0.1", master_port=29500)
    assert (main["MMT_CLUSTER_HOST"], main["MMT_CLUSTER_IDX"], main["MMT_CLUSTER_ROLE"], main["RANK"]) == \
        ("main1", "1", "main", "0")
    assert main["MMT_CLUSTER_HOSTS"] == "main1,sub1,sub2"  # ordered by index whatever the input order


def test_main_address_is_loopback_on_main1s_computer_and_for_local_computers():
    assert jobenv.main_address(REPLICAS[0], REPLICAS) == "127.0.0.1"
    assert jobenv.main_address(REPLICAS[1], REPLICAS) == "127.0.0.1"  # shares node-a with main1
    assert jobenv.main_address(REPLICAS[2], REPLICAS) == "10.0.0.1"
    local = {"id": 9, "name": "laptop", "kind": "local", "host": ""}
    replicas = [dict(REPLICAS[0], computer=local), dict(REPLICAS[2])]
    assert jobenv.main_address(replicas[1], replicas) == "127.0.0.1"


def test_hosts_file_and_docker_add_host():
    addresses = [{"index": 1, "name": "sub1", "address": "10.0.0.2"},
                 {"index": 0, "name": "main1", "address": "10.0.0.1"}]
    assert jobenv.hosts_file_text(addresses) == "10.0.0.1 main1\n10.0.0.2 sub1\n"
    assert jobenv.hosts_file_text({"main1": "10.0.0.1", "sub1": "10.0.0.2"}) == "10.0.0.1 main1\n10.0.0.2 sub1\n"
    assert jobenv.docker_add_hosts({"main1": "10.0.0.1", "sub1": "10.0.0.2"}) == [
        "--add-host", "main1:10.0.0.1", "--add-host", "sub1:10.0.0.2"]
    with pytest.raises(ValueError, match="one word"):
        jobenv.hosts_file_text({"main1": "10.0.0.1 evil"})


def replica_job(**changes) -> dict:
    job = {"id": 12, "lease_id": "6c1f3a52-8d0e-4b7a-9e21-3f5d7c9b1a04", "job_token": "mado_mtj_secret", "project_id": 1,
           "runtime": "python", "image": "", "command": ["python", "train.py"], "source": None, "requirements": "",
           "parameters": {}, "env": {"SEED": "7", "MMT_CLUSTER_HOST": "forged"}, "gpu_ids": ["2", "3"],
           "walltime_seconds": None, "api_url": "https://mado.example.org",
           "computer": {"id": 4, "name": "node-b", "kind": "ssh", "host": "10.0.0.2", "working_dir": "/data/mmt",
                        "python_path": "/usr/bin/python3"}}
    job.update(changes)
    return job


def cluster_arg() -> dict:
    env = jobenv.cluster_environment(replica=REPLICAS[1], replicas=REPLICAS, mode="single-node",
                                     main_addr="127.0.0.1", master_port=40001)
    return {"name": "sub1", "env": env, "hosts": {"main1": "127.0.0.1", "sub1": "127.0.0.1", "sub2": "10.0.0.2"}}


def test_a_python_replica_has_its_own_workspace_hosts_file_and_gpus():
    from worker_agent.runtimes import TargetFacts, build_spec

    spec = build_spec(replica_job(), TargetFacts(uid=1000, gid=1000), cluster=cluster_arg())
    workspace = "/data/mmt/.mmt/jobs/12-sub1"
    assert spec["job_id"] == "12-sub1" and spec["cwd"] == f"{workspace}/work"
    env = spec["env"]
    assert env["MMT_CLUSTER_HOST"] == "sub1", "the job's own env cannot forge a cluster variable"
    assert (env["MMT_JOB_ID"], env["CUDA_VISIBLE_DEVICES"], env["MASTER_PORT"], env["RANK"]) == \
        ("12", "2,3", "40001", "1")
    assert env["MMT_CLUSTER_HOSTS_FILE"] == f"{workspace}/inputs/cluster-hosts"
    hosts = next(f for f in spec["files"] if f["path"] == "inputs/cluster-hosts")
    assert hosts["content"] == "127.0.0.1 main1\n127.0.0.1 sub1\n10.0.0.2 sub2\n"


def test_a_docker_replica_gets_add_host_and_its_own_container():
    from worker_agent.runtimes import TargetFacts, build_spec

    spec = build_spec(replica_job(runtime="docker", image="pytorch:2"), TargetFacts(uid=1000, gid=1000),
                      cluster=cluster_arg())
    create = spec["docker"]["create"]
    assert spec["docker"]["name"] == "mmt-job-12-sub1" and "mmt-job-12-sub1" in create
    at = create.index("--add-host")
    assert create[at:at + 6] == ["--add-host", "main1:127.0.0.1", "--add-host", "sub1:127.0.0.1",
                                 "--add-host", "sub2:10.0.0.2"]
    assert "--gpus" in create and '"device=2,3"' in create
    env = next(f for f in spec["files"] if f["path"] == "container.env")["content"]
    assert "MMT_CLUSTER_HOST=sub1\n" in env and "CUDA_VISIBLE_DEVICES=0,1\n" in env
    assert "MMT_CLUSTER_HOSTS_FILE=/mmt/inputs/cluster-hosts\n" in env
