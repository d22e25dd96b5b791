"""A job's outputs directory read as the result.json validator wants it. The site runner calls
`read_outputs` in-process; the worker sends it (with results.walk_outputs and file_sha256) as program
text to SSH targets (worker_agent.remote_files): no annotations, only json, os and stat there."""
import json
import os
import stat

from worker_agent.results import walk_outputs


def read_limited(path, limit):
    """At most `limit` + 1 bytes of a regular file (one more tells the validator it is too large),
    never through a symbolic link; None when it cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(limit + 1)


def read_outputs(root, max_files):
    """{files: [{path, size, sha256, kind}], result, manifest, too_many} for the outputs directory
    `root`: result.json's bytes and those of the artifacts manifest it names (None when absent);
    symbolic links are reported, never followed. No directory: no files. ValueError when `root` is a
    link or not a directory."""
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return {"files": [], "result": None, "manifest": None, "too_many": False, "missing": True}
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ValueError("The outputs directory is a symbolic link or not a directory.")
    files, too_many = walk_outputs(root, max_files)
    listed = set(f["path"] for f in files if f["kind"] == "file")
    # A listing cut short (too_many) may stop before result.json: the job still declared its outputs.
    has_result = "result.json" in listed or (too_many and os.path.isfile(os.path.join(root, "result.json"))
                                             and not os.path.islink(os.path.join(root, "result.json")))
    result = read_limited(os.path.join(root, "result.json"), 1 << 20) if has_result else None  # MAX_RESULT_BYTES
    manifest = None
    if result is not None:
        try:
            name = json.loads(result.decode("utf-8")).get("artifactsManifest")
        except Exception:  # not JSON, not an object, nested too deep: the validator says which
            name = None
        if isinstance(name, str) and name in listed and ".." not in name.split("/") and not name.startswith("/"):
            manifest = read_limited(os.path.join(root, name), max_files * 4096)  # results.decode_manifest's limit
    return {"files": files, "result": result, "manifest": manifest, "too_many": too_many}
