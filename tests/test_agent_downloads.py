"""The agent from the server (issue 21): /downloads/ offers the mado-tracking wheel and sdist this checkout
builds, to anyone (pip has no session); the install commands the pages show point at it; the Workers list
marks workers older than it. The install test runs the Worker settings block as written: pip takes the wheel
from the live server and its dependencies from the package index (reachable on these machines)."""
from __future__ import annotations

import hashlib
import html as htmllib
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from django.urls import reverse

import worker_agent
from tests.agent_dist import agent_build, offered_agent  # noqa: F401  (fixtures)
from tests.computer_fixtures import ScriptedWorker, make_computer

ROOT = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
WHEEL = f"mado_tracking-{VERSION}-py3-none-any.whl"


def text(response) -> str:
    return htmllib.unescape(response.content.decode()).replace("\xa0", " ")


def block(page: str, pre_id: str) -> str:
    return re.search(rf'<pre id="{pre_id}">(.*?)</pre>', page, re.DOTALL).group(1)


def body(response) -> bytes:
    return b"".join(response.streaming_content)


def test_the_checkout_agrees_on_the_agents_version(settings):
    assert worker_agent.__version__ == VERSION == settings.VERSION


# -- /downloads/ ---------------------------------------------------------------------------------------------

def test_a_signed_out_visitor_sees_the_wheel_and_the_sdist_with_sha256s_that_match_the_files(client, offered_agent):
    page = text(client.get("/downloads/"))
    assert f"pip install http://testserver/downloads/{WHEEL}" in block(page, "agent-pip")
    assert "mado-tracking-worker upgrade --worker-id \"$(hostname)\" --from-server" in page
    for kind, content_type in (("wheel", "application/zip"), ("sdist", "application/gzip")):
        entry = offered_agent[kind]
        row = re.search(rf'<tr data-kind="{kind}">(.*?)</tr>', page, re.DOTALL).group(1)
        assert entry["filename"] in row and entry["sha256"] in row
        response = client.get(f"/downloads/{entry['filename']}")
        assert response.status_code == 200 and response["Content-Type"] == content_type
        assert f'filename="{entry["filename"]}"' in response["Content-Disposition"]
        assert hashlib.sha256(body(response)).hexdigest() == entry["sha256"]
    assert offered_agent["sdist"]["filename"].startswith(("mado-tracking-", "mado_tracking-"))
    assert f"-{VERSION}.tar.gz" in offered_agent["sdist"]["filename"]
    assert offered_agent["wheel"]["filename"] == WHEEL


def test_latest_json_names_the_wheel_and_its_sha256(client, offered_agent):
    answer = client.get("/downloads/latest.json").json()
    assert answer["name"] == "mado-tracking" and answer["version"] == VERSION
    assert answer["wheel"]["filename"] == WHEEL and answer["wheel"]["sha256"] == offered_agent["wheel"]["sha256"]
    assert answer["wheel"]["url"] == f"http://testserver/downloads/{WHEEL}"
    assert answer["sdist"]["sha256"] == offered_agent["sdist"]["sha256"]


def test_nothing_but_the_offered_files_is_served(client, offered_agent):
    (offered_agent["downloads"] / "notes.txt").write_text("not offered")
    (offered_agent["var"] / "secret_key").write_text("s3cret")
    for name in ("notes.txt", "manifest.json", "mado_tracking-9.9.9-py3-none-any.whl"):
        response = client.get(f"/downloads/{name}")
        assert response.status_code == 404
        assert f"{name} is not offered here. The agent's files are listed at /downloads/." in text(response)
    for path in ("/downloads/../secret_key", "/downloads/%2e%2e/secret_key", "/downloads/..%2fsecret_key"):
        response = client.get(path)
        assert response.status_code == 404 and b"s3cret" not in response.content


def test_a_server_that_has_not_built_the_agent_says_how_to(client, settings, tmp_path):
    settings.DOWNLOADS_DIR = tmp_path / "downloads"
    page = text(client.get("/downloads/"))
    assert "The agent distribution has not been built on this server yet. Its operator builds it with: " \
           "manage.py build_agent" in page
    answer = client.get("/downloads/latest.json")
    assert answer.status_code == 404 and answer.json()["code"] == "not_built"
    assert "manage.py build_agent" in answer.json()["error"]
    assert client.get(f"/downloads/{WHEEL}").status_code == 404


def test_build_agent_replaces_an_earlier_versions_files(offered_agent, settings):
    from django.core.management import call_command

    stale = offered_agent["downloads"] / "mado_tracking-0.0.1-py3-none-any.whl"
    stale.write_bytes(b"old")
    call_command("build_agent", stdout=open(os.devnull, "w"))
    names = sorted(p.name for p in offered_agent["downloads"].iterdir())
    assert names == sorted(["manifest.json", WHEEL, offered_agent["sdist"]["filename"]])


# -- the install commands the pages show -------------------------------------------------------------------

def test_the_worker_settings_block_run_as_written_installs_the_servers_wheel_and_both_commands_answer(
        transactional_db, live_server, world, client, settings, offered_agent, tmp_path):
    """The Done-when of issue 21 part 1: the wheel built from this checkout, served by the live server,
    installed with pip into a fresh venv, and `mado-tracking-worker --help` and `mado-tracking --help` from
    there. pip checks a `#sha256=` fragment: a wrong one is refused (what `upgrade --from-server` relies on)."""
    settings.PUBLIC_URL = live_server.url
    target = make_computer(world.global_admin, "gpu-ssh", visibility="public")
    client.force_login(world.global_admin)
    commands = block(text(client.get(reverse("computer-detail", args=[target.pk]))), "worker-pip")
    assert f"pip install {live_server.url}/downloads/{WHEEL}" in commands
    home = tmp_path / "home"
    home.mkdir()
    script = "set -e\n" + commands + "\nmado-tracking-worker --help\necho '--'\nmado-tracking --help\n" \
                                     "mado-tracking-worker --version\n"
    run = subprocess.run(["bash", "-c", script], env={**os.environ, "HOME": str(home)}, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    worker_help, researcher_help = run.stdout.split("\n--\n")
    for name in ("run", "install", "upgrade", "status", "doctor"):
        assert f"  {name} " in worker_help
    assert "--from-server" in subprocess.run([str(home / ".local/share/mado-tracking-worker/venv/bin/"
                                                   "mado-tracking-worker"), "upgrade", "--help"],
                                             capture_output=True, text=True, check=True).stdout
    assert "  submit " in researcher_help
    assert researcher_help.rstrip().endswith(f"mado-tracking-worker, version {VERSION}")
    venv = home / ".local/share/mado-tracking-worker/venv"
    assert (venv / "bin/mado-tracking-worker").read_text().startswith(f"#!{venv}/bin/python")

    tampered = subprocess.run([str(venv / "bin/pip"), "install", "--no-deps", "--force-reinstall",
                               f"mado-tracking @ {live_server.url}/downloads/{WHEEL}#sha256={'0' * 64}"],
                              capture_output=True, text=True, timeout=300)
    assert tampered.returncode != 0 and "DO NOT MATCH THE HASHES" in tampered.stderr


def test_the_worker_settings_block_points_pip_at_this_servers_public_url(client, world, settings, offered_agent):
    settings.PUBLIC_URL = "https://tracking.example.internal"
    target = make_computer(world.global_admin, "gpu-ssh", visibility="public")
    client.force_login(world.global_admin)
    page = text(client.get(reverse("computer-detail", args=[target.pk])))
    assert block(page, "worker-pip").splitlines() == [
        "python3 -m venv ~/.local/share/mado-tracking-worker/venv",
        f"~/.local/share/mado-tracking-worker/venv/bin/pip install https://tracking.example.internal/downloads/{WHEEL}",
        'export PATH="$HOME/.local/share/mado-tracking-worker/venv/bin:$PATH"',
    ]
    assert block(page, "worker-install").startswith("mado-tracking-worker install --api-url "
                                                    "https://tracking.example.internal")


def test_the_docs_install_the_agent_from_the_server():
    for doc in ("sites.md", "sdk.md"):
        content = (ROOT / "docs" / doc).read_text()
        assert f"/downloads/{WHEEL}" in content, doc
        assert not re.search(r"pip install mado-tracking\b", content), doc


# -- Upgrade available ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("language, label", [("en", "Upgrade available"), ("ja", "更新あり")])
def test_the_workers_list_marks_workers_older_than_the_servers_agent(client, world, offered_agent, language,
                                                                     label):
    reported = {"w-old": "0.0.9", "w-rc": f"{VERSION}rc1", "w-same": VERSION, "w-newer": "99.0", "w-odd": "dev"}
    for worker_id, version in reported.items():
        assert ScriptedWorker(world.worker_token, worker_id).hello(version=version).status_code == 200
    client.force_login(world.viewer)
    page = text(client.get(reverse("project-compute", args=["lab"]), HTTP_ACCEPT_LANGUAGE=language))
    rows = {m.group(1): m.group(2) for m in re.finditer(r'<tr data-worker="([^"]+)">(.*?)</tr>', page, re.DOTALL)}
    assert sorted(rows) == sorted(reported)
    marked = sorted(worker_id for worker_id, row in rows.items() if label in row)
    assert marked == ["w-old", "w-rc"]
    assert 'href="/downloads/"' in rows["w-old"] and reported["w-old"] in rows["w-old"]
