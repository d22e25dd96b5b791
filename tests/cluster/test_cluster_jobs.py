"""Cluster jobs on the server (docs/cluster-jobs.md): creation, placement at claim time, the queued
reason, per-replica logs, a failing replica, stop."""
from __future__ import annotations

import pytest

from jobs.models import GpuReservation, Job, JobReplica, LogChunk
from tests.cluster.conftest import (
    cluster_request,
    create,
    created_then_shrunk,
    make_group,
    refused_create,
    session,
)
from tests.conftest import assert_error
from tests.job_fixtures import gpu_computer


def refused(world, field: str, **fields) -> str:
    response = session(world.member).post("/api/projects/lab/jobs", cluster_request(**fields), format="json")
    body = assert_error(response, 422, "invalid_job")
    assert field in body["fields"], body
    assert not Job.objects.exists()
    return body["error"]


class TestCreation:
    @pytest.mark.parametrize("size", [0, 65, "three", -1, 2.5])
    def test_the_cluster_size_is_1_to_64(self, world, gpu_box, size):
        assert "from 1 to 64" in refused(world, "cluster_size", computer=gpu_box.pk, cluster_size=size)

    def test_the_mode_is_single_or_multi_node(self, world, gpu_box):
        assert "single-node or multi-node" in refused(world, "cluster_mode", computer=gpu_box.pk, cluster_size=2,
                                                      cluster_mode="ring")

    def test_multi_node_needs_a_compute_group_and_no_computer(self, world, gpu_box, lab_nodes):
        assert "choose one" in refused(world, "compute_group", cluster_size=2, cluster_mode="multi-node")
        assert "leave the computer out" in refused(world, "computer", computer=gpu_box.pk, cluster_size=2,
                                                   cluster_mode="multi-node", compute_group=lab_nodes.pk)
        assert "No such compute group" in refused(world, "compute_group", cluster_size=2, cluster_mode="multi-node",
                                                  compute_group="nowhere")

    def test_cluster_jobs_ask_gpus_per_replica_not_gpu_ids(self, world, gpu_box):
        assert "gpus_per_replica" in refused(world, "gpu_ids", computer=gpu_box.pk, cluster_size=2, gpu_ids=["0"])
        assert "from 0 to 64" in refused(world, "gpus_per_replica", computer=gpu_box.pk, cluster_size=2,
                                         gpus_per_replica=65)
        assert "give the GPU IDs" in refused(world, "gpus_per_replica", computer=gpu_box.pk, gpus_per_replica=2)

    def test_a_group_is_for_cluster_jobs_only(self, world, gpu_box, lab_nodes):
        assert "cluster size 2 or more" in refused(world, "compute_group", computer=gpu_box.pk,
                                                   compute_group=lab_nodes.pk)
        assert "choose the computer" in refused(world, "compute_group", computer=gpu_box.pk, cluster_size=2,
                                                compute_group=lab_nodes.pk)

    def test_a_group_without_a_computer_for_the_runtime_is_refused(self, world, lab_nodes):
        text = refused(world, "compute_group", cluster_size=2, cluster_mode="multi-node", compute_group="LAB-NODES",
                       runtime="apptainer", image="x.sif")
        assert "No enabled computer of the compute group lab-nodes" in text and "supports apptainer" in text

    def test_sites_whose_job_shell_starts_no_runner_per_node_refuse_cluster_jobs_with_a_clear_message(
            self, world, make_site):
        site = make_site(world.global_admin, visibility="public", template="gridengine", runtimes=["python"])
        text = refused(world, "cluster_size", computer=site.pk, cluster_size=2)
        assert "job shell does not run cluster jobs" in text and "choose a Slurm site" in text

    def test_on_a_slurm_site_a_cluster_job_is_multi_node_on_the_site_itself(self, world, make_site, lab_nodes):
        site = make_site(world.global_admin, visibility="public", runtimes=["python"])
        text = refused(world, "compute_group", computer=site.pk, cluster_size=2, compute_group=lab_nodes.pk)
        assert "A site places the replicas itself" in text
        for mode in ("single-node", "multi-node", None):
            job = create(world, computer=site.pk, cluster_size=2, gpus_per_replica=1,
                         **({"cluster_mode": mode} if mode else {}))
            assert (job["cluster_mode"], job["compute_group"], job["computer"]["id"]) == ("multi-node", None, site.pk)

    def test_size_1_is_an_ordinary_job_whatever_the_mode(self, world, gpu_box, job_worker):
        body = create(world, computer=gpu_box.pk, cluster_size=1, cluster_mode="multi-node", gpu_ids=["2"])
        assert body["replicas"] == [] and body["queued_reason"] is None and body["compute_group"] is None
        item = job_worker.claim()
        assert item["replicas"] is None and item["cluster_size"] == 1 and item["gpu_ids"] == ["2"]
        assert not JobReplica.objects.exists()

    def test_the_body_says_size_mode_group_and_gpus_per_replica(self, world, lab_nodes):
        body = create(world, cluster_size=3, cluster_mode="multi-node", compute_group="lab-nodes",
                      gpus_per_replica=1)
        assert (body["cluster_size"], body["cluster_mode"], body["gpus_per_replica"]) == (3, "multi-node", 1)
        assert body["compute_group"] == {"id": lab_nodes.pk, "name": "lab-nodes"} and body["replicas"] == []


class TestSingleNode:
    def test_two_replicas_get_disjoint_gpus_of_the_one_computer(self, world, gpu_box, job_worker):
        create(world, computer=gpu_box.pk, cluster_size=2, gpus_per_replica=2)
        item = job_worker.claim()
        assert [(r["index"], r["name"], r["role"], r["gpu_ids"]) for r in item["replicas"]] == [
            (0, "main1", "main", ["0", "1"]), (1, "sub1", "sub", ["2", "3"])]
        assert all(r["computer"]["host"] == gpu_box.host and r["computer"]["working_dir"] == "/data/mmt"
                   for r in item["replicas"])
        assert item["computer"]["id"] == gpu_box.pk and item["gpu_ids"] == ["0", "1"]
        assert sorted(GpuReservation.objects.values_list("gpu_id", flat=True)) == ["0", "1", "2", "3"]
        # Nothing else fits on the computer until it ends; then everything is free again.
        create(world, computer=gpu_box.pk, gpu_ids=["3"])
        assert job_worker.claim(active=[item["id"]]) is None
        assert job_worker.complete(item).status_code == 200
        assert not GpuReservation.objects.filter(job_id=item["id"]).exists()
        assert job_worker.claim()["gpu_ids"] == ["3"]

    def test_a_worker_that_does_not_run_replicas_never_gets_a_cluster_job(self, world, gpu_box, job_worker):
        from tests.job_fixtures import JobWorker

        old = JobWorker(world.worker_token, "old-worker", capabilities=("checks", "reads", "jobs"))
        assert old.hello().status_code == 200
        create(world, computer=gpu_box.pk, cluster_size=2, gpus_per_replica=1)
        ordinary = create(world, computer=gpu_box.pk, gpu_ids=["3"])
        assert old.claim()["id"] == ordinary["id"], "the ordinary job, not main1 of the cluster job alone"
        assert old.claim(active=[ordinary["id"]]) is None
        assert job_worker.claim()["replicas"][1]["name"] == "sub1"

    def test_a_job_needing_more_gpus_than_the_computer_has_is_refused_with_why(self, world, gpu_box):
        body = refused_create(world, computer=gpu_box.pk, cluster_size=3, gpus_per_replica=2)
        assert body["code"] == "invalid_job" and list(body["fields"]) == ["cluster_size"]
        assert body["fields"]["cluster_size"] == [
            "Needs 3 replicas × 2 GPUs; gpu-host-1 can hold at most 2 (by GPUs and concurrent jobs), so it cannot "
            "start. Ask for fewer replicas or GPUs, or choose another computer."]
        assert body["error"] == body["fields"]["cluster_size"][0] and not Job.objects.exists()
        assert create(world, computer=gpu_box.pk, cluster_size=2, gpus_per_replica=2)["status"] == "queued"

    def test_a_job_whose_computer_lost_gpus_stays_queued_with_its_reason(self, world, gpu_box, job_worker):
        big = created_then_shrunk(world, gpu_box, gpus=("0", "1", "2", "3"), cluster_size=3, gpus_per_replica=2)
        small = create(world, computer=gpu_box.pk, gpu_ids=["0"])
        assert job_worker.claim()["id"] == small["id"]  # the one that cannot fit holds nobody up
        body = session(world.member).get(f"/api/jobs/{big['id']}").json()
        assert body["status"] == "queued"
        assert body["queued_reason"] == ("Needs 3 replicas × 2 GPUs; gpu-host-1 can hold at most 2 (by GPUs and "
                                         "concurrent jobs), so it cannot start. Stop it and ask for fewer replicas "
                                         "or GPUs.")
        assert not GpuReservation.objects.filter(job_id=big["id"]).exists()

    def test_a_disabled_computer_is_the_reason_given(self, world, gpu_box):
        job = create(world, computer=gpu_box.pk, cluster_size=2, gpus_per_replica=1)
        gpu_box.enabled = False
        gpu_box.save(update_fields=["enabled"])
        body = session(world.member).get(f"/api/jobs/{job['id']}").json()
        assert body["queued_reason"] == "gpu-host-1 is disabled: it starts once its owner enables it again."

    def test_more_replicas_than_concurrent_jobs_is_refused_with_why(self, world):
        """Issue 15 item 7: cluster size 3 on a computer with concurrency 2 was accepted and waited for ever."""
        box = gpu_computer(world.global_admin, "small-box", gpus=(), concurrency=2)
        body = refused_create(world, computer=box.pk, cluster_size=3)
        assert body["fields"]["cluster_size"] == [
            "Needs 3 replicas × 0 GPUs; small-box can hold at most 2 (by GPUs and concurrent jobs), so it cannot "
            "start. Ask for fewer replicas or GPUs, or choose another computer."]
        assert not Job.objects.exists()

    def test_a_computer_that_lost_concurrent_jobs_keeps_its_job_queued(self, world, job_worker):
        box = gpu_computer(world.global_admin, "small-box", gpus=(), concurrency=2)
        job = created_then_shrunk(world, box, concurrency=2, cluster_size=3)
        assert job_worker.claim() is None
        assert "can hold at most 2" in session(world.member).get(f"/api/jobs/{job['id']}").json()["queued_reason"]

    def test_a_busy_computer_says_how_many_fit_now(self, world, gpu_box, job_worker):
        create(world, computer=gpu_box.pk, gpu_ids=["1"])
        held = job_worker.claim()
        job = create(world, computer=gpu_box.pk, cluster_size=2, gpus_per_replica=2)
        assert job_worker.claim(active=[held["id"]]) is None
        reason = session(world.member).get(f"/api/jobs/{job['id']}").json()["queued_reason"]
        assert "there is room for 1 now on gpu-host-1" in reason and "all 2 fit at once" in reason


class TestMultiNode:
    def test_replicas_are_packed_onto_one_computer_when_one_holds_them_all(self, world, lab_nodes, job_worker):
        create(world, cluster_size=2, cluster_mode="multi-node", compute_group=lab_nodes.pk, gpus_per_replica=1)
        item = job_worker.claim()
        # node-a holds exactly 2 replicas, node-b 4: the tightest fit leaves node-b free for bigger jobs.
        assert {r["computer"]["name"] for r in item["replicas"]} == {"node-a"}
        assert [r["gpu_ids"] for r in item["replicas"]] == [["0"], ["1"]]
        assert item["computer"]["name"] == "node-a"

    def test_replicas_spread_over_the_group_when_no_computer_holds_them_all(self, world, lab_nodes, job_worker):
        job = create(world, cluster_size=3, cluster_mode="multi-node", compute_group=lab_nodes.pk,
                     gpus_per_replica=2)
        item = job_worker.claim()
        assert [(r["name"], r["computer"]["name"], r["gpu_ids"]) for r in item["replicas"]] == [
            ("main1", "node-b", ["0", "1"]), ("sub1", "node-b", ["2", "3"]), ("sub2", "node-a", ["0", "1"])]
        assert all(set(r["computer"]) >= {"host", "port", "ssh_user", "ssh_key_path", "known_hosts_path",
                                          "python_path", "runtimes"} for r in item["replicas"])
        body = session(world.member).get(f"/api/jobs/{job['id']}").json()
        assert body["computer"]["name"] == "node-b" and body["status"] == "claimed"
        assert [r["computer"]["name"] for r in body["replicas"]] == ["node-b", "node-b", "node-a"]
        assert GpuReservation.objects.count() == 6

    def test_a_computer_running_only_a_sub_keeps_its_gpus_while_the_job_runs(self, world, lab_nodes, node_a,
                                                                          job_worker):
        """Seed 002: GPUs cannot change while Jobs use the computer — a replica counts, not only main1."""
        create(world, cluster_size=3, cluster_mode="multi-node", compute_group=lab_nodes.pk, gpus_per_replica=2)
        item = job_worker.claim()
        assert item["replicas"][2]["computer"]["name"] == "node-a" and item["computer"]["name"] == "node-b"
        admin = session(world.global_admin)
        assert_error(admin.patch(f"/api/computers/{node_a.pk}", {"gpu_ids": ["0"]}, format="json"), 409,
                     "computer_in_use")
        assert job_worker.complete(item).status_code == 200
        assert admin.patch(f"/api/computers/{node_a.pk}", {"gpu_ids": ["0"]}, format="json").status_code == 200

    def test_too_big_for_the_whole_group_is_refused_with_why(self, world, lab_nodes):
        body = refused_create(world, cluster_size=4, cluster_mode="multi-node", compute_group=lab_nodes.pk,
                              gpus_per_replica=2)
        assert body["fields"]["cluster_size"] == [
            "Needs 4 replicas × 2 GPUs; the computers of lab-nodes can hold at most 3 (by GPUs and concurrent jobs), "
            "so it cannot start. Ask for fewer replicas or GPUs, or choose another compute group."]
        assert not Job.objects.exists()

    def test_a_group_that_shrank_keeps_its_job_queued_holding_nothing(self, world, lab_nodes, node_b, job_worker):
        job = create(world, cluster_size=3, cluster_mode="multi-node", compute_group=lab_nodes.pk,
                     gpus_per_replica=2)
        lab_nodes.computers.remove(node_b)  # node-a alone holds one replica of 2 GPUs
        assert job_worker.claim() is None
        reason = session(world.member).get(f"/api/jobs/{job['id']}").json()["queued_reason"]
        assert "the computers of lab-nodes can hold at most 1" in reason and "Stop it" in reason
        assert not GpuReservation.objects.exists() and not JobReplica.objects.exists()

    def test_only_computers_the_creator_may_use_take_replicas(self, world, node_a, job_worker):
        root_box = gpu_computer(world.global_admin, "root-box", gpus=("0", "1", "2", "3"))
        group = make_group(world, "mixed", [node_a, root_box])
        create(world, cluster_size=3, cluster_mode="multi-node", compute_group=group.pk, gpus_per_replica=1)
        root_box.visibility = "private"  # made private while the job was queued
        root_box.save(update_fields=["visibility"])
        assert job_worker.claim() is None  # node-a holds 2; root-box is not bob's to use any more
        assert not GpuReservation.objects.exists()

    def test_a_worker_limited_to_some_computers_places_replicas_only_there(self, world, lab_nodes, node_a):
        from tests.job_fixtures import JobWorker

        worker = JobWorker(world.worker_token, "only-a", target_ids=[node_a.pk])
        assert worker.hello().status_code == 200
        create(world, cluster_size=3, cluster_mode="multi-node", compute_group=lab_nodes.pk, gpus_per_replica=1)
        assert worker.claim() is None  # node-a alone cannot hold 3, and node-b is not this worker's


@pytest.fixture
def running_cluster(world, gpu_box, job_worker):
    create(world, computer=gpu_box.pk, cluster_size=3, gpus_per_replica=1)
    item = job_worker.claim()
    assert job_worker.heartbeat(item, "running").status_code == 200
    return item


class TestReplicaLogsAndEnd:
    def test_logs_are_kept_per_replica(self, world, job_worker, running_cluster):
        item = running_cluster
        chunks = [{"replica": name, "stream": "stdout", "offset": 0, "data": f"hello from {name}\n"}
                  for name in ("main1", "sub1", "sub2")] + [{"stream": "stdout", "offset": 17, "data": "again\n"}]
        assert job_worker.leased(item, "logs", chunks=chunks).json() == {"stored": 4}
        assert job_worker.leased(item, "logs", chunks=chunks).json() == {"stored": 0}  # resent: ignored
        client = session(world.member)
        sub1 = client.get(f"/api/jobs/{item['id']}/logs?replica=sub1").json()["items"]
        assert [(c["replica"], c["data"]) for c in sub1] == [("sub1", "hello from sub1\n")]
        main = client.get(f"/api/jobs/{item['id']}/logs?replica=main1").json()["items"]
        assert [c["data"] for c in main] == ["hello from main1\n", "again\n"]
        assert len(client.get(f"/api/jobs/{item['id']}/logs").json()["items"]) == 4
        assert "sub7" not in str(LogChunk.objects.values_list("replica", flat=True))

    def test_unknown_replicas_are_refused(self, world, job_worker, running_cluster):
        item = running_cluster
        body = assert_error(job_worker.leased(item, "logs", chunks=[
            {"replica": "sub3", "stream": "stdout", "offset": 0, "data": "x"}]), 422, "invalid")
        assert "main1, sub1, sub2" in body["error"]
        response = session(world.member).get(f"/api/jobs/{item['id']}/logs?replica=sub9")
        assert response.status_code == 400 and "main1, sub1, sub2" in str(response.json())

    def test_a_failing_sub_fails_the_job_naming_it(self, world, job_worker, running_cluster):
        item = running_cluster
        missing = job_worker.complete(item, status="failed", exit_code=3, end_reason="replica_failed")
        assert "needs replica" in assert_error(missing, 422, "invalid")["error"]
        response = job_worker.complete(item, status="failed", exit_code=3, end_reason="replica_failed",
                                       replica="sub2", error="exited with code 3")
        assert response.status_code == 200 and response.json()["end_reason"] == "replica_failed"
        body = session(world.member).get(f"/api/jobs/{item['id']}").json()
        assert body["status"] == "failed" and body["end_replica"] == "sub2"
        assert body["error"] == "sub2: exited with code 3" and body["exit_code"] == 3
        assert not GpuReservation.objects.exists()
        assert [r["name"] for r in body["replicas"]] == ["main1", "sub1", "sub2"]  # kept after the end

    def test_main1_ending_ends_the_job(self, world, job_worker, running_cluster):
        response = job_worker.complete(running_cluster, status="finished", exit_code=0, replica="main1")
        assert response.status_code == 200
        assert Job.objects.get().end_replica == "main1"

    def test_stop_reaches_the_worker_once_for_every_replica(self, world, job_worker, running_cluster):
        item = running_cluster
        assert session(world.member).post(f"/api/jobs/{item['id']}/stop").status_code == 200
        assert job_worker.heartbeat(item).json()["cancel_requested"] is True
        assert job_worker.complete(item, status="canceled", exit_code=None).status_code == 200
        assert Job.objects.get().status == "canceled" and not GpuReservation.objects.exists()

    def test_a_queued_cluster_job_stops_at_once(self, world, gpu_box):
        job = create(world, computer=gpu_box.pk, cluster_size=4, gpus_per_replica=1)
        body = session(world.member).post(f"/api/jobs/{job['id']}/stop").json()
        assert body["status"] == "canceled" and body["queued_reason"] is None
