"""A relay cut midway (the archive stream closed, the worker killed) never leaves a complete cache
entry with wrong or missing files, and the next fetch of the version asks only for the files the cache
had not verified yet (dataset_cache.py keeps them in partial/ with its journal `verified.jsonl`)."""
from __future__ import annotations

import json
import re
import threading

from tests.agent_e2e_jobs.conftest import wait_until
from tests.datasets_transfer.conftest import finish, header, manifest_of, tar_of, tree
from tests.datasets_transfer.test_e2e import assert_finished, entry_dir, moved
from tests.datasets_transfer.conftest import checking_job, make_version
from tests.datasets_transfer.forwarders import Forwarder, reset

KIB = 1024
MIB = 1 << 20


def medium_files(count: int, size: int) -> dict[str, bytes]:
    return {f"shard-{i:03d}.bin": bytes([i % 251]) * (size - 1) + bytes([i % 7]) for i in range(count)}


def cut_ensure(cache, files, cut_at: int, **kw) -> dict:
    """ensure as the relay runs it, with the tar stream closed after `cut_at` bytes."""
    proc = cache.start("ensure")
    proc.stdin.write((json.dumps(header(files, **kw)) + "\n").encode())
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline())["state"] == "send"
    out = finish(proc, (json.dumps(manifest_of(files)) + "\n").encode() + tar_of(files)[:cut_at])
    return json.loads(out.decode().splitlines()[-1])


def test_a_cut_tar_leaves_no_complete_entry_and_the_next_fetch_sends_only_the_rest(cache):
    files = medium_files(10, 64 * KIB)
    answer = cut_ensure(cache, files, cut_at=int(4.5 * 65 * KIB), job_id=1)
    assert answer["ok"] is False and answer["code"] == "relay_broken", answer
    entry = cache.entry(files)
    assert not (entry / "complete.json").exists() and not (entry / "data").exists()
    assert not (entry / "users" / "1").exists(), "the cut job does not keep the version pinned"
    journaled = [json.loads(line)["path"] for line in (entry / "verified.jsonl").read_text().splitlines()]
    assert journaled == sorted(files)[:4]

    # A file changed by hand since it was verified is fetched again: it is hashed anew, not trusted.
    changed = entry / "partial" / "shard-001.bin"
    changed.write_bytes(b"x" + changed.read_bytes()[1:])
    proc = cache.start("ensure")
    proc.stdin.write((json.dumps(header(files, job_id=2)) + "\n").encode())
    proc.stdin.flush()
    first = json.loads(proc.stdout.readline())
    assert first == {"state": "send", "have": ["shard-000.bin", "shard-002.bin", "shard-003.bin"]}
    rest = {p: d for p, d in files.items() if p not in first["have"]}
    out = finish(proc, (json.dumps(manifest_of(files)) + "\n").encode() + tar_of(rest))
    answer = json.loads(out.decode().splitlines()[-1])
    assert answer["ok"] and answer["fetched"], answer
    assert answer["received_bytes"] < 8 * 65 * KIB, "only the seven files it lacked came"
    assert tree(entry / "data") == files
    assert not (entry / "verified.jsonl").exists() and not (entry / "partial").exists()


def test_a_fetch_that_saw_wrong_bytes_keeps_nothing(cache):
    files = medium_files(6, 32 * KIB)
    _, answer = cache.ensure(files, corrupt="shard-004.bin")
    assert answer["code"] == "digest_mismatch"
    entry = cache.entry(files)
    assert not (entry / "partial").exists() and not (entry / "verified.jsonl").exists()
    progress, again = cache.ensure(files)
    assert progress == [{"state": "send"}] and again["ok"] and tree(entry / "data") == files


def test_files_kept_from_a_cut_fetch_are_refused_when_they_are_not_the_manifests(cache):
    files = medium_files(4, 16 * KIB)
    assert cut_ensure(cache, files, cut_at=3 * 17 * KIB)["code"] == "relay_broken"
    entry = cache.entry(files)
    journal = entry / "verified.jsonl"
    forged = [dict(json.loads(line), path="elsewhere.bin") for line in journal.read_text().splitlines()[:1]]
    (entry / "partial" / "elsewhere.bin").write_bytes(files["shard-000.bin"])
    journal.write_text("".join(json.dumps(i) + "\n" for i in forged))
    progress, answer = cache.ensure(files)
    assert progress == [{"state": "send", "have": ["elsewhere.bin"]}]
    assert answer["code"] == "partial_changed" and not (entry / "partial").exists()
    _, again = cache.ensure(files)
    assert again["ok"] and tree(entry / "data") == files


class GatePort(Forwarder):
    """Lets `limit` bytes of the archive answer through, then holds the rest until `open()`: a relay
    that stops midway, on demand."""

    def __init__(self, upstream: int, limit: int):
        self.limit, self.gate, self.passed = limit, threading.Event(), 0
        super().__init__(upstream)

    def _connection(self):
        return threading.Event()  # set once the request of this connection asked for an archive

    def _pump(self, source, sink, archive, answers):
        try:
            while data := source.recv(1 << 16):
                if not answers and b"/archive" in data:
                    archive.set()
                if answers and archive.is_set():
                    data = self._admit(sink, data)
                    if data is None:
                        break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            reset(source)
            reset(sink)

    def _admit(self, sink, data: bytes) -> bytes | None:
        """Of a chunk of the archive's answer, sends what fits under the limit and holds the rest at the
        gate; returns what is left to send, or None to end the connection here."""
        if not self.gate.is_set():
            room = max(self.limit - self.passed, 0)
            self.passed += min(room, len(data))
            if room < len(data):
                sink.sendall(data[:room])
                data = data[room:]
                self.gate.wait()
        return data

    def open(self):
        """Lets everything through and resets every connection it carried."""
        self.gate.set()
        self.close()


def test_a_worker_killed_midway_resumes_without_resending_what_the_cache_verified(e2e, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    files = medium_files(40, MIB)
    version = make_version(e2e.world.member, e2e.world.project, "speech", files)
    gate = GatePort(e2e.live_server.thread.port, limit=int(15.5 * MIB))
    journal = entry_dir(e2e, version) / "verified.jsonl"
    try:
        first = e2e.start_worker(url=gate.url)
        job = checking_job(e2e, [version])
        try:
            wait_until(lambda: journal.exists() and len(journal.read_text().splitlines()) >= 10, timeout=120,
                       what="10 files verified in the cache")
        except AssertionError:
            raise AssertionError((gate.passed, e2e.worker_output()[-4000:])) from None
        first.kill()
    finally:
        gate.open()
    entry = entry_dir(e2e, version)
    wait_until(lambda: not (entry / "reserved.json").exists(), timeout=60, what="the cut fetch to end on the target")
    assert not (entry / "complete.json").exists() and not (entry / "data").exists()
    kept = len(journal.read_text().splitlines())
    assert 10 <= kept < len(files)

    e2e.start_worker()
    assert_finished(e2e, job)
    assert tree(entry / "data") == files
    [again] = moved(e2e, version)  # the killed worker never logged its fetch
    lacking = sum(len(d) for p, d in files.items() if p not in sorted(files)[:kept])
    assert lacking <= again < lacking + 2 * MIB, (again, lacking)


class CutPort(GatePort):
    """Lets `limit` bytes of the first archive answer through, then resets that connection: the
    worker's download breaks off inside a member while the SSH side stays up."""

    def __init__(self, upstream: int, limit: int):
        self.cut = False
        super().__init__(upstream, limit)

    def _admit(self, sink, data: bytes) -> bytes | None:
        if self.cut:
            return data
        room = self.limit - self.passed
        self.passed += min(room, len(data))
        if room <= len(data):
            sink.sendall(data[:room])
            self.cut = True
            return None
        return data


def test_an_archive_download_that_breaks_off_resumes_without_sending_anything_twice(e2e, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    files = medium_files(12, MIB)
    version = make_version(e2e.world.member, e2e.world.project, "speech", files)
    port = CutPort(e2e.live_server.thread.port, limit=int(5.3 * MIB))
    try:
        e2e.start_worker(url=port.url)
        assert_finished(e2e, checking_job(e2e, [version]))
    finally:
        port.open()
    assert port.cut
    assert re.search(r"downloading the archive of version \d+ failed \(the download broke off", e2e.worker_output())
    assert tree(entry_dir(e2e, version) / "data") == files
    [sent] = moved(e2e, version)
    total = sum(map(len, files.values()))
    assert total <= sent < total + 64 * KIB, "each byte went over SSH once: the cut member resumed with Range"
