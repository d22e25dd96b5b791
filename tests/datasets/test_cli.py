"""`mado-tracking datasets upload` against a real live server: many small files in one archive and one
large file in parts, an interruption in the middle of the large one and the same command resuming where
it stopped, an archive cut midway and resent without what the server verified, a file that changed."""
from __future__ import annotations

import gc
import hashlib
import os
import re
import threading

import pytest
import requests
from click.testing import CliRunner

from datasets.models import DatasetFile, DatasetVersion
from tests.support import wait_for
from tests.datasets_transfer.forwarders import Forwarder, reset
from worker_agent import dataset_transfer, datasets_cli
from worker_agent.researcher import main

pytestmark = pytest.mark.django_db(transaction=True)
main.add_command(datasets_cli.datasets)  # the researcher CLI registers it; repeated here for a clear failure

LARGE = 20 * 2**20 + 12345  # three parts of 8 MiB


@pytest.fixture
def cli(world, live_server, media):
    token = world.token(world.member, ["read", "registry:write"])
    runner = CliRunner()

    def run(*args, token_value=token, url=live_server.url):
        return runner.invoke(main, list(args), env={"MMT_API_URL": url, "MMT_API_TOKEN": token_value,
                                                    "MMT_API_TOKEN_FILE": None})
    yield run
    # A refused request's response keeps its kept-alive socket until collected, and the live server's
    # thread for it holds a database connection until the socket closes: collect, and let the
    # threads end before the test database is dropped.
    gc.collect()
    wait_for(lambda: not any("process_request_thread" in t.name for t in threading.enumerate()), timeout=10,
             what="the live server's request threads to end")


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "corpus"
    for i in range(150):
        path = root / "clips" / f"{i // 50}" / f"clip-{i:03}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"utterance {i}\n".encode())
    (root / "zz-features.bin").write_bytes(os.urandom(LARGE))
    (root / "empty.txt").write_bytes(b"")
    return root


class Sent(list):
    state: dict


@pytest.fixture
def puts(monkeypatch):
    """Every PUT the CLI sends: ("archive", Content-Length) or (path, Content-Range). `fail_from` makes
    parts at or beyond that offset of the large file fail as if the network went down; `change` rewrites
    a file (same size, other bytes) just before the first archive goes, as if it changed during the
    upload."""
    sent, original = Sent(), requests.Session.put
    state = {"fail_from": None, "change": None}

    def put(self, url, data=None, headers=None, **kwargs):
        if url.endswith("/archive"):
            if state["change"] is not None:
                path, state["change"] = state["change"], None
                path.write_bytes(bytes([path.read_bytes()[0] ^ 1]) + path.read_bytes()[1:])
            sent.append(("archive", len(data)))
            return original(self, url, data=data, headers=headers, **kwargs)
        content_range = (headers or {}).get("Content-Range", "")
        path = url.split("/files/", 1)[1]
        start = int(content_range.split()[1].split("-")[0]) if content_range else 0
        if state["fail_from"] is not None and path == "zz-features.bin" and start >= state["fail_from"]:
            raise requests.ConnectionError("connection reset by peer")
        sent.append((path, content_range))
        return original(self, url, data=data, headers=headers, **kwargs)

    monkeypatch.setattr(requests.Session, "put", put)
    monkeypatch.setattr(datasets_cli, "RETRY_DELAYS", (0, 0))
    sent.state = state
    return sent


def small_archive_length(tree, paths) -> int:
    """The exact tar the CLI sends for `paths` (headers, data, padding, end blocks)."""
    total = 1024
    for path in paths:
        size = (tree / path).stat().st_size
        total += len(dataset_transfer.tar_header(path, size)) + size + (-size % 512)
    return total


def test_upload_is_interrupted_then_the_same_command_resumes(world, cli, tree, puts):
    puts.state["fail_from"] = datasets_cli.PART
    first = cli("datasets", "upload", "speech-features", str(tree), "--description", "MFCCs")
    assert first.exit_code == 1, first.output
    assert "Run the same command again to resume" in first.stderr and "mmt_" not in first.output
    assert "Created dataset speech-features" in first.stderr and "Uploading" in first.stderr
    assert re.search(r"\d+\.\d MB/s", first.stderr), "the progress bar shows the rate"
    small = sorted(p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file() and p.name != "zz-features.bin")
    assert puts[0] == ("archive", small_archive_length(tree, small)), "151 small files in ONE request"
    assert [p for p, _ in puts[1:]] == ["zz-features.bin"], "then the large file in parts"
    version = DatasetVersion.objects.get()
    assert version.status == "uploading" and version.dataset.description == "MFCCs"
    assert DatasetFile.objects.get(size=LARGE).received_bytes == datasets_cli.PART
    assert DatasetFile.objects.filter(complete=True).count() == 151

    puts.state["fail_from"] = None
    puts.clear()
    second = cli("datasets", "upload", "speech-features", str(tree))
    assert second.exit_code == 0, second.output
    assert second.stdout.strip() == str(version.pk), "stdout is the version id alone"
    assert puts == [("zz-features.bin", f"bytes {datasets_cli.PART}-{2 * datasets_cli.PART - 1}/{LARGE}"),
                    ("zz-features.bin", f"bytes {2 * datasets_cli.PART}-{LARGE - 1}/{LARGE}")], \
        "only the rest of the large file is sent again"
    version.refresh_from_db()
    assert (version.status, version.number, version.file_count) == ("complete", 1, 152)
    assert version.total_size == LARGE + sum(len(f"utterance {i}\n") for i in range(150))
    for item in version.manifest():
        stored = DatasetFile.objects.get(sha256=item["sha256"])
        assert hashlib.sha256(open(stored.file.path, "rb").read()).hexdigest() == item["sha256"], item["path"]
        assert hashlib.sha256((tree / item["path"]).read_bytes()).hexdigest() == item["sha256"]
    assert "clips/1/clip-075.txt" in {e["path"] for e in version.manifest()}

    puts.clear()
    again = cli("datasets", "upload", "SPEECH-features", str(tree))
    assert again.exit_code == 0 and again.stdout.strip() == str(version.pk) and puts == []
    assert "already holds exactly these files" in again.stderr


class CutUpload(Forwarder):
    """Resets the connection of the first archive upload once `limit` bytes of its request went
    through: the CLI's stream breaks off midway, after the server verified some of its files."""

    def __init__(self, upstream: int, limit: int):
        self.limit, self.cut, self.passed = limit, threading.Event(), 0
        super().__init__(upstream)

    def _connection(self):
        return {"archive": False}

    def _pump(self, source, sink, shared, answers):
        try:
            while data := source.recv(1 << 16):
                if not answers and b"/archive HTTP/1.1" in data:
                    shared["archive"] = not self.cut.is_set()
                if not answers and shared["archive"]:
                    room = self.limit - self.passed
                    self.passed += len(data)
                    if room <= len(data):
                        sink.sendall(data[:room])
                        self.cut.set()
                        break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            reset(source)
            reset(sink)


def test_an_archive_cut_midway_resends_only_what_the_server_had_not_verified(world, cli, tmp_path, puts, live_server):
    corpus = tmp_path / "shards"
    corpus.mkdir()
    files = {f"shard-{i:03}.bin": os.urandom(200 * 1024) for i in range(40)}  # 40 x 200 KiB: all in archives
    for name, data in files.items():
        (corpus / name).write_bytes(data)
    port = CutUpload(live_server.thread.port, limit=int(4.5 * 1024 * 1024))
    try:
        result = cli("datasets", "upload", "shards", str(corpus), url=port.url)
    finally:
        port.close()
    assert result.exit_code == 0, result.output
    assert port.cut.is_set() and "asking the server what it still needs" in result.stderr
    [first, second] = [length for kind, length in puts if kind == "archive"]
    assert first == small_archive_length(corpus, sorted(files))
    verified = first - second  # what the second archive left out: whole files the server had verified
    member = 512 + 200 * 1024
    assert verified % member == 0 and 1 <= verified // member < 4.5 * 1024 * 1024 / member, (first, second)
    version = DatasetVersion.objects.get()
    assert version.status == "complete" and version.file_count == 40
    for item in version.manifest():
        stored = DatasetFile.objects.get(sha256=item["sha256"])
        assert open(stored.file.path, "rb").read() == files[item["path"]]


def test_a_changed_file_makes_version_two_with_one_upload(cli, tree, puts):
    assert cli("datasets", "upload", "corpus", str(tree)).exit_code == 0
    (tree / "clips" / "0" / "clip-001.txt").write_bytes(b"corrected\n")
    puts.clear()
    result = cli("datasets", "upload", "corpus", str(tree))
    assert result.exit_code == 0, result.output
    assert puts == [("archive", small_archive_length(tree, ["clips/0/clip-001.txt"]))]
    assert "Uploaded corpus v2: 152 files" in result.stderr


def test_a_file_that_changes_during_the_upload_is_named(cli, tree, puts):
    puts.state["change"] = tree / "clips" / "1" / "clip-060.txt"
    result = cli("datasets", "upload", "corpus", str(tree))
    assert result.exit_code == 1
    assert "clips/1/clip-060.txt" in result.stderr and "do not match its sha256" in result.stderr
    assert "upload again" in result.stderr
    assert DatasetFile.objects.filter(complete=True).count() == 60, "the files before it stay on the server"
    again = cli("datasets", "upload", "corpus", str(tree))
    assert again.exit_code == 0, again.output


def test_errors_say_what_to_do_and_exit_non_zero(world, cli, tmp_path):
    (tmp_path / "nothing").mkdir()
    empty = cli("datasets", "upload", "speech", str(tmp_path / "nothing"))
    assert empty.exit_code == 1 and "holds no files" in empty.stderr
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("a")
    bad_name = cli("datasets", "upload", "has space", str(tmp_path / "data"))
    assert bad_name.exit_code == 1 and "letters, digits" in bad_name.stderr
    read_only = cli("datasets", "upload", "speech", str(tmp_path / "data"),
                    token_value=world.token(world.member, ["read"]))
    assert read_only.exit_code == 1 and "registry:write" in read_only.stderr
    missing = cli("datasets", "upload", "speech", str(tmp_path / "absent"))
    assert missing.exit_code == 2 and "does not exist" in missing.stderr
