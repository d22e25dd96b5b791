"""Pasted known_hosts: fingerprints computed with the standard library equal what `ssh-keygen -l`
prints, and host matching follows OpenSSH ([host]:port, hashed names, wildcards, negation)."""
from __future__ import annotations

import subprocess

import pytest

from sites import known_hosts as kh
from tests.sites.conftest import JUMP_HOST, LOGIN_HOST


def test_fingerprints_are_the_ones_ssh_keygen_prints(host_keys):
    keys = kh.parse(f"{host_keys.login_line}\n{host_keys.jump_line}\n{host_keys.rsa_line}")
    assert [k.fingerprint for k in keys] == [host_keys.login_fingerprint, host_keys.jump_fingerprint,
                                             host_keys.rsa_fingerprint]
    assert [k.key_type for k in keys] == ["ssh-ed25519", "ssh-ed25519", "ssh-rsa"]
    assert keys[0].display() == {"line": 1, "hosts": f"{LOGIN_HOST},10.0.0.5", "key_type": "ssh-ed25519",
                                 "fingerprint": host_keys.login_fingerprint, "marker": None}


def test_a_port_other_than_22_matches_only_the_bracketed_form(host_keys):
    keys = kh.parse(host_keys.jump_line)
    assert kh.keys_for(keys, JUMP_HOST, 2222)
    assert not kh.keys_for(keys, JUMP_HOST, 22)
    assert kh.keys_for(kh.parse(host_keys.login_line), "10.0.0.5", 22)


def test_hashed_host_names_match_like_openssh_does(tmp_path, host_keys):
    path = tmp_path / "known_hosts"
    path.write_text(host_keys.login_line + "\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(path)], capture_output=True, check=True)
    hashed = path.read_text()
    assert LOGIN_HOST not in hashed
    keys = kh.parse(hashed)
    assert all(k.hashed for k in keys) and keys[0].display()["hosts"] == "(hashed)"
    assert kh.keys_for(keys, LOGIN_HOST, 22) and kh.keys_for(keys, "10.0.0.5", 22)
    assert not kh.keys_for(keys, "other.example.org", 22)


def test_wildcards_negations_comments_and_markers(host_keys):
    kind, blob = host_keys.login_line.split()[1:3]
    text = (f"# scanned 2026-11-29\n\n*.hpc.example.org,!bad.hpc.example.org {kind} {blob} login key\n"
            f"@cert-authority *.hpc.example.org {kind} {blob}\n")
    keys = kh.parse(text)
    assert [k.line for k in keys] == [3, 4] and keys[0].comment == "login key"
    assert kh.keys_for(keys, LOGIN_HOST, 22)
    assert not kh.keys_for(keys, "bad.hpc.example.org", 22)
    assert len(kh.keys_for(keys, LOGIN_HOST, 22)) == 1  # a CA line is not the host's key


@pytest.mark.parametrize("line, says", [
    ("login.example.org", "expected 'host key-type base64-key'"),
    ("login.example.org ssh-foo AAAA", "unknown key type"),
    ("login.example.org ssh-ed25519 not*base64", "not valid base64"),
    ("@revoke login.example.org ssh-ed25519 AAAA", "unknown marker"),
])
def test_lines_that_are_not_known_hosts_lines_are_named_by_number(line, says):
    with pytest.raises(kh.KnownHostsError) as caught:
        kh.parse(f"# comment\n{line}\n")
    assert str(caught.value).startswith("Line 2:") and says in str(caught.value)


def test_a_key_whose_data_is_another_type_is_refused(host_keys):
    blob = host_keys.rsa_line.split()[2]
    with pytest.raises(kh.KnownHostsError, match="not a ssh-ed25519 key"):
        kh.parse(f"login.example.org ssh-ed25519 {blob}")
