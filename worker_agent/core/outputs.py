"""A job's outputs directory read as the result.json validator wants it, and its small files sent as
frames for one batch upload (`FramedBody`). The site runner calls `read_outputs` and `iter_frames`
in-process; on SSH targets they run inside the `files` program (worker_agent/target/files.py, shipped
by worker_agent.core.ship with this module's source): standard library only, no annotations."""
import hashlib
import json
import os
import stat


def file_sha256(path):
    """sha256 of a regular file, read without following a symbolic link."""
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def walk_outputs(root, max_files):
    """([{path, size, sha256, kind: file|dir|symlink|special}], too_many) for the tree under `root`,
    in sorted order, never following links; stops once it saw more than `max_files` (+2: result.json
    and a manifest) entries other than directories."""
    files = []
    counted = 0
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        for name in sorted(dirnames) + sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = name if rel_dir == "." else rel_dir + "/" + name
            st = os.lstat(full)
            if stat.S_ISREG(st.st_mode):
                files.append({"path": rel, "size": st.st_size, "sha256": file_sha256(full), "kind": "file"})
            else:
                kind = "symlink" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "special"
                files.append({"path": rel, "size": 0, "sha256": "", "kind": kind})
            counted += files[-1]["kind"] != "dir"
            if counted > max_files + 2:
                return files, True
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    return files, False


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


def frame_header(path, size):
    return (json.dumps({"path": path, "size": size}) + "\n").encode("ascii")


def iter_frames(root, files):
    """Each of `files` ([{path, size}] under `root`) as a header line and exactly `size` bytes
    (jobs.outputs.receive_batch reads them). A file that changed since it was listed is cut or padded
    with zeros, so the frames keep their length: the server's sha256 check refuses its bytes."""
    for entry in files:
        path, left = entry["path"], int(entry["size"])
        yield frame_header(path, left)
        try:
            fd = os.open(os.path.join(root, *path.split("/")), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            fd = None
        if fd is not None:
            with os.fdopen(fd, "rb") as source:
                while left > 0:
                    data = source.read(min(left, 1 << 20))
                    if not data:
                        break
                    left -= len(data)
                    yield data
        while left > 0:
            yield bytes(min(left, 1 << 20))
            left -= min(left, 1 << 20)


class FramedBody:
    """The frames of `files` as an upload body (`read(n)`, `__len__`: sent with a Content-Length,
    streamed). `source` is what produces them: an iterator of byte strings (`iter_frames`, in-process) or
    a stream with `read(n)` (the `files` program's `frames` over the job's connection, with `close()`). A source
    that ends early raises OSError rather than sending less."""

    def __init__(self, files, source):
        self.length = sum(len(frame_header(f["path"], int(f["size"]))) + int(f["size"]) for f in files)
        self._left = self.length
        self._source = source
        self._buffer, self._at = b"", 0

    def __len__(self):
        return self.length

    def _more(self):
        if hasattr(self._source, "read"):
            return self._source.read(1 << 20)
        return next(self._source, b"")

    def read(self, n=-1):
        """At most `n` bytes (fewer at the end of a block: the HTTP client reads until the length is sent)."""
        if self._left <= 0:
            return b""
        if self._at >= len(self._buffer):
            self._buffer, self._at = self._more(), 0
            if not self._buffer:
                raise OSError(f"The outputs being sent ended {self._left} bytes early.")
        n = self._left if n is None or n < 0 else min(n, self._left)
        data = self._buffer[self._at:self._at + n]
        self._at += len(data)
        self._left -= len(data)
        return data

    def close(self):
        close = getattr(self._source, "close", None)
        if close is not None:
            close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
