"""MLflow's proxied artifact API (`mlflow-artifacts:` URIs): a Run's artifact_uri is
`mlflow-artifacts:/<experiment>/<run_id>/artifacts`, which the MLflow client turns into
`<tracking uri>/api/2.0/mlflow-artifacts/artifacts/<experiment>/<run_id>/artifacts/<path>`:
PUT uploads a file, GET downloads it, GET .../artifacts?path=<dir> lists a directory.

Files are kept under MEDIA_ROOT/mlflow-artifacts/<project>/<run_id>/, streamed to disk with
jobs.storage (never held in memory whole)."""
from __future__ import annotations

import posixpath
from pathlib import Path

from django.conf import settings
from django.http import FileResponse

from jobs import storage
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


def _clean(path: str) -> str:
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


def _locate(call: Call, path: str) -> tuple[Run, str]:
    """(run, path inside the run's artifacts) for `<experiment>/<run_id>/artifacts[/<path>]`."""
    parts = _clean(path).split("/")
    if len(parts) < 3 or parts[2] != "artifacts" or not parts[0].isdigit():
        raise not_found(f"No artifacts at '{path}': paths are <experiment id>/<run id>/artifacts/<file>, as in a "
                        "Run's artifact_uri.")
    run = access.run_for(call.user, call.project, parts[1]) if len(parts[1]) <= 32 else None
    if run is None or str(run.experiment_id) != parts[0]:
        raise not_found(f"Run with id={parts[1]} not found")
    return run, "/".join(parts[3:])


@endpoint(Scope.READ.value, methods=("GET", "PUT"))
def artifact(call: Call, path: str):
    run, inner = _locate(call, path)
    if not inner:
        raise invalid("Name a file after /artifacts/ to upload or download it.")
    target = root_of(run) / inner
    if call.request.method == "PUT":
        if not call.principal.is_job and RUNS_WRITE not in call.principal.scopes:
            raise MlflowError(f"This token lacks the {RUNS_WRITE} scope; issue a token that has it.",
                              "PERMISSION_DENIED")
        access.check_can_write(call.user, call.principal, run)
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
        raise not_found(f"No artifact '{inner}' in Run {run.run_id}.")
    return FileResponse(open(target, "rb"), as_attachment=False, filename=target.name)


def _entries(run: Run, inner: str) -> list[dict]:
    """A directory of a Run's artifacts: [{path: name inside it, is_dir, file_size?}], sorted by name."""
    directory = root_of(run) / inner if inner else root_of(run)
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
    run, inner = _locate(call, call.string("path") or "")
    return {"files": _entries(run, inner)}


@endpoint(Scope.READ.value, methods=("GET",))
def run_artifacts_list(call: Call):
    """MLflow's tracking ListArtifacts (GET /api/2.0/mlflow/artifacts/list?run_id=&path=): one directory of
    the Run's artifacts, each path relative to the Run's artifact root, as MLflow's server answers it."""
    run = call.run()
    inner = _clean(call.string("path") or "")
    files = [{**item, "path": f"{inner}/{item['path']}" if inner else item["path"]} for item in _entries(run, inner)]
    return {"root_uri": run.artifact_uri, "files": files}
