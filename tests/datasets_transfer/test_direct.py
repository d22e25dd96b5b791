"""Direct transfer: the computer downloads a version itself with the job token, as ONE tar from the project
API's archive endpoint (GET for the whole version, POST {files} for what its cache lacks), every file
checked against the manifest's sha256 before it is journaled. Against the Django live server on
PostgreSQL, through TCP forwarders that cut, hold, refuse or corrupt its answers: the cache program run as
a local process (as the worker runs it on a target), and once end to end with a real worker and sshd."""
from __future__ import annotations

import json
import re
import socket
import threading
import uuid

import pytest

from mado import services as identity
from tests.agent_e2e_jobs.conftest import wait_until
from tests.datasets_transfer.conftest import checking_job, header, make_version, sample_files, tree
from tests.datasets_transfer.forwarders import Forwarder, reset
from tests.datasets_transfer.test_e2e import CorruptingPort, assert_finished, entry_dir, moved
from tests.datasets_transfer.test_resume import medium_files

KIB = 1024
MIB = 1 << 20


class Port(Forwarder):
    """Passes the target's requests to the live server and records them; the answers to archive
    requests can be cut after `cut_at` bytes (the first one only), held after `hold_at` bytes until
    `open()`, or replaced by `unavailable` answers 503."""

    def __init__(self, upstream: int, *, cut_at: int | None = None, hold_at: int | None = None, unavailable: int = 0):
        self.cut_at, self.hold_at, self.unavailable = cut_at, hold_at, unavailable
        self.gate, self.passed, self.cut = threading.Event(), 0, False
        self.sent: list[bytearray] = []  # what the target sent, per connection
        super().__init__(upstream)

    def _connection(self):
        shared = {"archive": False, "sent": bytearray()}
        self.sent.append(shared["sent"])
        return shared

    def requests(self) -> list[tuple[str, str, list[str] | None]]:
        """(method, path, files of a POST body) of every request the target sent, in order."""
        found = []
        for data in self.sent:
            text = bytes(data).decode("utf-8", "replace")
            for match in re.finditer(r"(GET|POST) (\S+) HTTP/1\.1\r\n(.*?)\r\n\r\n", text, re.S):
                files = None
                if match.group(1) == "POST":
                    length = int(re.search(r"Content-Length: (\d+)", match.group(3), re.I).group(1))
                    files = json.loads(text[match.end():match.end() + length])["files"]
                found.append((match.group(1), match.group(2), files))
        return found

    def _pump(self, source, sink, shared, answers):
        broken = True
        try:
            while data := source.recv(1 << 16):
                if not answers:
                    shared["sent"] += data
                    if b"/archive HTTP/1.1" in data:
                        shared["archive"] = True
                        if self.unavailable:
                            self.unavailable -= 1
                            source.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n"
                                           b"Connection: close\r\n\r\n{}")
                            break
                elif shared["archive"]:
                    data = self._admit(sink, data)
                    if data is None:
                        break
                sink.sendall(data)
            else:
                broken = False
        except OSError:
            pass
        finally:
            if broken:
                reset(source)
                reset(sink)
            else:  # an answer that ended: the reader still takes what is in its buffer (a reset would drop it)
                try:
                    sink.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

    def _admit(self, sink, data: bytes) -> bytes | None:
        limit = self.cut_at if self.cut_at is not None and not self.cut else self.hold_at
        if limit is None or self.gate.is_set():
            return data
        room = max(limit - self.passed, 0)
        self.passed += min(room, len(data))
        if room >= len(data):
            return data
        sink.sendall(data[:room])
        if self.cut_at is not None and not self.cut:
            self.cut = True
            return None
        self.gate.wait()
        return data[room:]

    def open(self):
        self.gate.set()
        self.close()


@pytest.fixture
def served(transactional_db, live_server, world, settings, tmp_path):
    """A version on the live server and a job token of its project (the job's own token in real runs)."""
    settings.MEDIA_ROOT = tmp_path / "media"

    def make(files: dict[str, bytes]):
        version = make_version(world.member, world.project, "speech", files)
        _, token = identity.issue_job_token(job_id=1, lease_id=uuid.uuid4(), project=world.project, user=world.member)
        return version, token

    return make


def direct(cache, port, version, token, files, **kw):
    base = f"/api/projects/lab/datasets/{version.dataset_id}/versions/{version.pk}"
    return cache.ensure(files, mode="direct", api_url=port.url, token=token, version_id=version.pk,
                        manifest_url=base + "/manifest", files_url=base + "/files/", archive_url=base + "/archive",
                        **kw)


def test_one_archive_request_brings_the_whole_version_bit_exact(cache, served, live_server):
    files = sample_files(300, 3 * MIB)
    version, token = served(files)
    port = Port(live_server.thread.port)
    try:
        progress, answer = direct(cache, port, version, token, files)
    finally:
        port.close()
    assert progress == [{"state": "fetching"}] and answer["ok"], answer
    assert answer["received_bytes"] == sum(map(len, files.values()))
    assert tree(cache.entry(files) / "data") == files
    assert [(m, p.split("?")[0].rsplit("/", 1)[-1]) for m, p, _ in port.requests()] == [
        ("GET", "manifest"), ("GET", "archive")], "302 files, two requests"


def cut_files() -> dict[str, bytes]:
    """A large first member (the cut lands inside it: the reader loses at most its read-ahead, 1 MiB
    blocks) and medium ones after it."""
    return {"a-large.bin": bytes(range(256)) * (12 * MIB // 256), **medium_files(8, MIB)}


def test_a_cut_archive_resumes_the_member_with_range_and_asks_only_for_the_rest(cache, served, live_server):
    files = cut_files()
    version, token = served(files)
    port = Port(live_server.thread.port, cut_at=6 * MIB)
    try:
        progress, answer = direct(cache, port, version, token, files)
    finally:
        port.close()
    assert port.cut and answer["ok"], answer
    assert [p["delay"] for p in progress if p["state"] == "retrying"] == [2.0], (progress, port.requests())
    assert tree(cache.entry(files) / "data") == files
    assert answer["received_bytes"] == sum(map(len, files.values())), "no byte fetched twice"
    requests = port.requests()
    assert [m for m, _, _ in requests] == ["GET", "GET", "GET", "POST"], requests
    assert requests[2][1].endswith("/files/a-large.bin"), "the member it broke in"
    assert re.search(rb"Range: bytes=[1-9]\d*-", bytes(port.sent[2])), "with Range (urllib: a connection a request)"
    assert requests[3][2] == sorted(files)[1:], "then one archive of the files still to fetch"


def test_a_killed_fetch_keeps_what_it_verified_and_the_next_asks_only_for_the_rest(cache, served, live_server):
    files = medium_files(30, MIB)
    version, token = served(files)
    port = Port(live_server.thread.port, hold_at=int(12.5 * MIB))
    base = f"/api/projects/lab/datasets/{version.dataset_id}/versions/{version.pk}"
    journal = cache.entry(files) / "verified.jsonl"
    proc = cache.start("ensure")
    try:
        proc.stdin.write((json.dumps(header(files, mode="direct", api_url=port.url, token=token, version_id=version.pk,
                                            manifest_url=base + "/manifest", files_url=base + "/files/",
                                            archive_url=base + "/archive")) + "\n").encode())
        proc.stdin.flush()
        wait_until(lambda: journal.exists() and len(journal.read_text().splitlines()) >= 10, timeout=120,
                   what="10 files verified in the cache")
        proc.kill()
        proc.wait(timeout=30)
    finally:
        port.open()
    entry = cache.entry(files)
    assert not (entry / "complete.json").exists() and not (entry / "data").exists()
    kept = [json.loads(line)["path"] for line in journal.read_text().splitlines()]
    assert 10 <= len(kept) < len(files) and kept == sorted(files)[:len(kept)]

    again = Port(live_server.thread.port)
    try:
        progress, answer = direct(cache, again, version, token, files, job_id=2)
    finally:
        again.close()
    assert progress == [{"state": "fetching", "have": len(kept)}] and answer["ok"], answer
    assert tree(entry / "data") == files
    assert answer["received_bytes"] == sum(len(d) for p, d in files.items() if p not in kept)
    assert again.requests()[-1][2] == [p for p in sorted(files) if p not in kept]


def test_server_errors_are_retried_after_2_s_and_4_s_then_the_fetch_fails(cache, served, live_server):
    files = medium_files(3, 64 * KIB)
    version, token = served(files)
    port = Port(live_server.thread.port, unavailable=3)
    try:
        progress, answer = direct(cache, port, version, token, files)
    finally:
        port.close()
    assert [p["delay"] for p in progress if p["state"] == "retrying"] == [2.0, 4.0]
    assert answer["code"] == "download_failed" and "3 times" in answer["error"], answer
    assert not (cache.entry(files) / "complete.json").exists()


def test_missing_bytes_a_refused_token_and_corrupted_bytes_fail_at_once(cache, served, live_server, settings):
    files = dict(medium_files(4, 64 * KIB), **{"needle.bin": b"\x5a" * 3 + b"corrupt me" * 4096})
    version, token = served(files)
    port = Port(live_server.thread.port)
    try:
        identity.revoke_job_tokens(1)
        progress, refused = direct(cache, port, version, token, files)
        assert refused["code"] == "not_allowed" and "401" in refused["error"], refused
        assert "job has ended" in refused["error"] and not [p for p in progress if p["state"] == "retrying"]

        _, token = identity.issue_job_token(job_id=2, lease_id=uuid.uuid4(), project=version.dataset.project,
                                            user=version.created_by)
        stored = version.entries.select_related("file").get(path="shard-002.bin").file.file.name
        (settings.MEDIA_ROOT / stored).rename(settings.MEDIA_ROOT / (stored + ".away"))
        progress, gone = direct(cache, port, version, token, files, job_id=2)
        assert gone["code"] == "not_found" and "shard-002.bin" in gone["error"], gone
        assert not [p for p in progress if p["state"] == "retrying"], "no retries for what a retry cannot fix"
        (settings.MEDIA_ROOT / (stored + ".away")).rename(settings.MEDIA_ROOT / stored)
    finally:
        port.close()

    corrupting = CorruptingPort(live_server.thread.port, b"corrupt me")
    try:
        _, corrupt = direct(cache, corrupting, version, token, files, job_id=3)
    finally:
        corrupting.close()
    assert corrupting.done and corrupt["code"] == "digest_mismatch" and "needle.bin" in corrupt["error"], corrupt
    entry = cache.entry(files)
    assert not (entry / "complete.json").exists() and not (entry / "partial").exists()
    assert not (entry / "verified.jsonl").exists(), "a fetch that saw wrong bytes keeps nothing"


def test_a_direct_download_cut_midway_resumes_end_to_end(e2e, settings, tmp_path):
    """A real worker and sshd: the target's archive download breaks off inside a member; the target
    finishes that file with Range and fetches the rest, and the job reads every file bit-exact."""
    settings.MEDIA_ROOT = tmp_path / "media"
    files = cut_files()
    version = make_version(e2e.world.member, e2e.world.project, "speech", files)
    port = Port(e2e.live_server.thread.port, cut_at=6 * MIB)
    settings.PUBLIC_URL = port.url  # the target reaches the API through the port
    e2e.computer.dataset_transfer = "direct"
    e2e.computer.save()
    try:
        e2e.start_worker()
        assert_finished(e2e, checking_job(e2e, [version]))
    finally:
        port.open()
    assert port.cut
    assert re.search(r"the computer's download of the archive of input dataset version \d+ failed", e2e.worker_output())
    assert tree(entry_dir(e2e, version) / "data") == files
    assert moved(e2e, version) == [sum(map(len, files.values()))], "each byte came once"
    assert [m for m, path, _ in port.requests() if "/datasets/" in path] == ["GET", "GET", "GET", "POST"]
