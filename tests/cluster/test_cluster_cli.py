"""`mado-tracking jobs create --cluster-size/--cluster-mode/--compute-group` and `jobs logs --replica`
against a real live server."""
from __future__ import annotations

import gc
import threading

import pytest
from click.testing import CliRunner

from jobs.models import Job, LogChunk
from tests.support import wait_for
from worker_agent.researcher import main

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cli(world, live_server):
    token = world.token(world.member, ["read", "jobs:write"])

    def run(*args):
        return CliRunner().invoke(main, list(args), env={"MMT_API_URL": live_server.url, "MMT_API_TOKEN": token,
                                                          "MMT_API_TOKEN_FILE": None})
    yield run
    # As tests/datasets/test_cli.py: a refused request's socket keeps a live-server thread (and its
    # database connection) until collected; let those threads end before the test database goes.
    gc.collect()
    wait_for(lambda: not any("process_request_thread" in t.name for t in threading.enumerate()), timeout=10,
             what="the live server's request threads to end")


def test_a_multi_node_job_from_the_command_line(cli, lab_nodes):
    result = cli("jobs", "create", "--cluster-size", "3", "--cluster-mode", "multi-node", "--compute-group",
                 "lab-nodes", "--gpus-per-replica", "1", "--", "python", "train.py")
    assert result.exit_code == 0, result.output
    job = Job.objects.get()
    assert f"Created job {job.pk} on compute group lab-nodes, 3 replicas (queued)." in result.output
    assert (job.cluster_size, job.cluster_mode, job.gpus_per_replica, job.compute_group_id) == (3, "multi-node", 1,
                                                                                                 lab_nodes.pk)


def test_a_single_node_cluster_job_and_its_logs_per_replica(cli, gpu_box):
    result = cli("jobs", "create", "--computer", str(gpu_box.pk), "--cluster-size", "2", "--", "python", "x.py")
    assert result.exit_code == 0 and "on gpu-host-1, 2 replicas" in result.output
    job = Job.objects.get()
    LogChunk.objects.create(job=job, replica="main1", stream="stdout", offset=0, data="from main1\n")
    LogChunk.objects.create(job=job, replica="sub1", stream="stdout", offset=0, data="from sub1\n")
    only_sub = cli("jobs", "logs", str(job.pk), "--replica", "sub1")
    assert only_sub.exit_code == 0 and only_sub.output == "from sub1\n"
    both = cli("jobs", "logs", str(job.pk))
    assert both.output == "from main1\nfrom sub1\n"
    wrong = cli("jobs", "logs", str(job.pk), "--replica", "sub4")
    assert wrong.exit_code != 0 and "main1, sub1; choose one of those" in wrong.output


@pytest.mark.parametrize("args,text", [
    (["--cluster-size", "3", "--", "x"], "Give --computer ID, or run a multi-node cluster job"),
    (["--computer", "1", "--cluster-size", "2", "--gpu", "0", "--", "x"], "give --gpus-per-replica N instead"),
    (["--computer", "1", "--cluster-size", "65", "--", "x"], "65 is not in the range 1<=x<=64"),
])
def test_bad_cluster_options_say_what_to_do(cli, args, text):
    result = cli("jobs", "create", *args)
    assert result.exit_code != 0 and text in result.output
    assert not Job.objects.exists()


def test_the_servers_refusal_reaches_the_command_line(cli, gpu_box, lab_nodes):
    result = cli("jobs", "create", "--computer", str(gpu_box.pk), "--cluster-size", "2", "--cluster-mode",
                 "multi-node", "--compute-group", "lab-nodes", "--", "x")
    assert result.exit_code == 1 and "leave the computer out" in result.output
