"""`mado-tracking-worker upgrade --from-server`: the worker installed against the live test server asks it
(/downloads/latest.json, at the API URL install wrote) for its agent and hands pip the wheel's URL with the
sha256 the server listed. systemctl and pip go through the recording runner of test_cli (no systemd here,
and pip would install into this checkout's venv, which the unit file names); that pip itself refuses a wheel
whose sha256 differs is shown in tests/test_agent_downloads.py with a real pip."""
from __future__ import annotations

import sys

import pytest

from tests.agent.test_cli import UNREACHABLE, FakeRunner, invoke
from tests.agent_dist import agent_build, offered_agent  # noqa: F401  (fixtures)

ACTIVE = {("systemctl", "--user", "show"): (0, "ActiveState=active\nSubState=running\n", "")}
RESTART = ["systemctl", "--user", "restart", "mado-tracking-worker@w1.service"]


@pytest.fixture
def installed_against_the_server(transactional_db, live_server, world, isolated_home) -> str:
    result = invoke(["install", "--api-url", live_server.url, "--worker-id", "w1"], input=world.worker_token)
    assert result.exit_code == 0, result.output
    return live_server.url


def test_it_installs_the_servers_wheel_pinned_to_its_sha256_then_restarts(installed_against_the_server,
                                                                          offered_agent):
    runner = FakeRunner(ACTIVE)
    result = invoke(["upgrade", "--worker-id", "w1", "--from-server"], runner)
    assert result.exit_code == 0, result.output
    wheel, version = offered_agent["wheel"], offered_agent["manifest"]["version"]
    assert runner.calls[1] == [
        sys.executable, "-m", "pip", "install", "--upgrade", "--disable-pip-version-check",
        f"mado-tracking[telemetry] @ {installed_against_the_server}/downloads/{wheel['filename']}"
        f"#sha256={wheel['sha256']}"]
    assert runner.calls[2] == RESTART
    assert f"The server offers mado-tracking {version} ({wheel['filename']})." in result.output
    assert "Running jobs were not stopped" in result.output


def test_when_pip_fails_the_unit_is_not_restarted(installed_against_the_server, offered_agent):
    refused = "ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE."
    runner = FakeRunner({**ACTIVE, (sys.executable,): (1, "", refused)})
    result = invoke(["upgrade", "--worker-id", "w1", "--from-server"], runner)
    assert result.exit_code == 1
    assert "pip failed, so mado-tracking-worker@w1.service was not restarted" in result.stderr
    assert refused in result.stderr
    assert RESTART not in runner.calls and not any("restart" in call for call in runner.calls)


def test_a_server_that_offers_no_agent_changes_nothing(installed_against_the_server, settings, tmp_path):
    settings.DOWNLOADS_DIR = tmp_path  # nothing built there
    runner = FakeRunner(ACTIVE)
    result = invoke(["upgrade", "--worker-id", "w1", "--from-server"], runner)
    assert result.exit_code == 1
    assert (f"{installed_against_the_server}/downloads/latest.json answered 404: This server offers no agent "
            "distribution yet: its operator builds it with `manage.py build_agent`. Nothing was changed.") \
        in result.stderr
    assert runner.calls == []


def test_an_unreachable_server_changes_nothing(isolated_home):
    assert invoke(["install", "--api-url", UNREACHABLE, "--worker-id", "w1"],
                  input="mmt_" + "Zq3" * 14 + "x").exit_code == 0
    runner = FakeRunner(ACTIVE)
    result = invoke(["upgrade", "--worker-id", "w1", "--from-server"], runner)
    assert result.exit_code == 1
    assert f"Cannot reach {UNREACHABLE}/downloads/latest.json (ConnectionError)" in result.stderr
    assert "nothing was changed" in result.stderr and runner.calls == []


@pytest.mark.parametrize("extra", [["--version", "0.2.0"], ["--package-spec", "/some/wheel.whl"]])
def test_from_server_goes_alone(isolated_home, extra):
    runner = FakeRunner(ACTIVE)
    result = invoke(["upgrade", "--worker-id", "w1", "--from-server", *extra], runner)
    assert result.exit_code == 1 and runner.calls == []
    assert "Give --from-server alone, or one of --version and --package-spec: not both." in result.stderr
