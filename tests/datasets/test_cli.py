"""`mado-tracking datasets upload` against a real live server: many small files and one large one,
an interruption in the middle of the large one, and the same command resuming where it stopped."""
from __future__ import annotations

import gc
import hashlib
import os
import threading

import pytest
import requests
from click.testing import CliRunner

from datasets.models import DatasetFile, DatasetVersion
from tests.support import wait_for
from worker_agent import datasets_cli
from worker_agent.researcher import main

pytestmark = pytest.mark.django_db(transaction=True)
main.add_command(datasets_cli.datasets)  # the researcher CLI registers it; repeated here for a clear failure

LARGE = 20 * 2**20 + 12345  # three parts of 8 MiB


@pytest.fixture
def cli(world, live_server, media):
    token = world.token(world.member, ["read", "registry:write"])
    runner = CliRunner()

    def run(*args, token_value=token):
        return runner.invoke(main, list(args), env={"MMT_API_URL": live_server.url, "MMT_API_TOKEN": token_value,
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
    """Every PUT the CLI sends, as (path, Content-Range); `fail_from` makes PUTs at or beyond that
    offset of the large file fail as if the network went down."""
    sent, original = Sent(), requests.Session.put
    state = {"fail_from": None}

    def put(self, url, data=None, headers=None, **kwargs):
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


def test_upload_is_interrupted_then_the_same_command_resumes(world, cli, tree, puts):
    puts.state["fail_from"] = datasets_cli.PART
    first = cli("datasets", "upload", "speech-features", str(tree), "--description", "MFCCs")
    assert first.exit_code == 1, first.output
    assert "Run the same command again to resume" in first.stderr and "mmt_" not in first.output
    assert "Created dataset speech-features" in first.stderr and "Uploading" in first.stderr
    version = DatasetVersion.objects.get()
    assert version.status == "uploading" and version.dataset.description == "MFCCs"
    assert DatasetFile.objects.get(size=LARGE).received_bytes == datasets_cli.PART

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
    stored = DatasetFile.objects.get(size=LARGE)
    assert hashlib.sha256(open(stored.file.path, "rb").read()).digest() == \
        hashlib.sha256((tree / "zz-features.bin").read_bytes()).digest()
    assert "clips/1/clip-075.txt" in {e["path"] for e in version.manifest()}

    puts.clear()
    again = cli("datasets", "upload", "SPEECH-features", str(tree))
    assert again.exit_code == 0 and again.stdout.strip() == str(version.pk) and puts == []
    assert "already holds exactly these files" in again.stderr


def test_a_changed_file_makes_version_two_with_one_upload(cli, tree, puts):
    assert cli("datasets", "upload", "corpus", str(tree)).exit_code == 0
    (tree / "clips" / "0" / "clip-001.txt").write_bytes(b"corrected\n")
    puts.clear()
    result = cli("datasets", "upload", "corpus", str(tree))
    assert result.exit_code == 0, result.output
    assert puts == [("clips/0/clip-001.txt", "bytes 0-9/10")]
    assert "Uploaded corpus v2: 152 files" in result.stderr


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
