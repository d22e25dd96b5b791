"""worker_agent/dataset_cache.py run as a local process, as the worker runs it on a target: the
relay path (one tar on stdin), the cache layout, read-only entries, one fetch for concurrent jobs,
LRU eviction that skips pinned versions and the size limit. Direct downloads: test_direct.py."""
from __future__ import annotations

import json
import os
import threading
import time

from tests.datasets_transfer.conftest import (digest_of, finish, header, manifest_of, sample_files, sha, tar_of, tree,
                                              writable_bits)

KIB = 1024


def test_relay_delivers_every_file_bit_exact_into_a_read_only_entry(cache):
    files = sample_files(120, 3 * 1024 * KIB)
    progress, answer = cache.ensure(files)
    assert progress == [{"state": "send"}]
    assert answer["ok"] and answer["fetched"] and answer["received_bytes"] > sum(map(len, files.values()))
    entry = cache.entry(files)
    assert tree(entry / "data") == files
    assert json.loads((entry / "files.json").read_text()) == manifest_of(files)
    complete = json.loads((entry / "complete.json").read_text())
    assert complete["digest"] == digest_of(files) and complete["version_id"] == 7
    assert (entry / "last-used").exists() and (entry / "users" / "1").exists()
    assert not (entry / "partial").exists()
    assert writable_bits(entry / "data") == [], "finished entries are read-only (jobs try to write in test_e2e)"


def test_a_second_ensure_moves_no_bytes(cache):
    files = sample_files(30, 0)
    cache.ensure(files, job_id=1)
    before = (cache.entry(files) / "complete.json").stat()
    progress, answer = cache.ensure(files, job_id=2)
    assert progress == [{"state": "have"}]
    assert answer["fetched"] is False and answer["received_bytes"] == 0
    after = (cache.entry(files) / "complete.json").stat()
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)
    assert sorted(os.listdir(cache.entry(files) / "users")) == ["1", "2"]


def test_a_corrupted_byte_fails_and_keeps_nothing(cache):
    files = sample_files(10, 256 * KIB)
    _, answer = cache.ensure(files, corrupt="big/audio.bin")
    assert answer == {"ok": False, "code": "digest_mismatch", "error": answer["error"]}
    assert "big/audio.bin" in answer["error"] and "corrupted in transit" in answer["error"]
    entry = cache.entry(files)
    assert not (entry / "complete.json").exists() and not (entry / "partial").exists()
    assert not (entry / "users" / "1").exists(), "a failed job does not keep the version pinned"
    _, again = cache.ensure(files)  # the next job fetches it cleanly
    assert again["ok"] and tree(entry / "data") == files


def test_a_manifest_that_does_not_match_the_digest_is_refused(cache):
    files = sample_files(5, 0)
    proc = cache.start("ensure")
    proc.stdin.write((json.dumps(header(files)) + "\n").encode())
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline()) == {"state": "send"}
    forged = manifest_of(files)
    forged[0]["size"] += 1
    out = finish(proc, (json.dumps(forged) + "\n").encode())
    answer = json.loads(out.decode().splitlines()[-1])
    assert answer["code"] == "digest_mismatch" and "manifest" in answer["error"]


def test_a_version_larger_than_the_limit_fails_naming_the_limit(cache):
    files = sample_files(3, 2 * 1024 * KIB)
    _, answer = cache.ensure(files, limit=1 << 20)
    assert answer["ok"] is False and answer["code"] == "larger_than_cache"
    assert "dataset cache limit of 1 MiB" in answer["error"] and "Raise the limit" in answer["error"]
    assert not cache.entry(files).exists()


def _versions(count: int, size: int) -> list[dict[str, bytes]]:
    return [{f"v{n}/blob.bin": bytes([n]) * size} for n in range(count)]


def test_eviction_is_least_recently_used_first(cache):
    a, b, c, d = _versions(4, 100 * KIB)
    limit = 300 * KIB + 1
    for job, files in enumerate((a, b, c), start=1):
        assert cache.ensure(files, job_id=job, limit=limit)[1]["ok"]
        cache.job_state(job, "exited")  # each job ended: its pin lapsed
        time.sleep(0.02)
    assert cache.ensure(a, job_id=4, limit=limit)[1]["fetched"] is False  # a is now the most recent
    cache.job_state(4, "exited")
    _, answer = cache.ensure(d, job_id=5, limit=limit)
    assert answer["ok"] and answer["evicted"] == [digest_of(b).removeprefix("sha256:")]
    assert {cache.entry(x).exists() for x in (a, c, d)} == {True} and not cache.entry(b).exists()
    assert answer["usage"]["used_bytes"] == 300 * KIB and answer["usage"]["limit_bytes"] == limit


def test_eviction_skips_versions_pinned_by_queued_or_running_jobs(cache):
    a, b, c = _versions(3, 100 * KIB)
    limit = 200 * KIB + 1
    assert cache.ensure(a, job_id=1, limit=limit)[1]["ok"]  # job 1: supervisor not started yet (a pin)
    time.sleep(0.02)
    assert cache.ensure(b, job_id=2, limit=limit)[1]["ok"]
    cache.job_state(2, "exited")
    _, answer = cache.ensure(c, job_id=3, limit=limit)  # a is older, but pinned by job 1
    assert answer["evicted"] == [digest_of(b).removeprefix("sha256:")]
    cache.job_state(1, "running")
    cache.job_state(3, "running")
    _, full = cache.ensure(b, job_id=4, limit=limit)
    assert full["ok"] is False and full["code"] == "cache_full" and "limit of this computer is 200 KiB" in full["error"]
    assert "jobs hold 200 KiB" in full["error"]
    cache.job_state(1, "canceled")  # a pin lapses when its job is terminal
    _, answer = cache.ensure(b, job_id=5, limit=limit)
    assert answer["ok"] and answer["evicted"] == [digest_of(a).removeprefix("sha256:")]
    assert not (cache.entry(a)).exists()


def test_a_cluster_jobs_pin_holds_while_any_replica_runs_and_lapses_when_all_ended(cache):
    """A cluster job's replicas work in `<jobId>-<replica>`: its pin follows their state.json files."""
    a, b = _versions(2, 100 * KIB)
    limit = 150 * KIB
    assert cache.ensure(a, job_id=7, limit=limit)[1]["ok"]
    cache.job_state("7-main1", "running")
    cache.job_state("7-sub1", "exited")  # one replica ended, main1 still reads its inputs
    cache.job_state(70, "exited")  # another job whose id starts with 7 does not count
    _, full = cache.ensure(b, job_id=8, limit=limit)
    assert full["code"] == "cache_full", full
    assert cache.run("usage")["entries"][0]["pinned_by"] == ["7"]

    cache.job_state("7-main1", "exited")  # every replica ended: the pin lapses at once, not hours later
    _, answer = cache.ensure(b, job_id=8, limit=limit)
    assert answer["ok"] and answer["evicted"] == [digest_of(a).removeprefix("sha256:")]


def test_a_running_job_with_a_similar_id_does_not_hold_anothers_pin(cache):
    a, b = _versions(2, 100 * KIB)
    assert cache.ensure(a, job_id=7, limit=150 * KIB)[1]["ok"]
    cache.job_state(7, "exited")
    cache.job_state(70, "running")
    cache.job_state("77-main1", "running")
    _, answer = cache.ensure(b, job_id=8, limit=150 * KIB)
    assert answer["ok"] and answer["evicted"] == [digest_of(a).removeprefix("sha256:")]


def test_release_drops_a_jobs_pins(cache):
    a, b = _versions(2, 100 * KIB)
    cache.ensure(a, job_id=1, limit=150 * KIB)
    assert cache.ensure(b, job_id=2, limit=150 * KIB)[1]["code"] == "cache_full"
    assert cache.run("release", "1") == {"ok": True}
    assert cache.ensure(b, job_id=2, limit=150 * KIB)[1]["ok"]


def test_usage_lists_entries_with_their_pins(cache):
    a = _versions(1, 10 * KIB)[0]
    cache.ensure(a, job_id=9)
    usage = cache.run("usage")
    assert usage["ok"] and usage["used_bytes"] == 10 * KIB and usage["complete_count"] == 1
    assert usage["entries"][0]["pinned_by"] == ["9"] and usage["entries"][0]["version_id"] == 7


def test_two_jobs_starting_together_fetch_once(cache):
    files = sample_files(20, 512 * KIB)
    first = cache.start("ensure")
    first.stdin.write((json.dumps(header(files, job_id=1)) + "\n").encode())
    first.stdin.flush()
    assert json.loads(first.stdout.readline()) == {"state": "send"}
    second = cache.start("ensure")
    second.stdin.write((json.dumps(header(files, job_id=2)) + "\n").encode())
    second.stdin.flush()
    waiting = {}
    reader = threading.Thread(target=lambda: waiting.update(line=second.stdout.readline()))
    reader.start()
    reader.join(1.0)
    assert reader.is_alive(), "the second job waits while the first fetches"
    out = finish(first, (json.dumps(manifest_of(files)) + "\n").encode() + tar_of(files))
    assert json.loads(out.decode().splitlines()[-1])["fetched"] is True
    reader.join(30)
    assert json.loads(waiting["line"]) == {"state": "have"}
    out = finish(second)
    assert json.loads(out.decode().splitlines()[-1])["received_bytes"] == 0


def test_sha_helper_matches_the_manifest():
    assert sha(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
