"""Directory reads over a real sshd: names and kinds of one directory, and each error."""
from __future__ import annotations

import os
import socket

import pytest

from tests.agent.conftest import chown_tree
from worker_agent.reads import MAX_ENTRIES, parse_listing, read_directory
from worker_agent.ssh import ConnectionPool


def prepare_tree(sshd, root):
    (root / "data").mkdir()
    (root / "notes.txt").write_text("secret contents")
    (root / "train.sh").write_text("#!/bin/sh\n")
    (root / "train.sh").chmod(0o755)
    (root / ".hidden").mkdir()
    (root / ".env").write_text("X=1")
    (root / "with space").write_text("")
    (root / "line\nbreak").write_text("")
    (root / "ünïcode").write_text("")
    os.symlink("/etc", root / "etc-link")
    os.symlink(root / "missing", root / "dangling")
    (root / "locked").mkdir()
    chown_tree(sshd, root)
    (root / "locked").chmod(0o000)


def test_a_read_lists_names_and_kinds_including_hidden_entries(sshd, pool, target_dir):
    prepare_tree(sshd, target_dir)
    entries, error = read_directory(sshd.connection(), str(target_dir) + "/", pool)
    assert error is None
    assert sorted((e["name"], e["kind"]) for e in entries) == sorted([
        ("data", "dir"), ("notes.txt", "file"), ("train.sh", "exec"), (".hidden", "dir"), (".env", "file"),
        ("with space", "file"), ("line\nbreak", "file"), ("ünïcode", "file"), ("etc-link", "symlink"),
        ("dangling", "symlink"), ("locked", "dir"),
    ])
    assert all(set(e) == {"name", "kind"} for e in entries), "names and kinds only, never contents"


def test_each_error_is_mapped(sshd, pool, target_dir):
    prepare_tree(sshd, target_dir)
    assert read_directory(sshd.connection(), str(target_dir / "nope") + "/", pool) == ([], "not_found")
    assert read_directory(sshd.connection(), str(target_dir / "notes.txt"), pool) == ([], "not_a_directory")
    assert read_directory(sshd.connection(), str(target_dir / "locked") + "/", pool) == ([], "permission_denied")
    assert read_directory(sshd.connection(), "/root/", pool) == ([], "permission_denied")
    assert read_directory(sshd.connection(), str(target_dir / "dangling"), pool) == ([], "not_found")
    entries, error = read_directory(sshd.connection(), str(target_dir / "etc-link"), pool)
    assert error is None and any(e["name"] == "passwd" for e in entries), "a link to a directory is read through"


def test_an_unreachable_target_is_connect_failed(sshd, pool, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert read_directory(sshd.connection(port=port), "/", pool) == ([], "connect_failed")
    empty = tmp_path / "kh"
    empty.write_text("")
    assert read_directory(sshd.connection(known_hosts_path=str(empty)), "/", pool) == ([], "connect_failed")


def test_reads_reuse_one_connection(sshd, target_dir):
    pool = ConnectionPool()
    try:
        read_directory(sshd.connection(), str(target_dir), pool)
        connection = next(iter(pool._connections.values()))
        transport = connection._client.get_transport()
        for _ in range(5):
            read_directory(sshd.connection(), str(target_dir), pool)
        assert connection._client.get_transport() is transport and len(pool._connections) == 1
    finally:
        pool.close_all()


def test_a_huge_directory_is_cut_at_the_protocol_limit(sshd, pool, target_dir):
    big = target_dir / "big"
    big.mkdir()
    for i in range(MAX_ENTRIES + 20):
        (big / f"f{i:05d}").touch()
    entries, error = read_directory(sshd.connection(), str(big), pool)
    assert error is None and len(entries) == MAX_ENTRIES


def test_a_home_relative_path_reads_the_login_users_home(sshd, pool):
    entries, error = read_directory(sshd.connection(), "~/", pool)
    assert error is None and ".profile" in {e["name"] for e in entries}


def test_the_listing_parser_skips_login_shell_noise_and_garbage():
    noisy = b"Welcome to gpu-host-1!\n@@mado-list@@ OK\ndir/a\0weird/b\0file/\0exec/c\0"
    assert parse_listing(noisy) == ([{"name": "a", "kind": "dir"}, {"name": "c", "kind": "exec"}], None)
    assert parse_listing(b"@@mado-list@@ ERR not_found\n") == ([], "not_found")
    with pytest.raises(ValueError):
        parse_listing(b"bash: sh: command not found\n")
