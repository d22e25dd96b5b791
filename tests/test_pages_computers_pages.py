"""The Computers list under Global settings in pages of 50 (issue 19: a thousand computers must not be
drawn at once; docs/decisions.md "Long lists"): the pager, the refresh after a change keeping its page,
the details opened by their address showing the page that holds their row, in English and Japanese."""
from __future__ import annotations

import re

import pytest
from django.urls import reverse

from computers.models import ComputeTarget
from tests.test_pages_computers import HTMX, KEY, KNOWN_HOSTS, html, signed_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def thousand(world):
    """node-0000 … node-0999; the odd ones are Private computers of the global administrator."""
    ComputeTarget.objects.bulk_create(
        ComputeTarget(name=f"node-{i:04d}", kind="ssh", owner=world.global_admin,
                      visibility="private" if i % 2 else "public", host=f"node-{i}.internal", ssh_user="mmt",
                      ssh_key_path=KEY, known_hosts_path=KNOWN_HOSTS, working_dir="/data/jobs",
                      python_path="/usr/bin/python3")
        for i in range(1000))
    return {t.name: t for t in ComputeTarget.objects.all()}


def rows(page: str) -> list[str]:
    return re.findall(r'<tr data-computer="([^"]+)">', page)


def pager(page: str) -> str:
    found = re.search(r'<nav class="pager"[^>]*>(.*?)</nav>', page, re.DOTALL)
    return found.group(1) if found else ""


def test_the_list_shows_50_computers_by_name_with_a_pager_to_the_next_ones(client, world, thousand):
    signed_in(client, world.member)
    first = html(client.get(reverse("computers")))
    assert rows(first) == [f"node-{i:04d}" for i in range(50)]
    assert "Page 1 of 20" in pager(first) and "Previous" not in pager(first)
    assert f'href="{reverse("computers")}?page=2">Next</a>' in pager(first)
    last = html(client.get(reverse("computers") + "?page=20"))
    assert rows(last) == [f"node-{i:04d}" for i in range(950, 1000)]
    assert "Page 20 of 20" in pager(last) and "Next" not in pager(last)
    assert f'href="{reverse("computers")}?page=19">Previous</a>' in pager(last)
    # An address that is not a page number shows a page rather than an error.
    assert rows(html(client.get(reverse("computers") + "?page=999"))) == rows(last)
    assert rows(html(client.get(reverse("computers") + "?page=x"))) == rows(first)


def test_every_row_of_a_later_page_keeps_its_link_state_and_actions(client, world, thousand):
    """A member uses the Public computers (a link to the details) and sees the Private ones by name only;
    the global administrator manages every row."""
    page = html(signed_in(client, world.member).get(reverse("computers") + "?page=3"))
    public = re.search(r'<tr data-computer="node-0100">(.*?)</tr>', page, re.DOTALL).group(1)
    private = re.search(r'<tr data-computer="node-0101">(.*?)</tr>', page, re.DOTALL).group(1)
    assert f'href="{reverse("computer-detail", args=[thousand["node-0100"].pk])}"' in public
    assert "<a " not in private and "Private" in private and "Disabled" in private
    assert "Edit computer" not in page
    managed = html(signed_in(client, world.global_admin).get(reverse("computers") + "?page=3"))
    row = re.search(r'<tr data-computer="node-0101">(.*?)</tr>', managed, re.DOTALL).group(1)
    for action in ["Edit computer", "Enable", "Open connection check"]:
        assert action in row


def test_a_change_refreshes_the_page_the_person_is_on(client, world, thousand):
    signed_in(client, world.global_admin)
    page = html(client.get(reverse("computers") + "?page=3"))
    refresh = re.search(r'<div id="computer-list" hx-get="([^"]+)"', page).group(1)
    assert refresh == f"{reverse('computers')}?fragment=list&page=3"
    target = thousand["node-0120"]
    response = client.post(reverse("computer-enabled", args=[target.pk]), {"enabled": "1"}, **HTMX)
    assert response.status_code == 204
    fragment = html(client.get(refresh, **HTMX))
    assert fragment.lstrip().startswith('<div id="computer-list"') and "<html" not in fragment
    assert rows(fragment) == [f"node-{i:04d}" for i in range(100, 150)]
    row = re.search(r'<tr data-computer="node-0120">(.*?)</tr>', fragment, re.DOTALL).group(1)
    assert "Enabled" in row and "Page 3 of 20" in pager(fragment)


def test_details_opened_by_their_address_show_the_page_that_holds_their_row(client, world, thousand):
    signed_in(client, world.member)
    target = thousand["node-0456"]
    page = html(client.get(reverse("computer-detail", args=[target.pk])))
    assert 'id="computer-details"' in page and "node-0456" in rows(page)
    assert "Page 10 of 20" in pager(page)
    # A page named in the address wins; the pager leads back to the list itself.
    named = html(client.get(reverse("computer-detail", args=[target.pk]) + "?page=2"))
    assert rows(named)[0] == "node-0050" and 'id="computer-details"' in named
    assert f'href="{reverse("computers")}?page=3">Next</a>' in pager(named)


def test_a_short_list_has_no_pager(client, world):
    ComputeTarget.objects.bulk_create(
        ComputeTarget(name=f"node-{i:04d}", kind="ssh", owner=world.global_admin, visibility="public",
                      host=f"node-{i}.internal", ssh_user="mmt", ssh_key_path=KEY, known_hosts_path=KNOWN_HOSTS)
        for i in range(50))
    page = html(signed_in(client, world.member).get(reverse("computers")))
    assert len(rows(page)) == 50 and 'class="pager"' not in page


def test_the_pager_is_translated_to_japanese(client, world, thousand):
    signed_in(client, world.member)
    page = html(client.get(reverse("computers") + "?page=2", HTTP_ACCEPT_LANGUAGE="ja"))
    assert "20ページ中2ページ" in pager(page)
    assert ">前へ</a>" in pager(page) and ">次へ</a>" in pager(page)
    assert 'aria-label="ページ"' in page
