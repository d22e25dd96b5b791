"""worker_agent.core: the job-lifecycle pieces the worker and the site runner share (the source put in
place, the outputs read, a job's end, the resumable upload, tokens masked), checked on their own."""
from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from worker_agent import remote_files
from worker_agent.core import lifecycle
from worker_agent.core.api import ApiError, Unavailable
from worker_agent.core.outputs import file_sha256, read_outputs
from worker_agent.core.source import SourceError, clone_source, unpack_source
from worker_agent.core.tokens import mask_tokens
from worker_agent.site import spec

ROOT = Path(__file__).resolve().parents[2]


def tar_gz(*members) -> io.BytesIO:
    """A .tar.gz of (TarInfo, bytes | None) members."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as archive:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    raw.seek(0)
    return raw


def member(name: str, kind=tarfile.REGTYPE, *, mode=0o644, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = kind, mode, link
    return info


# -- the source ------------------------------------------------------------------------------------

def test_an_archive_is_unpacked_with_its_files_directories_and_executable_bits(tmp_path):
    archive = tar_gz((member("./pkg", tarfile.DIRTYPE, mode=0o755), None),
                     (member("./pkg/train.py"), b"print('hi')\n"),
                     (member("run.sh", mode=0o755), b"#!/bin/sh\n"))
    assert unpack_source(archive, str(tmp_path)) == 2
    source = tmp_path / "source"
    assert (source / "pkg/train.py").read_bytes() == b"print('hi')\n"
    assert os.access(source / "run.sh", os.X_OK) and not os.access(source / "pkg/train.py", os.X_OK)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source"]  # no half-unpacked leftovers


@pytest.mark.parametrize("bad", [
    (member("../escaped.txt"), b"x"),
    (member("pkg/../../escaped.txt"), b"x"),
    (member("/tmp/escaped.txt"), b"x"),
    (member("link", tarfile.SYMTYPE, link="../../.."), None),
    (member("inside-link", tarfile.SYMTYPE, link="pkg"), None),
    (member("hard", tarfile.LNKTYPE, link="/etc/passwd"), None),
    (member("fifo", tarfile.FIFOTYPE), None),
], ids=["dotdot", "nested-dotdot", "absolute", "symlink-out", "symlink-in", "hardlink", "fifo"])
def test_an_archive_with_a_path_or_link_leaving_the_folder_is_refused_and_nothing_stays(tmp_path, bad):
    job_dir = tmp_path / "jobs" / "7"
    job_dir.mkdir(parents=True)
    archive = tar_gz((member("ok.txt"), b"fine"), bad, (member("after.txt"), b"never written"))
    with pytest.raises(SourceError) as refused:
        unpack_source(archive, str(job_dir))
    assert refused.value.code == "source_unsafe" and repr(bad[0].name.rstrip("/")) in str(refused.value)
    assert list(job_dir.iterdir()) == []  # neither source/ nor the temporary folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs"]  # nothing written beside it


def test_a_member_written_twice_is_refused_rather_than_overwritten(tmp_path):
    """A file is created only where nothing is (O_EXCL, O_NOFOLLOW): a second member of the same name fails."""
    archive = tar_gz((member("a.txt"), b"one"), (member("a.txt"), b"two"))
    with pytest.raises(FileExistsError):
        unpack_source(archive, str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_a_git_source_is_cloned_at_its_ref_and_a_bad_ref_leaves_nothing(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    (repo / "train.py").write_text("v1")
    for argv in (["init", "-q"], ["add", "train.py"], ["commit", "-q", "-m", "one"], ["tag", "v1"]):
        subprocess.run(git + argv, check=True, capture_output=True)
    (repo / "train.py").write_text("v2")
    subprocess.run(git + ["commit", "-q", "-am", "two"], check=True, capture_output=True)
    (tmp_path / "a").mkdir()
    clone_source(str(repo), "v1", str(tmp_path / "a"), "here", 60)
    assert (tmp_path / "a/source/train.py").read_text() == "v1"
    (tmp_path / "b").mkdir()
    with pytest.raises(SourceError, match="git -C failed") as failed:
        clone_source(str(repo), "no-such-ref", str(tmp_path / "b"), "here", 60)
    assert failed.value.code == "git_failed" and list((tmp_path / "b").iterdir()) == []


def run_program(program, *args: str, stdin: bytes = b"") -> dict:
    """One of the worker's programs with the flags a target runs it with (worker_agent.core.ship), its
    last line JSON."""
    ran = subprocess.run([sys.executable, "-I", "-S", "-c", program.source, *args], input=stdin, capture_output=True,
                         timeout=60)
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout.decode().splitlines()[-1])


def test_the_workers_program_on_a_target_unpacks_with_the_same_checks(tmp_path):
    job_dir = str(tmp_path / ".mmt/jobs/7")
    bad = tar_gz((member("ok.txt"), b"fine"), (member("../../../../escaped.txt"), b"x")).read()
    assert run_program(remote_files.FILES, "source", job_dir, "archive", stdin=bad) == {
        "ok": False, "code": "source_unsafe",
        "error": "The source archive holds the unsafe path '../../../../escaped.txt'; upload it again without it."}
    assert os.listdir(job_dir) == [] and not (tmp_path / "escaped.txt").exists()
    good = tar_gz((member("train.py"), b"print(1)\n")).read()
    assert run_program(remote_files.FILES, "source", job_dir, "archive", stdin=good) == {
        "ok": True, "existing": False, "files": 1}
    assert run_program(remote_files.FILES, "source", job_dir, "archive", stdin=good) == {"ok": True, "existing": True}
    assert (tmp_path / ".mmt/jobs/7/source/train.py").read_bytes() == b"print(1)\n"


# -- the outputs ----------------------------------------------------------------------------------

def test_the_outputs_are_listed_with_result_json_and_the_manifest_it_names(tmp_path):
    out = tmp_path / "outputs"
    (out / "model").mkdir(parents=True)
    (out / "model/w.bin").write_bytes(b"w" * 10)
    (out / "files.jsonl").write_text('{"path": "model/w.bin"}\n')
    (out / "result.json").write_text('{"version": 2, "complete": true, "artifactsManifest": "files.jsonl"}')
    (out / "elsewhere").symlink_to("/etc")
    listing = read_outputs(str(out), 100)
    kinds = {f["path"]: f["kind"] for f in listing["files"]}
    assert kinds == {"model": "dir", "model/w.bin": "file", "files.jsonl": "file", "result.json": "file",
                     "elsewhere": "symlink"}
    assert listing["manifest"] == b'{"path": "model/w.bin"}\n' and listing["result"].startswith(b'{"version": 2')
    assert not listing["too_many"]
    assert read_outputs(str(tmp_path / "none"), 100)["files"] == []
    remote = run_program(remote_files.FILES, "list", str(out), "100")  # the worker's program on a target
    assert remote["files"] == listing["files"] and base64.b64decode(remote["manifest"]) == listing["manifest"]
    with pytest.raises(ValueError, match="symbolic link"):
        read_outputs(str(out / "elsewhere"), 100)


# -- the end of a job -----------------------------------------------------------------------------

def conclude(final: dict) -> dict:
    return lifecycle.conclude(final, lambda: {"status": "finished", "exit_code": 0}, walltime=60,
                              subject="The job", lost=lambda f: f"lost ({f.get('status')})")


def test_the_supervisors_end_becomes_the_completion():
    assert conclude({"status": "exited", "exit_code": 0}) == {"status": "finished", "exit_code": 0}
    assert conclude({"status": "exited", "exit_code": 3}) == {"status": "failed", "exit_code": 3,
                                                               "end_reason": "exit_code"}
    assert conclude({"status": "exited", "signal": 9})["error"] == "The job was killed by SIGKILL."
    assert conclude({"status": "canceled"}) == {"status": "canceled", "end_reason": "canceled"}
    assert conclude({"status": "timed_out"})["error"] == "The walltime of 60 s was reached; the job was stopped."
    assert conclude({"status": "failed_to_start", "error": "no venv"})["error"] == "no venv"
    assert conclude({"status": "unknown"}) == {"status": "failed", "end_reason": "worker_lost",
                                               "error": "lost (unknown)"}


def outputs_dir(tmp_path: Path, result: str) -> dict:
    out = tmp_path / "outputs"
    out.mkdir()
    (out / "a.bin").write_bytes(b"a" * 5)
    (out / "b.bin").write_bytes(b"b" * 7)
    (out / "result.json").write_text(result)
    return read_outputs(str(out), 100)


def artifact(tmp_path: Path, name: str) -> str:
    path = tmp_path / "outputs" / name
    return f'{{"path": "{name}", "size": {path.stat().st_size}, "sha256": "{file_sha256(str(path))}"}}'


def test_valid_outputs_are_declared_and_only_the_files_the_server_asks_for_uploaded(tmp_path):
    (tmp_path / "outputs").mkdir()
    for name, size in (("a.bin", 5), ("b.bin", 7)):
        (tmp_path / "outputs" / name).write_bytes(b"x" * size)
    result = f'{{"version": 1, "complete": true, "artifacts": [{artifact(tmp_path, "a.bin")}, ' \
             f'{artifact(tmp_path, "b.bin")}]}}'
    (tmp_path / "outputs/result.json").write_text(result)
    declared, uploaded = [], []

    def declare(text, files, manifest):
        declared.append((text, sorted(f["path"] for f in files), manifest))
        return {"upload": ["b.bin", "not-declared.bin"]}

    completion = lifecycle.send_outputs(read_outputs(str(tmp_path / "outputs"), 100), max_files=100,
                                        limit_setting=None, declare=declare, note=lambda text, level: None,
                                        upload=lambda *args: uploaded.append(args))
    assert completion == {"status": "finished", "exit_code": 0}
    assert declared == [(result, ["a.bin", "b.bin", "result.json"], None)]
    assert uploaded == [("b.bin", 7, 1, 1)]


def test_an_invalid_result_or_a_refused_declaration_ends_the_job_invalid_result(tmp_path):
    listing = outputs_dir(tmp_path, '{"version": 1, "complete": true, "artifacts": []}')
    kwargs = {"max_files": 100, "limit_setting": None, "note": lambda text, level: None, "upload": None}
    completion = lifecycle.send_outputs(listing, declare=lambda *a: {"upload": []}, **kwargs)
    assert completion["end_reason"] == "invalid_result" and "a.bin" in completion["error"]  # present, undeclared

    def refuse(*args):
        raise ApiError("The job already has outputs.", status=409, code="outputs_exist")

    listing["files"] = [f for f in listing["files"] if f["path"] == "result.json"]
    assert lifecycle.send_outputs(listing, declare=refuse, **kwargs) == lifecycle.invalid_result(
        "The job already has outputs.")


# -- the resumable upload -------------------------------------------------------------------------

class Server:
    """Answers PUTs of one file in parts as the server does; `script` lists what to do instead, per call."""

    def __init__(self, size: int, script=()):
        self.size, self.received, self.puts, self.script = size, 0, [], list(script)

    def put(self, offset: int, length: int, content_range: str | None) -> dict:
        self.puts.append((offset, length, content_range))
        step = self.script.pop(0) if self.script else None
        if step is not None:
            raise step
        if offset != self.received:
            raise ApiError("Range mismatch.", status=409, code="range_mismatch",
                           body={"fields": {"received_bytes": [str(self.received)]}})
        self.received = offset + length
        return {"received_bytes": self.received, "complete": self.received >= self.size}


def send(server: Server, **kwargs) -> list:
    notes = []
    lifecycle.upload("big.bin", server.size, server.put, gone=lambda exc: exc.status == 401, pause=lambda s: None,
                     note=lambda text, level: notes.append(text), **kwargs)
    return notes


def test_a_large_file_goes_in_parts_and_resumes_from_the_part_the_server_confirmed():
    size = lifecycle.PART_THRESHOLD + 10
    part = lifecycle.PART_SIZE
    server = Server(size)
    server.received = part  # an earlier attempt delivered the first part; this one starts at 0
    progress = []
    notes = send(server, progress=progress.append)
    assert server.puts == [(0, part, f"bytes 0-{part - 1}/{size}"),
                           (part, part, f"bytes {part}-{2 * part - 1}/{size}"),
                           (2 * part, 10, f"bytes {2 * part}-{size - 1}/{size}")]
    assert progress == [2 * part] and server.received == size
    assert f"The upload of big.bin resumes at byte {part}." in notes


def test_network_trouble_sends_the_same_part_again_and_a_small_file_goes_whole():
    server = Server(100, script=[Unavailable("reset"), ConnectionError("broken pipe"), None])
    send(server, transient=(ConnectionError,))
    assert server.puts == [(0, 100, None)] * 3 and server.received == 100


def test_a_file_refused_three_times_fails_and_a_lost_lease_is_raised():
    refusal = ApiError("Bad checksum.", status=422, code="sha256_mismatch")
    with pytest.raises(lifecycle.UploadFailed, match="The upload of big.bin was refused: Bad checksum."):
        send(Server(100, script=[refusal] * 3))
    gone = ApiError("Token revoked.", status=401)
    server = Server(100, script=[gone])
    with pytest.raises(ApiError) as raised:
        send(server)
    assert raised.value is gone and len(server.puts) == 1


# -- tokens and the bundle ------------------------------------------------------------------------

def test_tokens_are_masked_the_known_one_whole_and_any_token_shape():
    job_token = "mado_mtj_" + "k" * 40
    text = mask_tokens(f"Bearer {job_token} and mmt_{'a' * 30} and secret-xyz", "secret-xyz")
    assert job_token not in text and "a" * 30 not in text and "secret-xyz" not in text
    assert "mado_mtj_kkk…" in text


def test_the_runner_bundle_carries_every_core_module_and_runs_from_it_alone(tmp_path):
    core = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "worker_agent/core").glob("*.py"))
    assert set(core) <= set(spec.BUNDLE)
    for rel, data in spec.bundle().items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    ran = subprocess.run([sys.executable, "-I", "-S", str(tmp_path / "worker_agent/site/runner.py"), "--help"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "usage: mado-tracking runner SPEC_DIR" in ran.stdout
