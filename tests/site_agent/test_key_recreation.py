"""Recreating a launcher key (seed 003 permissions: the shared key by the owner or a global
administrator, one's own key by anyone who can use the site): the launcher, against the live server
and the real sshd, makes a new ed25519 key on its next round, publishes it in place of the old one,
and logs in with it once the owner registered it."""
from __future__ import annotations

import os

import pytest

from mado.errors import ServiceError
from mado.models import AuditEvent
from mado.services import Actor
from sites import checks, keys
from sites.models import LauncherKey
from tests.site_agent.conftest import authorize
from tests.site_agent.site_world import launcher_for, make_site, registered, server  # noqa: F401


def test_a_recreated_shared_key_is_made_published_and_used_on_the_next_round(server, registered, world, sshd,
                                                                            remote_dir, tmp_path):
    launcher_row, token = registered
    target = make_site(world, launcher_row, sshd, remote_dir, server)
    os.mkdir(tmp_path / "state", 0o700)
    agent = launcher_for(server, token, tmp_path / "state")
    agent.round(wait=0)
    old = LauncherKey.objects.get(target=target, user=None)
    private = tmp_path / "state" / "keys" / f"{target.pk}-shared"
    old_private = private.read_text()

    with pytest.raises(ServiceError) as refused:
        keys.request_recreate(Actor(world.member), target, mine=False)
    assert refused.value.code in ("not_owner", "not_found")
    keys.request_recreate(Actor(target.owner), target, mine=False)
    assert AuditEvent.objects.filter(action="site.key.recreate_request").count() == 1
    listed = agent.api.config(wait=0)["sites"][0]["keys"]
    assert listed == [{"user": None, "fingerprint": old.fingerprint, "recreate": True}]

    agent.round(wait=0)
    new = LauncherKey.objects.get(target=target, user=None)
    assert new.fingerprint != old.fingerprint and new.recreate_requested_at is None
    assert private.read_text() != old_private
    assert agent.api.config(wait=0)["sites"][0]["keys"] == [{"user": None, "fingerprint": new.fingerprint,
                                                             "recreate": False}]

    # The owner registers the new key only: the launcher logs in with it.
    authorized = sshd.server_dir / "authorized_keys"
    blob = old.public_key.split()[1]
    authorized.write_text("".join(f"{line}\n" for line in authorized.read_text().splitlines() if blob not in line))
    authorize(sshd, new.public_key)
    check = checks.request_site_check(Actor(target.owner), target, mine=False)
    agent.round(wait=0)
    check.refresh_from_db()
    assert check.status == "succeeded", check.result
