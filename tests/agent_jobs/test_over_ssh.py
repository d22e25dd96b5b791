"""The supervisor over a real OpenSSH server (tests/peers/sshd.py) through worker_agent.ssh.Connection:
the job is started detached, the connection drops, a new connection finds the same job still running,
a second start starts nothing, and the logs continue from the offsets received before the drop. And
what one SSH user shared by every project can keep private, checked as that user (not root): the
workspace, the job token's file, read-only venvs and dataset cache entries that are still reused and
evicted."""
from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
import time
import uuid
from pathlib import Path

from tests.agent_jobs.conftest import PYTHON, live_processes_with, process_spec, wait_for
from tests.agent_jobs.test_runtime_jobs import TOKEN, job_payload
from tests.agent_jobs.test_supervisor import collect, joined
from worker_agent import dataset_transfer, supervisor
from worker_agent.core import ship
from worker_agent.runtimes import TargetFacts, build_spec
from worker_agent.ssh import Connection, Target
from worker_agent.supervisor import Remote


def test_a_job_survives_a_disconnect_and_is_found_again_after_reconnecting(sshd, ssh_working_dir):
    token = "mado_mtj_" + uuid.uuid4().hex
    marker = ssh_working_dir / "starts.txt"
    script = (f"import os, time\nopen({str(marker)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
              "for i in range(120):\n    print(f'step {i:03d}', flush=True)\n    time.sleep(0.04)\n")
    spec = process_spec(ssh_working_dir, job_id=41, script=script, env={"MMT_API_TOKEN": token},
                        secrets=[token])
    target = Target.from_api(sshd.connection())

    first = Connection(target).open()
    remote = Remote(first, working_dir=str(ssh_working_dir), job_id=41, python=PYTHON)
    started = remote.start(spec)
    assert started["started"] is True
    ends, before, final = collect(remote.follow(0, 0), limit=2)
    assert final is None and ends["stdout"] > 0
    first.close()  # the SSH connection drops

    second = Connection(target).open()
    remote = Remote(second, working_dir=str(ssh_working_dir), job_id=41, python=PYTHON)
    try:
        polled = remote.poll()
        assert polled["status"] == "running" and polled["process_alive"] is True, polled
        assert polled["supervisor"] == started["supervisor"]
        owner = os.stat(f"/proc/{polled['pid']}").st_uid
        assert owner == sshd.home.stat().st_uid  # runs as the SSH login user
        assert live_processes_with(token.encode()) == []
        again = remote.start(spec)
        assert again["started"] is False and again["pid"] == polled["pid"]
        _, after, final = collect(remote.follow(ends["stdout"], ends.get("stderr", 0)))
        assert final["status"] == "exited" and final["exit_code"] == 0
        text = (joined(before, "stdout") + joined(after, "stdout")).decode()
        assert text.splitlines() == [f"step {i:03d}" for i in range(120)]
        assert marker.read_text().splitlines() == [str(polled["pid"])]
        # the follow of the dropped connection noticed and left (nothing lingers on the target)
        job_dir = supervisor.workspace(str(ssh_working_dir), 41).encode()
        wait_for(lambda: not live_processes_with(b"follow\0" + job_dir), timeout=15, what="the old follow to end")
    finally:
        second.close()


# -- privacy where one SSH user serves every project (finding 6) ------------------------------------

WRITES_INTO_ITS_VENV = """
import os, sys
try:
    open(os.path.join(sys.prefix, "planted.txt"), "w").write("x")
    print("venv writable")
except PermissionError:
    print("venv read-only")
print(len(os.environ["MMT_API_TOKEN"]))
"""


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def writable(root: Path) -> list[str]:
    """Everything under `root` (itself included) that has a write bit, symbolic links aside."""
    found = [] if not mode(root) & 0o222 else ["."]
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full) and mode(full) & 0o222:
                found.append(os.path.relpath(full, root))
    return found


def chown_tree(path: Path, uid: int, gid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.lchown(name, uid, gid)


def run_job(remote: Remote, spec: dict) -> dict:
    remote.start(spec)
    return wait_for(lambda: (s := remote.poll())["status"] in supervisor.TERMINAL and s, 120, what="the job")


def test_the_workspace_is_private_and_a_built_venv_read_only_but_reused(sshd, ssh_working_dir):
    owner = ssh_working_dir.stat()
    (ssh_working_dir / ".mmt").mkdir(mode=0o755)  # left open by an older worker
    os.chown(ssh_working_dir / ".mmt", owner.st_uid, owner.st_gid)
    connection = Connection(Target.from_api(sshd.connection())).open()
    try:
        remote = Remote(connection, working_dir=str(ssh_working_dir), job_id=51, python=PYTHON)
        facts = TargetFacts(uid=owner.st_uid, gid=owner.st_gid)
        job = job_payload(51, ssh_working_dir, command=["python", "-c", WRITES_INTO_ITS_VENV])
        done = run_job(remote, build_spec(job, facts))
        job_dir = Path(remote.job_dir)
        assert (done["status"], done["exit_code"]) == ("exited", 0), (job_dir / "stderr.log").read_text()
        assert (job_dir / "stdout.log").read_text() == f"venv read-only\n{len(TOKEN)}\n", \
            "the job (the SSH user, not root) cannot change the venv other jobs share"

        for directory in (ssh_working_dir / ".mmt", ssh_working_dir / ".mmt" / "jobs", job_dir,
                          ssh_working_dir / ".mmt-cache", ssh_working_dir / ".mmt-cache" / "venvs"):
            assert mode(directory) == 0o700, directory
        assert TOKEN in (job_dir / "spec.json").read_text(), "spec.json is the file that holds the job token"
        for name in ("spec.json", "state.json", "supervisor.py", "stdout.log", "stderr.log", "inputs/parameters.json"):
            assert mode(job_dir / name) == 0o600, name
        venv = Path(build_spec(job, facts)["venv"]["dir"])
        assert (venv / ".mmt-ready").exists() and writable(venv) == [], writable(venv)[:5]
        assert not (venv / "planted.txt").exists()
        assert os.path.islink(venv / "bin" / "python") and mode(os.path.realpath(venv / "bin" / "python")) & 0o200, \
            "the interpreter the venv links to is not touched"

        # The next job with the same requirements reuses it as it is.
        second = Remote(connection, working_dir=str(ssh_working_dir), job_id=52, python=PYTHON)
        done = run_job(second, build_spec(job_payload(52, ssh_working_dir, command=["python", "-c", "print('again')"]),
                                          facts))
        assert (done["status"], done["exit_code"]) == ("exited", 0)
        assert Path(second.job_dir, "stderr.log").read_text() == \
            f"[mado] Reusing the venv for these requirements ({venv.name}).\n"
    finally:
        connection.close()


def test_a_read_only_venv_left_unfinished_is_removed_and_built_again(sshd, ssh_working_dir):
    owner = ssh_working_dir.stat()
    job = job_payload(53, ssh_working_dir, command=["python", "-c", "print('built again')"])
    spec = build_spec(job, TargetFacts(uid=owner.st_uid, gid=owner.st_gid))
    venv = Path(spec["venv"]["dir"])
    (venv / "lib" / "deep").mkdir(parents=True)  # sealed, but its .mmt-ready was never written
    (venv / "lib" / "deep" / "leftover.py").write_text("")
    chown_tree(ssh_working_dir, owner.st_uid, owner.st_gid)
    for path in (venv / "lib" / "deep" / "leftover.py", venv / "lib" / "deep", venv / "lib", venv):
        path.chmod(0o444 if path.is_file() else 0o555)
    connection = Connection(Target.from_api(sshd.connection())).open()
    try:
        remote = Remote(connection, working_dir=str(ssh_working_dir), job_id=53, python=PYTHON)
        done = run_job(remote, spec)
        assert (done["status"], done["exit_code"]) == ("exited", 0), Path(remote.job_dir, "stderr.log").read_text()
        assert Path(remote.job_dir, "stdout.log").read_text() == "built again\n"
        assert not (venv / "lib" / "deep").exists() and writable(venv) == []
    finally:
        connection.close()


def version_of(files: dict[str, bytes], version_id: int) -> tuple[dict, bytes]:
    """(the `version` of an ensure header, the relay's stdin after the header: manifest line + tar)."""
    items = sorted(({"path": p, "sha256": hashlib.sha256(d).hexdigest(), "size": len(d)} for p, d in files.items()),
                   key=lambda i: i["path"])
    lines = "".join(f"{i['sha256']} {i['size']} {i['path']}\n" for i in items)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w|", format=tarfile.PAX_FORMAT) as archive:
        for item in items:
            info = tarfile.TarInfo(item["path"])
            info.size = len(files[item["path"]])
            archive.addfile(info, io.BytesIO(files[item["path"]]))
    version = {"id": version_id, "digest": "sha256:" + hashlib.sha256(lines.encode()).hexdigest(),
               "total_size": sum(map(len, files.values())), "file_count": len(files)}
    return version, (json.dumps(items) + "\n").encode() + buffer.getvalue()


def test_a_complete_cache_entry_is_read_only_and_still_evicted(sshd, ssh_working_dir):
    root = dataset_transfer.cache_root(str(ssh_working_dir))
    connection = Connection(Target.from_api(sshd.connection())).open()

    def cache(*args: str, stdin: bytes = b"") -> dict:
        ran = ship.run(connection, PYTHON, dataset_transfer.PROGRAM, args, stdin=stdin, timeout=60)
        assert ran.exit_code == 0, ran.stderr
        return json.loads(ran.stdout.decode().strip().splitlines()[-1])

    def ensure(job_id: int, version: dict, body: bytes, limit: int) -> dict:
        header = {"job_id": job_id, "mode": "relay", "limit_bytes": limit, "version": version}
        return cache("ensure", root, stdin=(json.dumps(header) + "\n").encode() + body)

    try:
        first, first_body = version_of({"a/one.bin": b"1" * 40_000, "two.txt": b"two"}, 7)
        answer = ensure(1, first, first_body, limit=60_000)
        assert answer["ok"] and answer["fetched"], answer
        entry = Path(root) / first["digest"].removeprefix("sha256:")
        assert mode(Path(root)) == 0o700 and mode(Path(root).parent) == 0o700
        assert writable(entry) == ["users", "users/1"], "only the pins change once an entry is complete"
        assert mode(entry) == 0o555 and mode(entry / "data" / "a") == 0o555 and mode(entry / "data" / "two.txt") == 0o444
        planted = connection.run(["sh", "-c", f"echo x > {entry}/data/planted; rm -f {entry}/data/two.txt; "
                                              f"mv {entry}/files.json {entry}/moved.json"])
        assert planted.exit_code != 0 and sorted(os.listdir(entry / "data")) == ["a", "two.txt"]
        assert (entry / "files.json").exists(), "the SSH user (not root) cannot change a complete entry"

        used_before = os.stat(entry / "last-used").st_mtime
        time.sleep(0.05)
        again = ensure(2, first, b"", limit=60_000)
        assert again["ok"] and again["fetched"] is False, again
        assert os.stat(entry / "last-used").st_mtime > used_before, "a read-only entry is still marked used"

        assert cache("release", root, "1")["ok"] and cache("release", root, "2")["ok"]
        second, second_body = version_of({"b.bin": b"2" * 30_000}, 8)
        answer = ensure(3, second, second_body, limit=60_000)
        assert answer["ok"] and answer["evicted"] == [entry.name], answer
        assert not entry.exists(), "the SSH user evicted the read-only entry"
        assert sorted(os.listdir(root)) == sorted([".lock", second["digest"].removeprefix("sha256:"),
                                                   second["digest"].removeprefix("sha256:") + ".lock",
                                                   entry.name + ".lock"])
    finally:
        connection.close()
