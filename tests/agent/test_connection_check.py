"""The connection check against a real sshd: what a user reads in the check result."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time

import paramiko
import pytest

from tests.agent.conftest import listing
from tests.peers.sshd import keygen
from worker_agent.probe import ITEM_KEYS, run_check
from worker_agent.ssh import Connection, ConnectionPool, Target

ORDER = ["connection", *ITEM_KEYS]


def computer(sshd, **extra) -> dict:
    return {"id": 1, "name": "box", "working_dir": "", "python_path": "", "gpu_ids": [], "runtimes": [],
            **sshd.connection(), **extra}


def items(result) -> dict:
    return {i["key"]: i for i in result["items"]}


def mmt_has(program: str) -> bool:
    """Whether the login user's non-interactive PATH (sshd's default) has `program`."""
    return any(os.access(os.path.join(d, program), os.X_OK) for d in "/usr/local/bin:/usr/bin:/bin".split(":"))


def assert_secret_free(result, sshd):
    text = json.dumps(result)
    assert str(sshd.key_path) not in text and str(sshd.known_hosts_path) not in text
    assert str(sshd.client_dir) not in text
    assert "PRIVATE KEY" not in text


def test_a_full_check_reports_what_the_machine_has(sshd, pool, target_dir):
    status, result = run_check(computer(sshd, working_dir=str(target_dir / "jobs")), pool,
                               api_url="http://127.0.0.1:9")
    got = items(result)
    assert status == "succeeded"
    assert [i["key"] for i in result["items"]] == ORDER
    assert got["connection"]["status"] == "ok" and f"mmt@127.0.0.1:{sshd.port}" in got["connection"]["detail"]
    for key in ("python", "venv", "pip", "git"):
        assert got[key]["status"] == "ok", got[key]
    assert got["python"]["detail"].startswith("Python 3.")
    if mmt_has("docker"):
        # The CLI is installed here but no daemon runs: reported as such, not as missing.
        assert got["docker"]["status"] in ("ok", "failed")
        if got["docker"]["status"] == "failed":
            assert got["docker"]["code"] in ("docker_daemon_unreachable", "docker_socket_denied")
    else:
        assert (got["docker"]["status"], got["docker"]["code"]) == ("none", "docker_missing")
    assert (got["apptainer"]["status"], got["apptainer"]["code"]) == ("none", "apptainer_missing")
    assert (got["singularity"]["status"], got["singularity"]["code"]) == ("none", "singularity_missing")
    assert got["gpu"]["status"] == "none" and "nvidia-smi" in got["gpu"]["detail"]
    assert got["work_directory"]["status"] == "ok" and "GiB free" in got["work_directory"]["detail"]
    assert (got["api"]["status"], got["api"]["code"]) == ("failed", "api_unreachable")

    machine = result["machine"]
    assert machine["arch"] == "amd64" and machine["cores"] == os.cpu_count()
    assert machine["memory_bytes"] > 256 * 1024 ** 2 and machine["home"] == str(sshd.home)
    assert {"path": "/usr/bin/python3", "version": result["pythons"][0]["version"]} in result["pythons"]
    assert all(tuple(map(int, p["version"].split(".")[:2])) >= (3, 11) for p in result["pythons"])
    workdirs = {w["path"]: w for w in result["workdirs"]}
    assert workdirs[str(sshd.home)]["writable"] is True and workdirs[str(sshd.home)]["free_bytes"] > 0
    assert workdirs[str(target_dir)]["writable"] is True, "directories under the home are candidates"
    assert result["gpus"] == []
    assert result["runtimes"][0] == "python"
    assert_secret_free(result, sshd)


def test_the_configured_python_is_the_one_checked(sshd, pool):
    status, result = run_check(computer(sshd, python_path="/usr/bin/python3.11"), pool)
    assert items(result)["python"]["detail"].endswith("(/usr/bin/python3.11)")

    status, result = run_check(computer(sshd, python_path="/opt/nowhere/python3"), pool)
    got = items(result)
    assert status == "succeeded", "the connection works; the Python is what fails"
    assert (got["python"]["status"], got["python"]["code"]) == ("failed", "python_missing")
    assert got["venv"]["status"] == "not_checked" and got["pip"]["status"] == "not_checked"


def test_a_python_too_old_for_jobs_is_reported_with_its_version(sshd, pool, target_dir):
    fake = target_dir / "python3.9"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = - ]; then exec /usr/bin/python3 -; fi\n"
                    "echo 3.9.18; echo /opt/py39/bin/python3.9\n")
    fake.chmod(0o755)
    status, result = run_check(computer(sshd, python_path=str(fake)), pool)
    python = items(result)["python"]
    assert (python["status"], python["code"]) == ("failed", "python_too_old")
    assert "3.9.18" in python["detail"] and "3.11" in python["detail"]


def test_a_working_directory_the_user_cannot_write_fails(sshd, pool):
    status, result = run_check(computer(sshd, working_dir="/usr/share/mmt-jobs"), pool)
    work = items(result)["work_directory"]
    assert (work["status"], work["code"]) == ("failed", "work_directory_not_writable")
    assert "/usr/share" in work["detail"]


def test_without_a_working_directory_it_is_not_checked(sshd, pool):
    status, result = run_check(computer(sshd), pool)
    assert items(result)["work_directory"]["status"] == "not_checked"


def test_a_check_leaves_nothing_on_the_target(sshd, pool, target_dir):
    workdir = target_dir / "jobs"
    uid = sshd.home.stat().st_uid

    def others(path):  # directories of other tests, possibly of another run on this machine
        if os.path.dirname(path) == str(sshd.home):
            return os.path.basename(path).startswith(("t-", "e2e-", "cluster-e2e-")) and path != str(target_dir)
        if os.path.dirname(path) == "/tmp":
            try:
                return os.lstat(path).st_uid != uid
            except FileNotFoundError:
                return True
        return False

    before = listing(sshd.home, "/tmp", skip=others)
    status, result = run_check(computer(sshd, working_dir=str(workdir)), pool)
    assert status == "succeeded" and items(result)["work_directory"]["status"] == "ok"
    after = listing(sshd.home, "/tmp", skip=others)
    # In /tmp only the login user's files count: other processes of this machine write there too.
    new = [p for p in set(after) - set(before) if p.startswith(str(sshd.home)) or after[p][1] == uid]
    assert new == [] and not workdir.exists(), "the working directory is tested, never created"
    changed = [p for p in before if p.startswith(str(sshd.home)) and after.get(p) != before[p]]
    assert changed == []


def test_an_unknown_host_key_fails_the_connection_with_the_fix(sshd, pool, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    status, result = run_check(computer(sshd, known_hosts_path=str(empty)), pool)
    first = result["items"][0]
    assert status == "failed"
    assert (first["key"], first["status"], first["code"]) == ("connection", "failed", "host_key_unknown")
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1" in first["detail"]
    assert all(i["status"] == "not_checked" for i in result["items"][1:])
    assert str(empty) not in json.dumps(result)
    assert_secret_free(result, sshd)


def test_a_changed_host_key_fails_the_connection_and_names_no_file(sshd, pool, tmp_path):
    other = keygen(tmp_path / "other_host")
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{sshd.port} {' '.join(other.split()[:2])}\n")
    status, result = run_check(computer(sshd, known_hosts_path=str(wrong)), pool)
    first = result["items"][0]
    assert status == "failed" and (first["status"], first["code"]) == ("failed", "host_key_changed")
    assert "ssh-keygen -R" in first["detail"] and "known_hosts file" in first["detail"]
    assert str(wrong) not in json.dumps(result) and str(tmp_path) not in json.dumps(result)
    assert_secret_free(result, sshd)


def test_a_key_readable_by_others_fails_without_connecting(sshd, pool, tmp_path):
    key = tmp_path / "id_ed25519"
    shutil.copy(sshd.key_path, key)
    key.chmod(0o644)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    try:
        port = listener.getsockname()[1]
        status, result = run_check(computer(sshd, ssh_key_path=str(key), port=port), pool)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody knocked
    finally:
        listener.close()
    first = result["items"][0]
    assert (first["status"], first["code"]) == ("failed", "ssh_configuration")
    assert "644" in first["detail"] and "chmod 600" in first["detail"]
    assert str(key) not in json.dumps(result)


@pytest.mark.parametrize("which", ["key", "known_hosts"])
def test_a_missing_key_or_known_hosts_is_a_configuration_failure(sshd, pool, tmp_path, which):
    missing = str(tmp_path / "nope")
    fields = {"ssh_key_path": missing} if which == "key" else {"known_hosts_path": missing}
    status, result = run_check(computer(sshd, **fields), pool)
    first = result["items"][0]
    assert (first["status"], first["code"]) == ("failed", "ssh_configuration")
    assert "does not exist on the worker machine" in first["detail"] and missing not in first["detail"]


def test_a_key_the_target_does_not_accept_fails_with_authorized_keys_advice(sshd, pool, tmp_path):
    stranger = tmp_path / "id_stranger"
    keygen(stranger)
    status, result = run_check(computer(sshd, ssh_key_path=str(stranger)), pool)
    first = result["items"][0]
    assert (first["status"], first["code"]) == ("failed", "ssh_failed")
    assert "authorized_keys" in first["detail"] and str(stranger) not in first["detail"]


def test_a_closed_port_fails_with_the_address(sshd, pool):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    status, result = run_check(computer(sshd, port=port), pool)
    first = result["items"][0]
    assert (first["code"], first["detail"].split(":")[0]) == ("ssh_failed", "The connection to 127.0.0.1")
    assert "refused" in first["detail"]


def test_the_transport_is_reused_and_reopened_after_a_failure(sshd):
    pool = ConnectionPool()
    try:
        target = Target.from_api(sshd.connection())
        first = pool.get(target)
        assert first.run(["echo", "hi"]).stdout == b"hi\n"
        transport = first._client.get_transport()
        sock = transport.sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        assert transport.remote_cipher == "aes128-gcm@openssh.com"
        assert pool.get(target) is first and first._client.get_transport() is transport
        assert first.run(["true"]).ok and first._client.get_transport() is transport

        sock.shutdown(socket.SHUT_RDWR)  # the network drops the connection
        transport.join(timeout=5)
        result = first.run(["sh", "-c", "echo back; exit 3"])
        assert (result.exit_code, result.stdout) == (3, b"back\n")
        assert first._client.get_transport() is not transport
    finally:
        pool.close_all()


def test_run_passes_stdin_and_keeps_stdout_and_stderr_apart(sshd):
    connection = Connection(Target.from_api(sshd.connection())).open()
    try:
        result = connection.run(["sh", "-c", "cat; echo oops >&2"], stdin=b"x" * 300_000)
        assert result.ok and result.stdout == b"x" * 300_000 and result.stderr == b"oops\n"
        argv = ["printf", "%s|", "a b", "$HOME", "'q'"]
        assert connection.run(argv).stdout == b"a b|$HOME|'q'|", "arguments reach the target unchanged"
    finally:
        connection.close()


# The command's last output is still in sshd's pipes when sshd reaps it and sends the exit status:
# `run` must read on until EOF. Before that fix about one run in four of each of these lost bytes at
# the end of stdout or stderr, idle or under load (issue 14).
LAST_WORDS = [
    (["sh", "-c", "cat; echo oops >&2"], b"x" * 300_000, b"x" * 300_000, b"oops\n"),
    (["sh", "-c", "head -c 300000 /dev/zero; echo oops >&2"], None, bytes(300_000), b"oops\n"),
    (["sh", "-c", "head -c 200000 /dev/zero >&2; echo oops; echo last >&2"], None, b"oops\n",
     bytes(200_000) + b"last\n"),
]


def test_run_returns_all_output_written_right_before_the_exit(sshd):
    connection = Connection(Target.from_api(sshd.connection())).open()
    try:
        for argv, stdin, stdout, stderr in LAST_WORDS:
            for attempt in range(20):
                result = connection.run(argv, stdin=stdin)
                assert (result.exit_code, len(result.stdout), len(result.stderr)) == (0, len(stdout), len(stderr)), \
                    f"{argv[-1]!r}, run {attempt + 1}"
                assert (result.stdout, result.stderr) == (stdout, stderr)
        # EOF before the exit status: a command that closes its output and goes on a little.
        result = connection.run(["sh", "-c", "echo early; exec >&- 2>&-; sleep 0.3; exit 4"])
        assert (result.exit_code, result.stdout) == (4, b"early\n")
    finally:
        connection.close()


def test_run_does_not_hang_on_a_background_process_that_keeps_the_output_open(sshd, monkeypatch):
    monkeypatch.setattr("worker_agent.ssh.EXIT_DRAIN_SECONDS", 1.0)
    connection = Connection(Target.from_api(sshd.connection())).open()
    try:
        started = time.monotonic()
        result = connection.run(["sh", "-c", "sleep 4 & echo parent; exit 2"], timeout=20)
        assert (result.exit_code, result.stdout) == (2, b"parent\n")
        assert time.monotonic() - started < 10
    finally:
        connection.close()


def test_system_and_user_known_hosts_are_never_consulted(sshd, tmp_path, monkeypatch):
    """With the right key only in ~/.ssh/known_hosts, the computer's own empty file still refuses."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(sshd.known_hosts_path, home / ".ssh" / "known_hosts")
    monkeypatch.setenv("HOME", str(home))
    empty = tmp_path / "kh"
    empty.write_text("")
    loaded = []
    original = paramiko.SSHClient.load_system_host_keys
    monkeypatch.setattr(paramiko.SSHClient, "load_system_host_keys",
                        lambda self, *a: loaded.append(a) or original(self, *a))
    status, result = run_check(computer(sshd, known_hosts_path=str(empty)), ConnectionPool())
    assert result["items"][0]["code"] == "host_key_unknown" and loaded == []


def test_the_probe_script_needs_only_the_standard_library():
    from worker_agent import probe

    compiled = subprocess.run(["/usr/bin/python3", "-I", "-S", "-c",
                               "import sys; exec(compile(sys.stdin.read(), 'probe', 'exec'))"],
                              input=probe.PROBE_SOURCE, text=True, capture_output=True)
    assert compiled.returncode == 0, compiled.stderr


def test_a_failed_check_also_closes_the_transport_reads_were_using(sshd, tmp_path):
    from worker_agent.reads import read_directory

    known_hosts = tmp_path / "known_hosts"
    shutil.copy(sshd.known_hosts_path, known_hosts)
    fields = sshd.connection(known_hosts_path=str(known_hosts))
    pool = ConnectionPool()
    try:
        assert read_directory(fields, "/", pool)[1] is None
        other = keygen(tmp_path / "other_host")
        known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {' '.join(other.split()[:2])}\n")
        status, result = run_check(computer(sshd, known_hosts_path=str(known_hosts)), pool)
        assert result["items"][0]["code"] == "host_key_changed"
        assert read_directory(fields, "/", pool) == ([], "connect_failed"), "no read over the old transport"
    finally:
        pool.close_all()
