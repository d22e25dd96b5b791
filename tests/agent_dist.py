"""The agent distribution built once per test session from this checkout (mado.downloads.build, what
`manage.py build_agent` runs), and served by the server under test from settings.DOWNLOADS_DIR."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def agent_build(tmp_path_factory) -> dict:
    from mado import downloads

    var = tmp_path_factory.mktemp("agent-var")
    manifest = downloads.build(var / "downloads")
    return {"var": var, "manifest": manifest, **{f["kind"]: f for f in manifest["files"]}}


@pytest.fixture
def offered_agent(agent_build, settings, tmp_path) -> dict:
    """The session's build, copied into this test's own VAR_DIR (a test may add or remove files there)."""
    var = tmp_path / "var"
    shutil.copytree(agent_build["var"] / "downloads", var / "downloads")
    settings.DOWNLOADS_DIR = var / "downloads"
    return {**agent_build, "var": var, "downloads": Path(var / "downloads")}
