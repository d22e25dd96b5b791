"""worker_agent.core.ship: a program goes to a target once and is then run by its sha256; each run that
counts is checked by what went over the connection (argv and stdin), on this machine (LocalConnection
with its own HOME) and over the tests' sshd."""
from __future__ import annotations

import json
import os
import stat
import sys
import threading
import time
import uuid

import pytest

from worker_agent.core import ship
from worker_agent.ssh import Connection, LocalConnection, Target

TAG = sys.implementation.cache_tag  # the compiled copy's suffix, for this Python (sys.executable)


def echo_program() -> ship.Program:
    """Prints its arguments, its stdin and its own file; unique per test, so no earlier run stored it."""
    source = (f"# {uuid.uuid4().hex}\nimport json, sys\n"
              "print(json.dumps({'args': sys.argv[1:], 'stdin': sys.stdin.read(), 'file': __file__}))\n")
    return ship.Program(source.encode(), "echo.py")


class Recorded:
    """A connection that keeps what each run sent."""

    def __init__(self, inner):
        self.inner = inner
        self.sent: list[tuple[list[str], bytes]] = []

    def run(self, argv, stdin=b"", timeout=60.0):
        self.sent.append((argv, stdin))
        return self.inner.run(argv, stdin=stdin, timeout=timeout)

    def stream(self, argv, stdin=b"", timeout=15.0):
        self.sent.append((argv, stdin))
        return self.inner.stream(argv, stdin=stdin, timeout=timeout)


def local(home) -> Recorded:
    return Recorded(LocalConnection(env={"HOME": str(home), "PATH": os.environ["PATH"]}))


def answer(ran) -> dict:
    assert ran.exit_code == 0, ran.stderr
    return json.loads(ran.stdout)


def read_all(stream) -> bytes:
    out = b""
    while chunk := stream.read(65536):
        out += chunk
    stream.close()
    return out


def test_sent_once_then_run_by_hash_with_the_payload_and_arguments(tmp_path):
    program, connection = echo_program(), local(tmp_path)
    first = answer(ship.run(connection, sys.executable, program, ["a b", 7], stdin=b"payload"))
    stored = tmp_path / ".cache/mado/programs" / f"{program.sha256}.py"
    assert first == {"args": ["a b", "7"], "stdin": "payload", "file": str(stored)}
    assert stored.read_bytes() == program.source
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert stat.S_IMODE(stored.parent.stat().st_mode) == 0o700
    assert [stdin for _, stdin in connection.sent] == [b"payload", program.source + b"payload"]  # tried first

    second = answer(ship.run(connection, sys.executable, program, ["x"], stdin=b"more"))
    assert second["args"] == ["x"] and second["stdin"] == "more"
    argv, stdin = connection.sent[-1]
    assert stdin == b"more" and program.sha256 in argv and f"{program.sha256}:{len(program.source)}" not in argv
    assert sorted(os.listdir(stored.parent)) == [f"{program.sha256}.{TAG}.code", stored.name]  # no temporary file


def test_a_damaged_compiled_copy_is_compiled_again(tmp_path):
    program, connection = echo_program(), local(tmp_path)
    answer(ship.run(connection, sys.executable, program))
    code = tmp_path / ".cache/mado/programs" / f"{program.sha256}.{TAG}.code"
    whole = code.read_bytes()
    code.write_bytes(whole[: len(whole) // 2])
    assert answer(ship.run(connection, sys.executable, program, stdin=b"x"))["stdin"] == "x"
    assert code.read_bytes() == whole


def test_a_new_connection_finds_the_stored_program_and_sends_only_the_payload(tmp_path):
    program = echo_program()
    answer(ship.run(local(tmp_path), sys.executable, program))
    fresh = local(tmp_path)
    assert answer(ship.run(fresh, sys.executable, program, stdin=b"p"))["stdin"] == "p"
    assert [stdin for _, stdin in fresh.sent] == [b"p"]  # one run, without the program


def test_a_removed_or_truncated_copy_is_sent_again(tmp_path):
    program, connection = echo_program(), local(tmp_path)
    answer(ship.run(connection, sys.executable, program))
    stored = tmp_path / ".cache/mado/programs" / f"{program.sha256}.py"
    stored.write_bytes(program.source[:-5])  # a write cut short: never run
    assert answer(ship.run(connection, sys.executable, program, stdin=b"1"))["stdin"] == "1"
    assert stored.read_bytes() == program.source
    stored.unlink()
    assert answer(ship.run(connection, sys.executable, program, stdin=b"2"))["stdin"] == "2"
    assert stored.read_bytes() == program.source
    tries = [stdin for _, stdin in connection.sent[2:]]
    assert tries == [b"1", program.source + b"1", b"2", program.source + b"2"]


def test_concurrent_first_runs_each_run_and_leave_one_complete_copy(tmp_path):
    program = echo_program()
    results, errors = [], []

    def one(i: int) -> None:
        try:
            results.append(answer(ship.run(local(tmp_path), sys.executable, program, [i])))
        except Exception as exc:  # reported below with the others
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(int(r["args"][0]) for r in results) == list(range(8))
    directory = tmp_path / ".cache/mado/programs"
    assert sorted(os.listdir(directory)) == [f"{program.sha256}.{TAG}.code", f"{program.sha256}.py"]
    assert (directory / f"{program.sha256}.py").read_bytes() == program.source


def test_a_home_that_cannot_keep_programs_fails_the_run_with_the_reason(tmp_path):
    (tmp_path / ".cache").write_text("a file where the directory would go")
    ran = ship.run(local(tmp_path), sys.executable, echo_program())
    assert ran.exit_code == 1
    assert b"mado: cannot keep programs in" in ran.stderr


def test_a_stream_sends_the_program_until_known_and_again_after_the_copy_vanished(tmp_path):
    program, connection = echo_program(), local(tmp_path)
    out = read_all(ship.stream(connection, sys.executable, program, ["s"], stdin=b"in"))
    assert json.loads(out)["stdin"] == "in" and connection.sent[-1][1] == program.source + b"in"
    assert json.loads(read_all(ship.stream(connection, sys.executable, program, stdin=b"2")))["stdin"] == "2"
    assert connection.sent[-1][1] == b"2"

    (tmp_path / ".cache/mado/programs" / f"{program.sha256}.py").unlink()
    assert read_all(ship.stream(connection, sys.executable, program)) == b""  # the caller's try fails
    assert json.loads(read_all(ship.stream(connection, sys.executable, program, stdin=b"3")))["stdin"] == "3"
    assert connection.sent[-1][1] == program.source + b"3"


def test_over_ssh_the_login_users_home_keeps_the_program(sshd):
    program = echo_program()
    target = Target.from_api(sshd.connection())
    connection = Recorded(Connection(target).open())
    try:
        assert answer(ship.run(connection, "python3", program, ["1"], stdin=b"a"))["stdin"] == "a"
        stored = sshd.home / ".cache/mado/programs" / f"{program.sha256}.py"
        assert stored.read_bytes() == program.source and stored.stat().st_uid == sshd.home.stat().st_uid
        again = Recorded(Connection(target).open())
        try:
            assert answer(ship.run(again, "python3", program, stdin=b"b"))["stdin"] == "b"
            assert [stdin for _, stdin in again.sent] == [b"b"]
        finally:
            again.inner.close()
    finally:
        connection.inner.close()


# -- the cache prunes itself ----------------------------------------------------------------------

DAY = 86400


def age(path, days: float) -> float:
    """Sets the file's mtime `days` back; returns that mtime."""
    when = time.time() - days * DAY
    os.utime(path, (when, when))
    return os.stat(path).st_mtime


def test_storing_a_program_removes_what_no_run_touched_for_30_days(tmp_path):
    directory = tmp_path / ".cache/mado/programs"
    old, recent = echo_program(), echo_program()
    answer(ship.run(local(tmp_path), sys.executable, old))
    answer(ship.run(local(tmp_path), sys.executable, recent))
    for name in (f"{old.sha256}.py", f"{old.sha256}.{TAG}.code"):
        age(directory / name, 31)
    (directory / f"{old.sha256}.py.4242.tmp").write_bytes(b"a store cut short")
    age(directory / f"{old.sha256}.py.4242.tmp", 31)
    kept_time = age(directory / f"{recent.sha256}.py", 29)
    (directory / "notes.txt").write_text("not ours")
    age(directory / "notes.txt", 100)

    answer(ship.run(local(tmp_path), sys.executable, echo_program()))  # a store: the send path prunes

    names = set(os.listdir(directory))
    assert not {n for n in names if n.startswith(old.sha256)}
    assert {f"{recent.sha256}.py", f"{recent.sha256}.{TAG}.code", "notes.txt"} <= names
    assert os.stat(directory / f"{recent.sha256}.py").st_mtime == kept_time
    again = local(tmp_path)
    assert answer(ship.run(again, sys.executable, old, stdin=b"back"))["stdin"] == "back"  # sent again
    assert [stdin for _, stdin in again.sent] == [b"back", old.source + b"back"]


def test_a_run_by_hash_keeps_its_program_fresh_touching_it_at_most_once_a_day(tmp_path):
    program = echo_program()
    answer(ship.run(local(tmp_path), sys.executable, program))
    stored = tmp_path / ".cache/mado/programs" / f"{program.sha256}.py"
    code = stored.with_name(f"{program.sha256}.{TAG}.code")
    age(code, 3)
    age(stored, 3)
    answer(ship.run(local(tmp_path), sys.executable, program))
    assert stored.stat().st_mtime > time.time() - DAY and code.stat().st_mtime > time.time() - DAY
    half_a_day = age(stored, 0.5)
    answer(ship.run(local(tmp_path), sys.executable, program))
    assert stored.stat().st_mtime == half_a_day  # no write while it is fresh enough


# -- a file as stdin, programs of several modules ---------------------------------------------------

def digest_program() -> ship.Program:
    source = (f"# {uuid.uuid4().hex}\nimport hashlib, sys\n"
              "print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())\n")
    return ship.Program(source.encode(), "digest.py")


def test_a_file_as_stdin_goes_once_with_the_program_then_by_hash_and_again_from_its_start(tmp_path):
    import hashlib
    import tempfile

    program, connection = digest_program(), local(tmp_path)
    payload = os.urandom(300_000)
    with tempfile.TemporaryFile() as archive:
        archive.write(b"skipped" + payload)

        def digest() -> str:
            archive.seek(len(b"skipped"))
            ran = ship.run(connection, sys.executable, program, stdin=archive)
            assert ran.exit_code == 0, ran.stderr
            return ran.stdout.decode().strip()

        assert digest() == hashlib.sha256(payload).hexdigest()
        assert digest() == hashlib.sha256(payload).hexdigest()
        (tmp_path / ".cache/mado/programs" / f"{program.sha256}.py").unlink()
        assert digest() == hashlib.sha256(payload).hexdigest()
    sends = [f"{program.sha256}:{len(program.source)}" in argv for argv, _ in connection.sent]
    assert sends == [True, False, False, True]  # unknown: sent at once; known: by hash; lost: sent again


def write_module(directory, name: str, text: str):
    import types

    path = directory / f"{name.replace('.', '_')}.py"
    path.write_text(text)
    module = types.ModuleType(name)
    module.__file__ = str(path)
    return module


def test_modules_are_joined_into_one_program_without_their_imports_of_each_other(tmp_path):
    base = write_module(tmp_path, "pkg.base", '"""Base."""\nfrom __future__ import annotations\nimport json\n\n\n'
                                              'def shout(text: str) -> str:\n    return json.dumps(text.upper())\n')
    main = write_module(tmp_path, "pkg.main", '"""Main."""\nimport sys\n\nfrom pkg.base import (\n    shout,\n)\n\n\n'
                                              'if __name__ == "__main__":\n    print(shout(sys.argv[1]))\n')
    program = ship.Program.of_modules(base, main)
    assert program.name == "main.py" and program.source.startswith(b"from __future__ import annotations\n")
    assert b"from pkg.base" not in program.source
    ran = ship.run(local(tmp_path), sys.executable, program, ["hi"])
    assert ran.exit_code == 0 and ran.stdout == b'"HI"\n', ran.stderr

    with pytest.raises(ValueError, match="pkg.main imports shout from pkg.base, which is not an earlier module"):
        ship.Program.of_modules(main, base)
    twice = write_module(tmp_path, "pkg.twice", "def shout(text):\n    return text\n")
    with pytest.raises(ValueError, match="pkg.twice and pkg.base both define shout"):
        ship.Program.of_modules(base, twice)
    for text in ("import pkg.base\n", "from pkg import base\n", "from pkg.base import shout as loud\n"):
        with pytest.raises(ValueError):
            ship.Program.of_modules(base, write_module(tmp_path, "pkg.other", text))
