"""The programs of worker_agent/target as a worker runs them on a target: each module's commands
in-process, and the worker's side (worker_agent.remote_files) over a LocalConnection whose HOME is a
temporary directory, so every program is shipped there (sent once, then run by its hash)."""
from __future__ import annotations

import io
import json
import os
import sys
import tarfile

import pytest

from tests.support import tar_gz
from worker_agent import remote_files
from worker_agent.core import outputs as core_outputs
from worker_agent.ssh import LocalConnection
from worker_agent.target import files, net


def target(home) -> LocalConnection:
    return LocalConnection(env={"HOME": str(home), "PATH": os.environ["PATH"]})


def run_files(*argv: str, stdin: bytes = b"") -> tuple[int, bytes]:
    out = io.BytesIO()
    code = files.main(list(argv), io.BytesIO(stdin), out)
    return code, out.getvalue()


def test_the_files_program_is_one_file_of_the_modules_it_shares_with_the_site_runner():
    text = remote_files.FILES.source.decode()
    assert "from worker_agent" not in text and "import worker_agent" not in text
    for shared in (core_outputs.read_outputs, core_outputs.iter_frames, files.main):
        assert f"def {shared.__name__}(" in text
    assert run_files("nonsense")[0] == 2


def test_cat_reads_the_range_and_never_through_a_link(tmp_path):
    data = bytes(range(256)) * 8192  # 2 MiB: more than one block
    (tmp_path / "w.bin").write_bytes(data)
    assert run_files("cat", str(tmp_path / "w.bin"), "1000", str(1 << 21)) == (0, data[1000:])
    assert run_files("cat", str(tmp_path / "w.bin"), "5", "3") == (0, data[5:8])
    (tmp_path / "link").symlink_to(tmp_path / "w.bin")
    with pytest.raises(OSError):
        run_files("cat", str(tmp_path / "link"), "0", "3")


def test_the_source_goes_only_into_a_job_directory_under_an_existing_working_directory(tmp_path):
    archive = tar_gz({"train.py": b"print(1)\n"})
    code, out = run_files("source", str(tmp_path / "gone/.mmt/jobs/3"), "archive", stdin=archive)
    assert json.loads(out) == {"ok": False, "code": "working_dir_missing",
                               "error": f"The working directory {tmp_path}/gone does not exist on the target."}
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / ".mmt").symlink_to(tmp_path / "elsewhere")
    code, out = run_files("source", str(tmp_path / ".mmt/jobs/3"), "archive", stdin=archive)
    assert json.loads(out)["code"] == "symlink_refused" and os.listdir(tmp_path / "elsewhere") == []


def test_the_network_facts_are_a_free_port_and_names_resolved_here(capsys):
    assert net.main(["free-port"]) == 0 and 0 < int(capsys.readouterr().out) < 65536
    assert net.main(["resolve", "localhost"]) == 0
    assert json.loads(capsys.readouterr().out) == {"localhost": "127.0.0.1"}
    assert net.main([]) == 2


def test_the_worker_fetches_lists_reads_and_frames_a_jobs_files_over_one_connection(tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    connection = target(home)
    job_dir = str(work / ".mmt/jobs/5")
    with open(tmp_path / "source.tar.gz", "w+b") as archive:
        archive.write(tar_gz({"train.py": b"print(2)\n", "lib/util.py": b"X = 1\n"}))
        archive.seek(0)
        fetched = remote_files.fetch_source(connection, python=sys.executable, job_dir=job_dir,
                                            source={"kind": "archive"}, archive=archive)
    assert fetched == {"ok": True, "existing": False, "files": 2}
    assert (work / ".mmt/jobs/5/source/lib/util.py").read_bytes() == b"X = 1\n"

    outputs = work / ".mmt/jobs/5/outputs"
    (outputs / "model").mkdir(parents=True)
    (outputs / "model/w.bin").write_bytes(b"w" * 3000)
    (outputs / "result.json").write_text('{"version": 1, "complete": true, "artifacts": []}')
    listing = remote_files.list_outputs(connection, python=sys.executable, outputs_dir=str(outputs), max_files=10)
    assert listing == dict(core_outputs.read_outputs(str(outputs), 10))

    with remote_files.RemoteRange(connection, python=sys.executable, path=str(outputs / "model/w.bin"),
                                  offset=1000, length=1500) as body:
        assert len(body) == 1500 and body.read(-1) == b"w" * 1500
    wanted = [{"path": "model/w.bin", "size": 3000}, {"path": "result.json", "size": 49}]
    with remote_files.open_frames(connection, sys.executable, str(outputs), wanted) as body:
        sent = b"".join(iter(lambda: body.read(8192), b""))
    assert sent == b"".join(core_outputs.iter_frames(str(outputs), wanted))
    assert int(remote_files.net_fact(connection, sys.executable, "free-port")) > 0
    stored = sorted(os.listdir(home / ".cache/mado/programs"))
    assert stored == sorted([f"{remote_files.FILES.sha256}.py", f"{remote_files.NET.sha256}.py",
                             f"{remote_files.FILES.sha256}.{sys.implementation.cache_tag}.code",
                             f"{remote_files.NET.sha256}.{sys.implementation.cache_tag}.code"])


def test_a_failing_network_fact_says_what_the_computers_python_printed(tmp_path):
    with pytest.raises(remote_files.RemoteFileError, match=r"exited with 1: .*gaierror"):
        remote_files.net_fact(target(tmp_path), sys.executable, "resolve", "no-such-host.invalid")


def test_the_dataset_cache_goes_along_until_known_and_is_sent_again_once_the_target_lost_it(tmp_path):
    from worker_agent import dataset_transfer
    from worker_agent.core import ship
    from worker_agent.ssh import ConnectError

    connection, root = target(tmp_path), str(tmp_path / "work/.mmt-cache/datasets")

    def usage() -> dict:
        duplex = dataset_transfer.open_cache(connection, sys.executable, "usage", root)
        try:
            duplex.close_write()
            return duplex.message()
        finally:
            duplex.close()

    assert usage()["ok"] and ship.known(connection, dataset_transfer.PROGRAM)
    assert usage()["ok"]
    (tmp_path / ".cache/mado/programs" / f"{dataset_transfer.PROGRAM.sha256}.py").unlink()
    version = {"id": 1, "digest": "sha256:" + "0" * 64, "total_size": 1, "file_count": 1}
    with pytest.raises(ConnectError, match="ended without an answer"):
        dataset_transfer.ensure_version(connection, None, {"id": 9}, version, python=sys.executable,
                                        working_dir=str(tmp_path / "work"))
    assert not ship.known(connection, dataset_transfer.PROGRAM)  # the job's next try sends it
    assert usage()["ok"]
