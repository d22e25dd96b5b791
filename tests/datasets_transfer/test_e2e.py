"""Input dataset versions end to end: the Django live server on PostgreSQL, a real worker process and
a real OpenSSH server as the computer (tests/agent_e2e_jobs). Each job checks the sha256 of every file
of its inputs itself, through MMT_INPUT_DATASET_DIRS; bytes moved are what the worker counted on the
SSH channel (relay) or the target counted from HTTP (direct), as the worker logs them."""
from __future__ import annotations

import hashlib
import json
import re
import socket
import time

import pytest

from datasets.models import DatasetCacheReport
from jobs.models import Job
from tests.datasets_transfer.forwarders import Forwarder
from tests.datasets_transfer.conftest import checking_job, make_version, sample_files, tree

MB = 1 << 20
BIG = 40 * MB  # the other tests' version: 300 small files and one of 40 MiB


@pytest.fixture
def version(e2e, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    files = sample_files(300, BIG)
    return make_version(e2e.world.member, e2e.world.project, "speech", files), files


@pytest.fixture
def large_version(e2e, settings, tmp_path):
    """Issue 8's size: 200 MiB, 300 small files of 64 KiB and one of 180 MiB."""
    settings.MEDIA_ROOT = tmp_path / "media"
    files = sample_files(300, 180 * MB, small_bytes=64 * 1024)
    return make_version(e2e.world.member, e2e.world.project, "speech", files), files


def moved(e2e, version) -> list[int]:
    pattern = rf"input dataset version {version.pk} \(speech v\d+\) (?:fetched by \w+: (\d+) bytes moved|is in the " \
              r"computer's cache already: (0) bytes moved)"
    return [int(a or b) for a, b in re.findall(pattern, e2e.worker_output())]


def entry_dir(e2e, version):
    return e2e.working_dir / ".mmt-cache" / "datasets" / version.digest.removeprefix("sha256:")


def assert_finished(e2e, job) -> Job:
    job = e2e.wait_ended(job, timeout=180)
    assert job.status == "finished", (job.status, job.end_reason, job.error, e2e.worker_output()[-3000:])
    e2e.wait_log(job, "verified")
    return job


@pytest.mark.parametrize("mode", ["relay", "direct"])
def test_a_version_arrives_bit_exact_and_a_second_job_moves_nothing(e2e, large_version, mode, settings, live_server):
    version, files = large_version
    assert sum(map(len, files.values())) > 200 * 1000 * 1000
    settings.PUBLIC_URL = live_server.url  # direct: the target reaches the API at this address
    e2e.computer.dataset_transfer = mode
    e2e.computer.save()
    e2e.start_worker()
    first = assert_finished(e2e, checking_job(e2e, [version]))
    assert f"verified {len(files)} files of versions ['{version.pk}']" in e2e.stream(first, "stdout")
    entry = entry_dir(e2e, version)
    assert tree(entry / "data") == files
    sealed = (entry / "complete.json").stat()
    [fetched] = moved(e2e, version)
    assert fetched >= sum(map(len, files.values()))
    if mode == "relay":
        assert fetched < sum(map(len, files.values())) + 1600 * len(files) + 4 * MB, "one tar: headers, padding"

    second = assert_finished(e2e, checking_job(e2e, [version]))
    assert moved(e2e, version) == [fetched, 0], "the second job used the cache"
    again = (entry / "complete.json").stat()
    assert (again.st_ino, again.st_mtime_ns) == (sealed.st_ino, sealed.st_mtime_ns)
    report = DatasetCacheReport.objects.get(target=e2e.computer)
    assert report.job_id == second.pk and report.used_bytes == version.total_size and report.version_count == 1


def test_two_jobs_starting_together_fetch_once(e2e, version):
    version, files = version
    jobs = [checking_job(e2e, [version]) for _ in range(2)]
    e2e.start_worker()
    for job in jobs:
        assert_finished(e2e, job)
    assert sorted(moved(e2e, version)) == [0, max(moved(e2e, version))] and max(moved(e2e, version)) > BIG
    assert len(re.findall(rf"version {version.pk} \(speech v1\) fetched", e2e.worker_output())) == 1


class CorruptingPort(Forwarder):
    """Flips one bit of the first occurrence of `marker` in the server's answers: a byte corrupted in
    transit, under HTTP's radar."""

    def __init__(self, upstream: int, marker: bytes):
        self.marker, self.done = marker, False
        super().__init__(upstream)

    def _pump(self, source, sink, shared, answers):
        try:
            while data := source.recv(1 << 16):
                at = data.find(self.marker) if answers and not self.done else -1
                if at >= 0:
                    self.done = True
                    data = data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def test_a_byte_corrupted_in_transit_fails_the_job(e2e, settings, tmp_path, live_server):
    settings.MEDIA_ROOT = tmp_path / "media"
    marker = hashlib.sha256(b"corrupt me").digest()
    files = dict(sample_files(20, 0), **{"needle.bin": marker * 4096})
    version = make_version(e2e.world.member, e2e.world.project, "speech", files)
    port = CorruptingPort(live_server.thread.port, marker)
    try:
        e2e.start_worker(url=port.url)
        job = e2e.wait_ended(checking_job(e2e, [version]), timeout=120)
    finally:
        port.close()
    assert port.done
    assert (job.status, job.end_reason) == ("failed", "input_failed")
    assert f"Input dataset version {version.pk} (speech v1) could not be delivered" in job.error
    assert "needle.bin" in job.error and "does not match its sha256" in job.error, job.error
    assert not (entry_dir(e2e, version) / "complete.json").exists()
    assert not (entry_dir(e2e, version) / "users" / str(job.pk)).exists(), "the failed job's pin is gone"


@pytest.mark.parametrize("mode", ["relay", "direct"])
def test_a_file_the_server_no_longer_has_fails_at_once(e2e, version, mode, settings, live_server):
    version, files = version
    settings.PUBLIC_URL = live_server.url
    e2e.computer.dataset_transfer = mode
    e2e.computer.save()
    entry = version.entries.select_related("file").get(path="big/audio.bin")
    (settings.MEDIA_ROOT / entry.file.file.name).unlink()
    e2e.start_worker()
    job = e2e.wait_ended(checking_job(e2e, [version]), timeout=120)
    assert (job.status, job.end_reason) == ("failed", "input_failed")
    assert "404" in job.error and "big/audio.bin" in job.error or "no longer holds" in job.error, job.error
    assert "failed 3 times" not in job.error and "trying again" not in e2e.worker_output()
    assert job.finished_at and job.claimed_at and (job.finished_at - job.claimed_at).total_seconds() < 30
    assert not (entry_dir(e2e, version) / "data").exists()


def test_eviction_over_ssh_is_lru_and_skips_pinned_versions(sshd, tmp_path):
    """dataset_cache.py through the real sshd with a 250 KiB limit: the worker's ensure_version with a
    relay that serves bytes from memory (no API server needed for the cache's own behaviour)."""
    import os
    import pwd
    import uuid

    from tests.datasets_transfer.conftest import digest_of, manifest_of
    from worker_agent import dataset_transfer
    from worker_agent.ssh import Connection, Target

    user = pwd.getpwnam(sshd.user)
    working_dir = sshd.home / f"evict-{uuid.uuid4().hex[:8]}"
    working_dir.mkdir()
    os.chown(working_dir, user.pw_uid, user.pw_gid)
    versions = [{f"v{n}.bin": bytes([n]) * 100 * 1024} for n in range(4)]

    class MemoryRelay:
        def __init__(self, files):
            self.files = files

        def manifest(self, version):
            return manifest_of(self.files)

        def send_archive(self, version, items, write, whole=False):  # the archive's members, as relayed
            for item in items:
                write(dataset_transfer.tar_header(item["path"], item["size"]) + self.files[item["path"]]
                      + b"\0" * (-item["size"] % 512))

    def ensure(files, job_id):
        job = {"id": job_id, "computer": {"dataset_cache_limit_gib": 250 * 1024 / (1 << 30)}}
        version = {"id": job_id, "digest": digest_of(files), "total_size": 100 * 1024, "file_count": 1}
        return dataset_transfer.ensure_version(connection, MemoryRelay(files), job, version,
                                               python="/usr/bin/python3", working_dir=str(working_dir))

    def job_state(job_id, status):
        directory = working_dir / ".mmt" / "jobs" / str(job_id)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "state.json").write_text(json.dumps({"status": status}))

    connection = Connection(Target(host="127.0.0.1", port=sshd.port, user=sshd.user, key_path=str(sshd.key_path),
                                   known_hosts_path=str(sshd.known_hosts_path))).open()
    try:
        assert ensure(versions[0], 1)["fetched"]  # job 1 keeps running: v0 stays pinned
        job_state(1, "running")
        time.sleep(0.02)
        assert ensure(versions[1], 2)["fetched"]
        job_state(2, "exited")
        answer = ensure(versions[2], 3)  # v0 is the least recently used but pinned: v1 goes
        assert answer["evicted"] == [digest_of(versions[1]).removeprefix("sha256:")]
        assert answer["sent"] > 100 * 1024
        job_state(3, "exited")
        job_state(1, "exited")
        assert ensure(versions[2], 4)["sent"] < 2048, "v2 is cached: only the request went over SSH"
        job_state(4, "exited")
        answer = ensure(versions[3], 5)  # v0 is now unpinned and least recently used
        assert answer["evicted"] == [digest_of(versions[0]).removeprefix("sha256:")]
        cached = sorted(p.name for p in (working_dir / ".mmt-cache" / "datasets").iterdir() if p.is_dir())
        assert cached == sorted(digest_of(v).removeprefix("sha256:") for v in versions[2:])
    finally:
        connection.close()
        import shutil
        shutil.rmtree(working_dir, ignore_errors=True)
