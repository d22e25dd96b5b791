"""The agent distribution this server was deployed with, offered at /downloads/.

`build()` builds a wheel and an sdist of `mado-tracking` (pyproject.toml, worker_agent/, mado_tracking/) from
this checkout into DOWNLOADS_DIR (MADO_DOWNLOADS_DIR, default VAR_DIR/downloads) and writes manifest.json (version, files, sha256) there last; `make run`
and the deployment steps run it through `manage.py build_agent`. The pages serve only the files the manifest
names, to anyone: pip sends no session cookie, and the agent is no secret (like a package index)."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path

from django.conf import settings
from django.http import FileResponse, Http404, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_safe
from packaging.version import InvalidVersion, Version

MANIFEST = "manifest.json"
CONTENT_TYPES = {"wheel": "application/zip", "sdist": "application/gzip"}


class BuildError(Exception):
    """The distribution could not be built; the message says what to fix."""


def directory() -> Path:
    return Path(settings.DOWNLOADS_DIR)


@lru_cache(maxsize=1)
def _project() -> dict:
    return tomllib.loads((Path(settings.BASE_DIR) / "pyproject.toml").read_text(encoding="utf-8"))


def checkout_version() -> str:
    return _project()["project"]["version"]


def wheel_filename(version: str) -> str:
    # PEP 427: the project name with runs of -_. turned into one underscore.
    name = re.sub(r"[-_.]+", "_", _project()["project"]["name"]).lower()
    return f"{name}-{version}-py3-none-any.whl"


def offered() -> dict | None:
    """The manifest of what /downloads/ serves, or None while nothing is built (or a file went missing)."""
    folder = directory()
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    files = manifest.get("files") or []
    if not files or not all((folder / f["filename"]).is_file() for f in files):
        return None
    return manifest


def agent_version() -> str:
    """The version a worker should run: the one offered, else (not built yet) the one in this checkout."""
    manifest = offered()
    return manifest["version"] if manifest else checkout_version()


def wheel_url(base_url: str) -> str:
    """What `pip install` takes, on a server reached at `base_url`."""
    return f"{base_url.rstrip('/')}/downloads/{wheel_filename(agent_version())}"


def is_older(version: str, than: str) -> bool:
    """True when a worker's reported `version` is an older release than `than` (PEP 440 order: 0.10 after
    0.9, 0.2.0rc1 before 0.2.0); a version that does not parse is never marked."""
    try:
        return Version(version) < Version(than)
    except (InvalidVersion, TypeError):
        return False


# -- build -----------------------------------------------------------------------------------------------

def _run(command: list[str], cwd: Path, what: str) -> str:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise BuildError(f"Building the {what} failed:\n{tail}")
    return result.stdout


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def build(dest: Path | None = None) -> dict:
    """Build the wheel and the sdist into `dest` (default DOWNLOADS_DIR) and return the manifest.

    The sources are copied first, so the build leaves nothing (build/, *.egg-info) in the checkout. The wheel
    is built from the sdist, as `python -m build` does, so a file missing from the sdist fails here, not on a
    lab's machine; pip builds it with the build backend pyproject.toml asks for (from the package index or
    pip's cache)."""
    root = Path(settings.BASE_DIR)
    project = _project()["project"]
    version = project["version"]
    agent = re.search(r'__version__ = "([^"]+)"', (root / "worker_agent" / "__init__.py").read_text())
    if not agent or agent.group(1) != version:
        raise BuildError(f"pyproject.toml says version {version} but worker_agent/__init__.py says "
                         f"{agent.group(1) if agent else 'nothing'}: make them equal, then build again.")
    dest = Path(dest or directory())
    dest.mkdir(parents=True, exist_ok=True)
    packages = sorted({name.split(".")[0] for name in _project()["tool"]["setuptools"]["packages"]})
    with tempfile.TemporaryDirectory(prefix=".build-", dir=dest.parent) as scratch:
        scratch = Path(scratch)
        source, out = scratch / "src", scratch / "out"
        source.mkdir()
        shutil.copy(root / "pyproject.toml", source)
        for package in packages:
            shutil.copytree(root / package, source / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        sdist_name = _run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                           "print(b.build_sdist(sys.argv[1]))", str(out)], source, "sdist").strip().splitlines()[-1]
        _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q",
              "-w", str(out / "wheel"), str(out / sdist_name)], scratch, "wheel")
        wheel = out / "wheel" / wheel_filename(version)
        if not wheel.is_file():
            raise BuildError(f"pip built {sorted(p.name for p in (out / 'wheel').iterdir())}, not {wheel.name}.")
        files = []
        for kind, path in (("wheel", wheel), ("sdist", out / sdist_name)):
            files.append({"kind": kind, "filename": path.name, "sha256": _sha256(path), "size": path.stat().st_size})
            os.replace(path, dest / path.name)
    manifest = {"name": project["name"], "version": version, "built_at": datetime.now(UTC).isoformat(),
                "files": files}
    tmp = dest / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, dest / MANIFEST)  # last: the pages never list a file that is not there yet
    keep = {MANIFEST} | {f["filename"] for f in files}
    for old in dest.iterdir():
        if old.is_file() and old.name not in keep:  # an earlier version's files
            old.unlink()
    return manifest


# -- pages -----------------------------------------------------------------------------------------------

def _described(request, manifest: dict) -> dict:
    files = {f["kind"]: {**f, "url": request.build_absolute_uri(reverse("download-file", args=[f["filename"]]))}
             for f in manifest["files"]}
    return {"name": manifest["name"], "version": manifest["version"], "built_at": manifest.get("built_at"),
            "wheel": files.get("wheel"), "sdist": files.get("sdist")}


@require_safe
def downloads_page(request):
    """Public, like a package index: the files pip installs without a session."""
    manifest = offered()
    return render(request, "mado/downloads.html", {
        "offer": _described(request, manifest) if manifest else None,
        "version": agent_version(),
        "pip_url": wheel_url(request.build_absolute_uri("/")),
    })


@require_safe
def latest(request):
    """What `mado-tracking-worker upgrade --from-server` reads: the wheel's name and sha256."""
    manifest = offered()
    if manifest is None:
        return JsonResponse({"error": _("This server offers no agent distribution yet: its operator builds it "
                                        "with `manage.py build_agent`."), "code": "not_built"}, status=404)
    return JsonResponse(_described(request, manifest))


@require_safe
def download_file(request, filename: str):
    manifest = offered()
    entry = next((f for f in (manifest or {}).get("files", []) if f["filename"] == filename), None)
    if entry is None:  # only the manifest's names: nothing else in (or outside) the folder is reachable
        raise Http404(_("%(name)s is not offered here. The agent's files are listed at /downloads/.")
                      % {"name": filename})
    return FileResponse((directory() / entry["filename"]).open("rb"), as_attachment=True,
                        filename=entry["filename"], content_type=CONTENT_TYPES[entry["kind"]])
