"""The launcher's keys: ed25519 made once per (site, account) with mode 600 in a 700 directory, the
fingerprint as ssh-keygen prints it, and a private key others could read refused at login."""
from __future__ import annotations

import os
import stat

import pytest

from tests.site_agent.conftest import fingerprint_of
from worker_agent.site.login import ConnectError, SiteConnection


def test_a_key_is_made_once_per_site_and_account_with_mode_600(keystore):
    shared, made = keystore.ensure(7, None)
    again, made_again = keystore.ensure(7, None)
    personal, _ = keystore.ensure(7, 3)
    assert made and not made_again and again == shared and personal.path != shared.path
    assert stat.S_IMODE(os.lstat(keystore.dir).st_mode) == 0o700
    for pair in (shared, personal):
        assert stat.S_IMODE(os.lstat(pair.path).st_mode) == 0o600
        assert pair.public_key.startswith("ssh-ed25519 ")
        assert "PRIVATE" not in pair.public_key
        assert pair.fingerprint == fingerprint_of(pair.path.with_name(pair.path.name + ".pub"))
    assert personal.public_key.endswith("mado-launcher-7-user-3")


def test_a_private_key_readable_by_others_is_not_used(login, site_key):
    site_key.path.chmod(0o644)
    try:
        with pytest.raises(ConnectError) as refused:
            SiteConnection(login()).open()
    finally:
        site_key.path.chmod(0o600)
    assert refused.value.code == "ssh_configuration" and "mode 644" in refused.value.detail
