"""Cluster jobs on a site through the real API (docs/cluster-jobs.md, "Sites"): which sites take them,
the claim (alone, never in an array, with the cluster fields and replicas), one runner per replica
sharing the Job's token (start with `replica`, runner_conflict only for the same replica twice), the
Job running once every replica runs, per-replica logs, and the end: main1's end, a failing sub named,
a sub that exits 0, a stop and the time limit."""
from __future__ import annotations

import pytest

from jobs import services as job_services
from jobs.models import Job, JobEvent, LogChunk
from mado.errors import ServiceError
from mado.services import Actor
from sites import services, shells, submissions
from sites.models import Submission
from tests.conftest import assert_error, bearer
from tests.sites.site_jobs import (  # noqa: F401  (fixtures)
    Runner,
    claim,
    launcher,
    lclient,
    no_expiry_throttle,
    queue,
    registered,
    site_of,
    submitted,
)

pytestmark = pytest.mark.django_db
SITE_REFUSAL = ("grid-cluster's job shell does not run cluster jobs (only a job shell that defines mmt_supports_clusters, "
                "such as the Slurm template, starts one runner per node); choose a Slurm site, an SSH computer or a "
                "compute group.")


@pytest.fixture
def site(world, host_keys, launcher):
    return site_of(world.project_admin, host_keys, launcher, runtimes=["python"])


def create(world, target, size=2, **fields) -> Job:
    return job_services.create_job(Actor(world.member), world.project,
                                   {"computer": target.pk, "runtime": "python", "command": ["python", "train.py"],
                                    "cluster_size": size, **fields})


@pytest.fixture
def replicas(world, site, lclient):
    """A submitted 2-replica cluster Job: (item, main1's runner, sub1's runner), same token."""
    create(world, site, 2)
    item = submitted(lclient, site, scheduler_job_id="7001")
    job_id, token = item["jobs"][0]["id"], item["jobs"][0]["token"]
    return item, Runner(job_id, token), Runner(job_id, token)


def started(replicas, *, running=True):
    _, main, sub = replicas
    for runner, name in ((main, "main1"), (sub, "sub1")):
        assert runner.start(replica=name).status_code == 200
        if running:
            assert runner.heartbeat("running").status_code == 200
    return main, sub


def test_the_slurm_site_takes_cluster_jobs_and_other_templates_refuse_them_unless_their_shell_declares_it(
        world, host_keys, launcher, site):
    assert services.runs_clusters(site)
    job = create(world, site, 3, gpus_per_replica=2)
    assert (job.status, job.cluster_size, job.gpus_per_replica) == ("queued", 3, 2)

    grid = site_of(world.project_admin, host_keys, launcher, name="grid-cluster", template="gridengine",
                   runtimes=["python"])
    assert not services.runs_clusters(grid)
    with pytest.raises(ServiceError) as refused:
        create(world, grid)
    assert refused.value.fields["cluster_size"] == [SITE_REFUSAL]
    assert create(world, grid, 1).cluster_size == 1  # ordinary Jobs as before

    # An owner's own job shell says it starts one runner per replica by defining mmt_supports_clusters.
    services.save_job_shell(Actor(world.project_admin), grid, shells.builtin_template("gridengine")
                            + "\nmmt_supports_clusters() {\n    return 0\n}\n")
    assert services.runs_clusters(grid) and create(world, grid).cluster_size == 2


def test_a_cluster_job_is_claimed_alone_with_its_replicas_and_the_scripts_cluster_values(world, site, lclient):
    ordinary = queue(site, world.member, world.project, 2)
    cluster = create(world, site, 2, gpus_per_replica=1)
    other = create(world, site, 2, gpus_per_replica=1)
    items = claim(lclient, site)
    assert sorted(item["job_ids"] for item in items) == sorted([[j.pk for j in ordinary], [cluster.pk], [other.pk]])
    item = next(i for i in items if i["job_ids"] == [cluster.pk])
    job = item["jobs"][0]["job"]
    assert (job["cluster_size"], job["cluster_mode"], job["gpus_per_replica"]) == (2, "multi-node", 1)
    assert [(r["index"], r["name"], r["role"], r["computer"]["id"]) for r in job["replicas"]] == [
        (0, "main1", "main", site.pk), (1, "sub1", "sub", site.pk)]
    head = item["script"].split("# ---- job shell ----")[0]
    for line in ("export MMT_CLUSTER_SIZE=2", "export MMT_NODES=2", "export MMT_GPU_COUNT=1",
                 "export MMT_ARRAY_SIZE=1"):
        assert line in head.splitlines()
    # What the requester reads: the replicas, on the site.
    body = bearer(world.member_token(world.member)).get(f"/api/jobs/{cluster.pk}").json()
    assert [(r["name"], r["computer"]["id"]) for r in body["replicas"]] == [("main1", site.pk), ("sub1", site.pk)]


def test_a_job_shell_saved_without_the_declaration_fails_the_cluster_job_at_claim_saying_why(world, site, lclient):
    job = create(world, site, 2)
    content = shells.builtin_template("slurm").replace("mmt_supports_clusters() {\n    return 0\n}\n", "")
    services.save_job_shell(Actor(world.project_admin), site, content)
    assert claim(lclient, site) == []
    job.refresh_from_db()
    assert (job.status, job.end_reason) == ("failed", "submit_failed")
    assert job.error.startswith(f"Not submitted: Job shell version 2 of {site.name} does not run cluster jobs")


def test_one_runner_per_replica_and_the_job_runs_once_every_replica_runs(replicas):
    item, main, sub = replicas
    job_id = item["jobs"][0]["id"]
    answer = main.start(replica="main1")
    assert answer.status_code == 200 and answer.json()["job"]["cluster_size"] == 2
    assert Job.objects.get(pk=job_id).status == "waiting_resources"
    assert sub.post("start", replica="sub1", hostname="node-02").status_code == 200
    assert main.start(replica="main1").status_code == 200, "the same runner's start resent"

    third = Runner(job_id, item["jobs"][0]["token"])
    assert_error(third.start(replica="sub1"), 409, "runner_conflict")
    assert_error(third.start(replica="sub2"), 422, "invalid")
    assert_error(third.start(), 422, "invalid")
    assert_error(third.heartbeat(), 409, "runner_not_started")
    assert_error(main.start(replica="sub1"), 409, "runner_conflict")

    assert main.heartbeat("running").json()["status"] == "waiting_resources", "sub1 does not run yet"
    assert sub.heartbeat("running").json()["status"] == "running"
    row = Submission.objects.get(job_id=job_id)
    assert str(row.runner_id) == main.runner_id and row.runner_hostname == "node-01"
    summary = submissions.submission_summary(Job.objects.get(pk=job_id))
    assert [(r["replica"], r["hostname"]) for r in summary["replica_runners"]] == [("main1", "node-01"),
                                                                                    ("sub1", "node-02")]


def test_each_runner_sends_its_own_replicas_logs(world, replicas):
    main, sub = started(replicas)
    job_id = main.job_id
    assert main.post("logs", chunks=[{"stream": "stdout", "offset": 0, "data": "from main\n"}]).status_code == 200
    assert sub.post("logs", chunks=[{"stream": "stdout", "offset": 0, "data": "from sub\n"}]).status_code == 200
    assert sub.post("logs", chunks=[{"replica": "sub1", "stream": "stderr", "offset": 0,
                                     "data": "warn\n"}]).status_code == 200
    assert_error(sub.post("logs", chunks=[{"replica": "main1", "stream": "stdout", "offset": 9, "data": "x"}]),
                 422, "invalid")
    stored = list(LogChunk.objects.filter(job_id=job_id).order_by("id").values_list("replica", "stream", "data"))
    assert stored == [("main1", "stdout", "from main\n"), ("sub1", "stdout", "from sub\n"),
                      ("sub1", "stderr", "warn\n")]
    reader = bearer(world.member_token(world.member))
    answer = reader.get(f"/api/jobs/{job_id}/logs?replica=sub1").json()
    chunks = answer["items"] if isinstance(answer, dict) and "items" in answer else answer.get("chunks", answer)
    assert [(c["replica"], c["data"]) for c in chunks] == [("sub1", "from sub\n"), ("sub1", "warn\n")]


def test_a_sub_that_exits_0_is_done_and_main1s_end_ends_the_job(replicas):
    main, sub = started(replicas)
    answer = sub.finish("finished", exit_code=0)
    assert answer.status_code == 200 and answer.json()["status"] == "running"
    assert_error(sub.post("outputs", result="{}", files=[], manifest=None), 409, "replica_outputs")
    assert JobEvent.objects.filter(job_id=main.job_id, kind="replica_ended").exists()
    assert main.finish("finished", exit_code=0).json()["status"] == "finished"
    job = Job.objects.get(pk=main.job_id)
    assert (job.status, job.end_reason, job.end_replica) == ("finished", "exit_code", "main1")
    assert sub.heartbeat().status_code == 401, "the token ended with the Job: the other runners stop"


def test_a_failing_sub_fails_the_job_naming_it(replicas):
    main, sub = started(replicas)
    answer = sub.finish("failed", exit_code=3, end_reason="exit_code")
    assert answer.json() == {"id": main.job_id, "status": "failed", "end_reason": "replica_failed"}
    job = Job.objects.get(pk=main.job_id)
    assert (job.end_replica, job.exit_code, job.error) == ("sub1", 3, "sub1 exited with code 3")
    assert main.heartbeat().status_code == 401


def test_main1_failing_fails_the_job_with_main1s_outcome(replicas):
    main, _ = started(replicas)
    main.finish("failed", exit_code=2, end_reason="exit_code")
    job = Job.objects.get(pk=main.job_id)
    assert (job.status, job.end_reason, job.exit_code, job.end_replica) == ("failed", "exit_code", 2, "main1")


def test_a_stop_reaches_every_replica_and_the_job_ends_canceled_naming_none(world, replicas):
    main, sub = started(replicas)
    job_services.request_stop(Actor(world.member), Job.objects.get(pk=main.job_id))
    assert main.heartbeat().json()["cancel_requested"] and sub.heartbeat().json()["cancel_requested"]
    assert sub.finish("canceled", end_reason="canceled").json()["status"] == "canceled"
    job = Job.objects.get(pk=main.job_id)
    assert (job.status, job.end_replica) == ("canceled", "")


def test_the_time_limit_ends_the_whole_job_naming_no_replica(replicas):
    _, sub = started(replicas)
    sub.finish("failed", end_reason="timed_out", error="The scheduler's time limit was reached.")
    job = Job.objects.get(pk=sub.job_id)
    assert (job.status, job.end_reason, job.end_replica) == ("failed", "timed_out", "")


def test_an_ordinary_jobs_runner_names_no_other_replica(world, site, lclient):
    queue(site, world.member, world.project, 1)
    item = submitted(lclient, site)
    runner = Runner(item["jobs"][0]["id"], item["jobs"][0]["token"])
    assert_error(runner.start(replica="sub1"), 422, "invalid")
    assert runner.start(replica="main1").status_code == 200


def test_main1_learns_which_subs_have_not_ended_and_a_sub_finishing_after_main1s_code_ended_keeps_every_line(
        replicas):
    """The wait of docs/sites-protocol.md "Cluster jobs": main1's code has ended and its runner asks
    the heartbeat which subs are still running; sub1 sends its last lines and finishes its replica; only
    then does main1's finish end the Job, and every sub1 line is stored."""
    _, main, sub = replicas
    assert main.start(replica="main1").json()["replica_wait_seconds"] == submissions.REPLICA_WAIT_SECONDS == 10
    assert sub.start(replica="sub1").status_code == 200
    assert main.heartbeat("running").json()["replicas_running"] == ["sub1"]
    assert sub.heartbeat("running").json() == {"cancel_requested": False, "status": "running",
                                               "replicas_running": ["sub1"]}
    assert main.post("logs", chunks=[{"stream": "stdout", "offset": 0, "data": "main done\n"}]).status_code == 200

    # main1's code ended: its runner heartbeats until sub1 is no longer listed.
    assert main.heartbeat().json()["replicas_running"] == ["sub1"]
    lines = [f"sub1 line {i}\n" for i in range(5)]
    at = 0
    for line in lines:
        assert sub.post("logs", chunks=[{"stream": "stdout", "offset": at, "data": line}]).status_code == 200
        at += len(line)
    assert sub.finish("finished", exit_code=0).json()["status"] == "running", "a sub's end is not the Job's"
    assert main.heartbeat().json() == {"cancel_requested": False, "status": "running", "replicas_running": []}
    assert main.finish("finished", exit_code=0).json()["status"] == "finished"

    job = Job.objects.get(pk=main.job_id)
    assert (job.status, job.end_replica) == ("finished", "main1")
    assert "".join(LogChunk.objects.filter(job_id=job.pk, replica="sub1").order_by("offset")
                   .values_list("data", flat=True)) == "".join(lines)


def test_a_sub_that_never_started_counts_as_running_and_an_ordinary_job_gets_no_wait(world, site, lclient,  # noqa: F811
                                                                                       replicas):
    _, main, _ = replicas
    assert main.start(replica="main1").status_code == 200
    assert main.heartbeat().json()["replicas_running"] == ["sub1"]

    queue(site, world.member, world.project, 1)
    item = submitted(lclient, site)
    runner = Runner(item["jobs"][0]["id"], item["jobs"][0]["token"])
    assert "replica_wait_seconds" not in runner.start().json()
    assert runner.heartbeat().json() == {"cancel_requested": False, "status": "waiting_resources"}
