"""`mado-tracking datasets download NAME DIR` against a real live server: the version arrives as one tar
stream, every file checked against its sha256; files already there with the right bytes are kept, so a run
after an interruption (the stream cut midway) or after files were lost or changed fetches only the rest, and
never leaves a half-written file."""
from __future__ import annotations

import pytest
import requests

from tests.datasets.test_cli import LARGE, cli, tree  # noqa: F401  (fixtures)
from tests.datasets_transfer.test_resume import CutPort

pytestmark = pytest.mark.django_db(transaction=True)


def files_of(root) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def uploaded(cli, tree):  # noqa: F811
    done = cli("datasets", "upload", "speech", str(tree))
    assert done.exit_code == 0, done.output
    return tree


@pytest.fixture
def asked(monkeypatch):
    """The `files` of every archive POST the CLI sends (a GET asks for the whole version: None)."""
    seen, get, post = [], requests.Session.get, requests.Session.post

    def on_get(self, url, **kwargs):
        if url.endswith("/archive"):
            seen.append(None)
        return get(self, url, **kwargs)

    def on_post(self, url, **kwargs):
        if url.endswith("/archive"):
            seen.append(sorted(kwargs["json"]["files"]))
        return post(self, url, **kwargs)

    monkeypatch.setattr(requests.Session, "get", on_get)
    monkeypatch.setattr(requests.Session, "post", on_post)
    return seen


def test_a_version_downloads_bit_exact_and_a_second_run_fetches_only_what_is_missing_or_wrong(
        cli, uploaded, tmp_path, asked):  # noqa: F811
    out = tmp_path / "out"
    first = cli("datasets", "download", "speech", str(out))
    assert first.exit_code == 0, first.output
    assert files_of(out) == files_of(uploaded) and asked == [None], "the whole version in one GET"
    assert first.stdout.strip() == str(out) and "Downloading" in first.stderr
    assert "152 files" in first.stderr and "(0 already there)" in first.stderr

    (out / "clips" / "0" / "clip-007.txt").unlink()
    changed = out / "clips" / "2" / "clip-120.txt"
    changed.write_bytes(b"X" + changed.read_bytes()[1:])  # same size, other bytes
    again = cli("datasets", "download", "speech", str(out), "--version", "1")
    assert again.exit_code == 0, again.output
    assert asked[1:] == [["clips/0/clip-007.txt", "clips/2/clip-120.txt"]], "only the lost and the changed file"
    assert files_of(out) == files_of(uploaded) and "(150 already there)" in again.stderr


def test_a_download_cut_midway_keeps_the_checked_files_and_the_next_run_fetches_the_rest(
        cli, uploaded, tmp_path, live_server, asked):  # noqa: F811
    out = tmp_path / "out"
    port = CutPort(live_server.thread.port, limit=LARGE // 2)  # inside the large file, after the small ones
    try:
        cut = cli("datasets", "download", "speech", str(out), url=port.url)
    finally:
        port.open()
    assert cut.exit_code == 1 and port.cut, cut.output
    assert "The download broke off after 151 of 152 files" in cut.stderr and "Run the same command again" in cut.stderr
    assert not list(out.rglob("*.part")) and not (out / "zz-features.bin").exists(), "nothing half-written"
    assert len(files_of(out)) == 151

    rest = cli("datasets", "download", "speech", str(out))
    assert rest.exit_code == 0, rest.output
    assert asked == [None, ["zz-features.bin"]] and files_of(out) == files_of(uploaded)


def test_errors_say_what_to_do_and_exit_non_zero(cli, uploaded, tmp_path):  # noqa: F811
    no_version = cli("datasets", "download", "speech", str(tmp_path / "x"), "--version", "9")
    assert no_version.exit_code == 1
    assert "Dataset speech has no version 9 (complete: 1). Choose one with --version." in no_version.stderr
    no_dataset = cli("datasets", "download", "nothing-here", str(tmp_path / "x"))
    assert no_dataset.exit_code == 1 and "No dataset nothing-here" in no_dataset.stderr
