"""Issue 14, finding 6 (the UI half): on a Public SSH computer every project's Jobs run as the computer's
one SSH user. Add/Edit computer say so next to Visibility when Public is chosen, and the people who use
the computer see that user's name (only the name: host, port and key paths stay with owners and global
administrators)."""
from __future__ import annotations

import html as htmllib
import re

import pytest
from django.urls import reverse

from tests.computer_fixtures import SSH_FIELDS, make_computer
from tests.conftest import bearer

HTMX = {"HTTP_HX_REQUEST": "true"}
NOTE = "Jobs of every Project run as this SSH user and can read whatever it can read"

pytestmark = pytest.mark.django_db


def html(response) -> str:
    return htmllib.unescape(response.content.decode()).replace("\xa0", " ")


@pytest.fixture
def shared(world):
    return make_computer(world.global_admin, "shared-gpu", visibility="public", **SSH_FIELDS)


def test_add_and_edit_computer_say_what_public_means_for_the_ssh_user(client, world, shared):
    """The note is in the form and shown by CSS while Public is chosen (tests/test_browser_add_computer.py
    watches it appear in Chromium): choosing Visibility redraws nothing, so nothing typed is lost."""
    client.force_login(world.global_admin)
    for url in (reverse("computer-add"), reverse("computer-edit", args=[shared.pk])):
        page = html(client.get(url, **HTMX))
        assert NOTE in page and "Job directories are private to this user, not to each Project" in page
        select = re.search(r'<select name="visibility"[^>]*>', page).group(0)
        assert "hx-post" not in select, "choosing Visibility must not redraw the form over what was typed"


@pytest.mark.parametrize("who", ["member", "viewer", "outsider"])
def test_people_who_use_a_public_computer_see_who_their_jobs_run_as_and_nothing_else(client, world, shared, who):
    user = getattr(world, who)
    client.force_login(user)
    page = html(client.get(reverse("computer-detail", args=[shared.pk]), **HTMX))
    assert "Jobs run as" in page and '<code id="computer-ssh-user">mmt</code>' in page
    assert "Jobs of every Project run as this one SSH user" in page
    for secret in (SSH_FIELDS["host"], SSH_FIELDS["ssh_key_path"], SSH_FIELDS["known_hosts_path"]):
        assert secret not in page
    project = world.other_project if who == "outsider" else world.project
    body = bearer(world.member_token(user, project)).get(f"/api/computers/{shared.pk}").json()
    assert body["ssh_user"] == "mmt"
    assert "host" not in body and "ssh_key_path" not in body and "known_hosts_path" not in body


def test_the_ssh_user_of_a_computer_one_cannot_use_stays_hidden(client, world):
    private = make_computer(world.global_admin, "root-only", **SSH_FIELDS)
    body = bearer(world.member_token(world.member)).get("/api/computers").json()
    [item] = [i for i in body["items"] if i["id"] == private.pk]
    assert "ssh_user" not in item
    client.force_login(world.member)
    assert client.get(reverse("computer-detail", args=[private.pk]), **HTMX).status_code == 404
