"""How a site runner of a cluster job learns which replica it is and where the others run (the
parts of worker_agent/site/runner.py that do not need a scheduler; the real two-node Slurm runs them
in test_slurm_two_nodes.py)."""
from __future__ import annotations

import pytest

from worker_agent.site import runner


@pytest.fixture
def clean_env(monkeypatch):
    for name in (*runner.REPLICA_INDEX_VARIABLES, "MMT_CLUSTER_NODES", "MMT_MASTER_PORT", "SLURM_JOB_ID",
                 "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_replica_comes_from_mmt_replica_index_then_slurm_procid_then_slurm_nodeid(clean_env):
    clean_env.setenv("SLURM_NODEID", "2")
    assert runner.replica_index(3) == 2
    clean_env.setenv("SLURM_PROCID", "1")
    assert runner.replica_index(3) == 1
    clean_env.setenv("MMT_REPLICA_INDEX", "0")
    assert runner.replica_index(3) == 0
    assert [runner.replica_name(i) for i in range(3)] == ["main1", "sub1", "sub2"]


def test_a_runner_that_cannot_tell_its_replica_is_a_configuration_error_saying_what_to_do(clean_env):
    with pytest.raises(runner.ConfigError, match="start it with srun"):
        runner.replica_index(2)
    clean_env.setenv("SLURM_PROCID", "2")
    with pytest.raises(runner.ConfigError, match="SLURM_PROCID=2 is not a replica of this 2-replica cluster job"):
        runner.replica_index(2)


def test_the_nodes_and_master_port_an_owners_job_shell_may_pass(clean_env):
    clean_env.setenv("MMT_CLUSTER_NODES", "127.0.0.1, 127.0.0.1")
    assert runner.cluster_nodes() == ["127.0.0.1", "127.0.0.1"]
    replica = runner.Replica(1, 2, "single-node", [runner.node_address(n) for n in runner.cluster_nodes()], 45000)
    assert replica.hosts == {"main1": "127.0.0.1", "sub1": "127.0.0.1"}
    assert {k: replica.env[k] for k in ("MMT_CLUSTER_HOST", "RANK", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")} == {
        "MMT_CLUSTER_HOST": "sub1", "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "45000",
        "WORLD_SIZE": "2"}


def test_every_replica_derives_the_same_master_port_without_the_batch_scripts_pick(clean_env):
    clean_env.setenv("SLURM_JOB_ID", "123456")
    assert runner.master_port(7) == 40000 + 123456 % 20000
    clean_env.setenv("MMT_MASTER_PORT", "45678")
    assert runner.master_port(7) == 45678
    clean_env.setenv("MMT_MASTER_PORT", "80")  # not a port a job's code may listen on: derived instead
    assert runner.master_port(7) == 40000 + 123456 % 20000
    assert 1024 <= runner.free_port() <= 65535


def test_no_nodes_known_is_a_start_failure_that_says_where_they_come_from(clean_env):
    with pytest.raises(runner.StartFailed, match="SLURM_JOB_NODELIST"):
        runner.cluster_nodes()
