"""The agent installs from a checkout with `pip install '.[telemetry]'` into a fresh venv, as the
install guide says, and its command answers. Needs PyPI (reachable on these machines)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_pip_install_with_telemetry_into_a_fresh_venv_gives_the_command(tmp_path):
    # The distribution is pyproject.toml + worker_agent/ + mado_tracking/ (the SDK): copy them, so the build
    # leaves nothing in the checkout.
    source = tmp_path / "src"
    source.mkdir()
    shutil.copy(REPO / "pyproject.toml", source)
    for package in ("worker_agent", "mado_tracking"):
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin/pip"), "install", "--disable-pip-version-check", "-q",
                          f"{source}[telemetry]"], capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout + pip.stderr

    help_text = subprocess.run([str(venv / "bin/mado-tracking-worker"), "--help"], capture_output=True, text=True,
                               check=True).stdout
    for name in ("run", "install", "upgrade", "status", "doctor"):
        assert f"  {name} " in help_text
    # What the systemd unit runs, and the parts that are not Python code in the usual sense.
    module = subprocess.run([str(venv / "bin/python"), "-m", "worker_agent", "--version"], capture_output=True,
                            text=True, check=True).stdout
    assert module.strip() == "mado-tracking-worker, version 0.1.0"
    extras = subprocess.run([str(venv / "bin/python"), "-c",
                             "import pynvml, paramiko, requests, click; from worker_agent.probe import PROBE_SOURCE; "
                             "print(len(PROBE_SOURCE) > 1000)"], capture_output=True, text=True)
    assert extras.stdout.strip() == "True", extras.stderr
    # Django is not in this venv: importing every module of the agent proves none of them needs it.
    modules = sorted(p.stem for p in (REPO / "worker_agent").glob("*.py") if p.stem != "__main__")
    imported = subprocess.run([str(venv / "bin/python"), "-c",
                               "import importlib, sys\n"
                               f"for m in {modules!r}: importlib.import_module('worker_agent.' + m)\n"
                               "import mado_tracking\n"
                               "print(any(name.split('.')[0] == 'django' for name in sys.modules))"],
                              capture_output=True, text=True)
    assert imported.stdout.strip() == "False", imported.stderr
    assert subprocess.run([str(venv / "bin/python"), "-c", "import django"], capture_output=True).returncode != 0
