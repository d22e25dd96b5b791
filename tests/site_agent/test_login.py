"""Logging in to a site's login node (a real sshd) with the launcher's key and the site's pasted
known_hosts text only: accepted keys, refused keys named by fingerprint, hashed lines, jump hosts."""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.site_agent.conftest import fingerprint_of, known_hosts_text
from worker_agent.site.login import ConnectError, SiteConnection, run_script


def other_host_key(tmp_path, name="other") -> tuple[str, str]:
    """A key pair that is not the server's: (its public 'type base64' text, its fingerprint)."""
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)], check=True)
    kind, blob = path.with_name(name + ".pub").read_text().split()[:2]
    return f"{kind} {blob}", fingerprint_of(path.with_name(name + ".pub"))


def test_a_login_with_the_pasted_known_hosts_runs_a_script_as_the_account(pool, login, sshd):
    connection = pool.get(login())
    result = run_script(connection, 'set -eu\necho "$(id -un) $HOME"\necho warn >&2\nexit 3\n', timeout=20)
    assert result.exit_code == 3
    assert result.stdout.decode().split() == [sshd.user, str(sshd.home)]
    assert result.stderr == b"warn\n"


def test_the_connection_is_reused_within_60_seconds(pool, login):
    first = pool.get(login())
    assert pool.get(login()) is first
    assert pool.idle_seconds == 60
    fresh = pool.get(login(), fresh=True)
    assert fresh is not first and pool.get(login()) is fresh


def test_a_changed_host_key_is_refused_naming_the_fingerprint_seen_and_the_one_listed(login, sshd, tmp_path):
    wrong, wrong_fp = other_host_key(tmp_path)
    text = f"[127.0.0.1]:{sshd.port} {wrong}\n"
    with pytest.raises(ConnectError) as refused:
        SiteConnection(login(known_hosts=text)).open()
    seen = fingerprint_of(sshd.server_dir / "host_ed25519.pub")
    assert refused.value.code == "host_key_changed"
    assert f"The host key of [127.0.0.1]:{sshd.port} is {seen} (ssh-ed25519)" in refused.value.detail
    assert f"known_hosts lists {wrong_fp}" in refused.value.detail
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1" in refused.value.detail


def test_a_host_missing_from_known_hosts_is_refused_with_the_fingerprint_to_compare(login, sshd, tmp_path):
    key, _ = other_host_key(tmp_path)
    with pytest.raises(ConnectError) as refused:
        SiteConnection(login(known_hosts=f"login.example.org {key}\n")).open()
    seen = fingerprint_of(sshd.server_dir / "host_ed25519.pub")
    assert refused.value.code == "host_key_unknown"
    assert seen in refused.value.detail and "has no key for" in refused.value.detail


def test_the_users_own_known_hosts_is_never_read(login, sshd, isolated_home):
    """A key the launcher's account trusts in ~/.ssh/known_hosts does not let it in: only the pasted text counts."""
    ssh = isolated_home / ".ssh"
    ssh.mkdir(mode=0o700)
    (ssh / "known_hosts").write_text(sshd.known_hosts_path.read_text())
    with pytest.raises(ConnectError) as refused:
        SiteConnection(login(known_hosts="")).open()
    assert refused.value.code == "host_key_unknown"


def test_a_hashed_known_hosts_line_is_accepted(login, pool, sshd, tmp_path):
    hashed = tmp_path / "known_hosts"
    hashed.write_text(sshd.known_hosts_path.read_text())
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(hashed)], check=True, capture_output=True)
    assert hashed.read_text().startswith("|1|")
    connection = pool.get(login(known_hosts=hashed.read_text()))
    assert run_script(connection, "true", timeout=20).exit_code == 0


def test_a_revoked_key_is_refused_even_when_also_listed(login, sshd):
    public = (sshd.server_dir / "host_ed25519.pub").read_text().split()
    text = known_hosts_text(sshd) + f"@revoked * {public[0]} {public[1]}\n"
    with pytest.raises(ConnectError) as refused:
        SiteConnection(login(known_hosts=text)).open()
    assert "@revoked" in refused.value.detail


def test_a_key_the_site_does_not_accept_is_refused_with_where_to_register_it(login, keystore):
    stranger, _ = keystore.ensure(99, None)  # never authorized
    with pytest.raises(ConnectError) as refused:
        SiteConnection(login(key_path=str(stranger.path))).open()
    assert refused.value.code == "ssh_failed"
    assert "refused the launcher's key" in refused.value.detail and "authorized_keys" in refused.value.detail


def test_a_login_hops_through_a_jump_host_with_direct_tcpip(login, pool, sshd, jump_sshd):
    site = login(jump_hosts=(f"127.0.0.1:{jump_sshd.port}",), known_hosts=known_hosts_text(sshd, jump_sshd))
    connection = pool.get(site)
    result = run_script(connection, 'echo "$SSH_CONNECTION"', timeout=20)
    assert result.exit_code == 0
    # The login node sees the connection coming from the jump host's sshd, not from this process.
    client_port = int(result.stdout.split()[1])
    owner = subprocess.run(["ss", "-Htnp", f"sport = :{client_port}"], capture_output=True, text=True).stdout
    assert '"sshd"' in owner and f"pid={os.getpid()}," not in owner, owner
    assert len(connection._jumps) == 1


def test_the_jump_hosts_key_is_checked_too(login, sshd, jump_sshd):
    site = login(jump_hosts=(f"127.0.0.1:{jump_sshd.port}",), known_hosts=known_hosts_text(sshd))
    with pytest.raises(ConnectError) as refused:
        SiteConnection(site).open()
    assert refused.value.code == "host_key_unknown" and f"[127.0.0.1]:{jump_sshd.port}" in refused.value.detail


def test_a_jump_host_that_cannot_reach_the_login_node_says_so(login, sshd, jump_sshd):
    from tests.peers.sshd import free_port

    closed = free_port()
    site = login(port=closed, jump_hosts=(f"127.0.0.1:{jump_sshd.port}",), known_hosts=known_hosts_text(jump_sshd))
    with pytest.raises(ConnectError) as refused:
        SiteConnection(site).open()
    assert f"could not open a connection to 127.0.0.1:{closed}" in refused.value.detail


def test_more_than_eight_jump_hosts_are_refused_before_connecting(login):
    with pytest.raises(ConnectError) as refused:
        SiteConnection(login(jump_hosts=tuple(f"j{i}.example.org" for i in range(9)))).open()
    assert "At most 8 jump hosts" in refused.value.detail
