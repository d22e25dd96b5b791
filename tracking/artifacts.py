"""MLflow's proxied artifact API (`mlflow-artifacts:` URIs): a Run's artifact_uri is
`mlflow-artifacts:/<experiment>/<run_id>/artifacts`, which the MLflow client turns into
`<tracking uri>/api/2.0/mlflow-artifacts/artifacts/<experiment>/<run_id>/artifacts/<path>`:
PUT uploads a file, GET downloads it, GET .../artifacts?path=<dir> lists a directory.

Files are kept under MEDIA_ROOT/mlflow-artifacts/<project>/<run_id>/, streamed to disk with
mado.storage (never held in memory whole).

Other artifact trees share the API: `<experiment>/<segment>/<id>/artifacts/<path>` is the tree an upper app
registered for `segment` (register_tree; the registry's logged models: `<experiment>/models/<model_id>/…`,
as MLflow's server lays them out). Tracking knows only the hook, not who uses it."""
from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.http import FileResponse

from mado import storage
from mado.choices import Scope
from tracking import access
from tracking.errors import MlflowError, invalid, not_found
from tracking.mlflow_api import RUNS_WRITE, Call, endpoint
from tracking.models import Run

MAX_ARTIFACT_BYTES = 5 * 1024**3
MAX_NAME_BYTES = 255  # what the file system takes for one name
MAX_PATH_BYTES = 3000  # well under PATH_MAX (4096) with MEDIA_ROOT and the Run's folder in front


def root_of(run: Run) -> Path:
    return Path(settings.MEDIA_ROOT) / "mlflow-artifacts" / str(run.project_id) / run.run_id


@dataclass
class Tree:
    """One artifact tree: where its files are, what it is called in messages, and the check a write
    must pass (raises MlflowError)."""
    root: Path
    label: str
    check_write: Callable[[], None]


# segment -> locate(call, experiment_id: str, id: str) -> Tree (raising not_found when there is none)
TREES: dict[str, Callable[[Call, str, str], Tree]] = {}


def register_tree(segment: str, locate: Callable[[Call, str, str], Tree]) -> None:
    """An upper app serves `<experiment>/<segment>/<id>/artifacts/…` (called from its AppConfig.ready)."""
    TREES[segment] = locate


def clean_path(path: str) -> str:
    """An artifact path, relative and normalized, within the file system's limits (else INVALID_PARAMETER_VALUE)."""
    path = (path or "").strip("/")
    if not path:
        return ""
    norm = posixpath.normpath(path)
    if norm != path or norm.startswith("..") or "\x00" in path or "\\" in path:
        raise invalid(f"Invalid path '{path[:300]}': artifact paths are relative and normalized (no '..').")
    if any(len(part.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES for part in norm.split("/")):
        raise invalid(f"Invalid path '{path[:300]}…': each file or directory name is at most {MAX_NAME_BYTES} bytes.")
    if len(norm.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
        raise invalid(f"Invalid path '{path[:300]}…': artifact paths are at most {MAX_PATH_BYTES} bytes.")
    return norm


def _locate(call: Call, path: str) -> tuple[Tree, str]:
    """(tree, path inside it) for `<experiment>/<run_id>/artifacts[/<path>]` or a registered tree's
    `<experiment>/<segment>/<id>/artifacts[/<path>]`."""
    parts = clean_path(path).split("/")
    if len(parts) >= 4 and parts[1] in TREES and parts[3] == "artifacts" and parts[0].isdigit():
        return TREES[parts[1]](call, parts[0], parts[2]), "/".join(parts[4:])
    if len(parts) < 3 or parts[2] != "artifacts" or not parts[0].isdigit():
        raise not_found(f"No artifacts at '{path}': paths are <experiment id>/<run id>/artifacts/<file>, as in a "
                        "Run's artifact_uri.")
    run = access.run_for(call.user, call.project, parts[1]) if len(parts[1]) <= 32 else None
    if run is None or str(run.experiment_id) != parts[0]:
        raise not_found(f"Run with id={parts[1]} not found")
    tree = Tree(root_of(run), f"Run {run.run_id}", lambda: access.check_can_write(call.user, call.principal, run))
    return tree, "/".join(parts[3:])


@endpoint(Scope.READ.value, methods=("GET", "PUT"))
def artifact(call: Call, path: str):
    tree, inner = _locate(call, path)
    if not inner:
        raise invalid("Name a file after /artifacts/ to upload or download it.")
    target = tree.root / inner
    if call.request.method == "PUT":
        if not call.principal.is_job and RUNS_WRITE not in call.principal.scopes:
            raise MlflowError(f"This token lacks the {RUNS_WRITE} scope; issue a token that has it.",
                              "PERMISSION_DENIED")
        tree.check_write()
        if target.is_dir():
            raise invalid(f"'{inner}' is a directory of artifacts; upload under another name.")
        temporary = target.with_name(target.name + ".uploading")
        try:
            storage.receive(call.request, temporary, limit=MAX_ARTIFACT_BYTES)
        except storage.UploadTooLarge:
            storage.remove(temporary)
            raise invalid(f"Artifacts are at most {MAX_ARTIFACT_BYTES} bytes.") from None
        except (NotADirectoryError, FileExistsError):  # a folder on the way is a file already
            raise invalid(f"Cannot store '{inner}': a part of its path is a file, not a directory; upload under "
                          "another name.") from None
        temporary.replace(target)
        return {}
    if not target.is_file() or target.name.endswith(".uploading"):
        raise not_found(f"No artifact '{inner}' in {tree.label}.")
    return FileResponse(open(target, "rb"), as_attachment=False, filename=target.name)


def entries(root: Path, inner: str) -> list[dict]:
    """A directory of an artifact tree: [{path: name inside it, is_dir, file_size?}], sorted by name."""
    directory = root / inner if inner else root
    files = []
    if directory.is_dir():
        for entry in sorted(directory.iterdir()):
            if entry.name.endswith((".uploading", ".lock")):
                continue
            item = {"path": entry.name, "is_dir": entry.is_dir()}
            if not entry.is_dir():
                item["file_size"] = entry.stat().st_size
            files.append(item)
    return files


@endpoint(Scope.READ.value, methods=("GET",))
def artifact_list(call: Call):
    tree, inner = _locate(call, call.string("path") or "")
    return {"files": entries(tree.root, inner)}


@endpoint(Scope.READ.value, methods=("GET",))
def run_artifacts_list(call: Call):
    """MLflow's tracking ListArtifacts (GET /api/2.0/mlflow/artifacts/list?run_id=&path=): one directory of
    the Run's artifacts, each path relative to the Run's artifact root, as MLflow's server answers it."""
    run = call.run()
    inner = clean_path(call.string("path") or "")
    files = [{**item, "path": f"{inner}/{item['path']}" if inner else item["path"]}
             for item in entries(root_of(run), inner)]
    return {"root_uri": run.artifact_uri, "files": files}
