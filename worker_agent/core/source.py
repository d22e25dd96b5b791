"""A job's source into `<job_dir>/source`, which appears only once complete (an agent killed halfway
fetches again): a .tar.gz unpacked, or a git URL cloned. The site runner calls it; on SSH targets it
runs inside the `files` program (worker_agent/target/files.py, shipped by worker_agent.core.ship with
this module's source): no annotations, standard library only."""
import os
import shutil
import subprocess
import tarfile
import tempfile


class SourceError(ValueError):
    """The source cannot be put in place; `code` is source_unsafe, git_missing or git_failed."""

    def __init__(self, code, message):
        ValueError.__init__(self, message)
        self.code = code


def extract_tar(fileobj, dest):
    """Regular files and directories of the .tar.gz read from `fileobj` (as a stream: nothing is
    sought) into the directory `dest`; returns how many files. An absolute path, a `..` part, a link
    (symbolic or hard, wherever it points) or a special file raises SourceError before anything of
    it is written; files are created with O_EXCL|O_NOFOLLOW, so nothing is written through a link."""
    count = 0
    with tarfile.open(fileobj=fileobj, mode="r|gz") as archive:
        for member in archive:
            name = member.name
            while name.startswith("./"):
                name = name[2:]
            name = name.rstrip("/")
            if not name or name == ".":
                continue
            pieces = name.split("/")
            if name.startswith("/") or ".." in pieces or "\0" in name:
                raise SourceError("source_unsafe", "The source archive holds the unsafe path %r; upload it again "
                                  "without it." % name)
            target = os.path.join(dest, *pieces)
            if member.isdir():
                os.makedirs(target, 0o755, exist_ok=True)
            elif member.isfile():
                os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                             0o755 if member.mode & 0o111 else 0o644)
                with os.fdopen(fd, "wb") as f:
                    shutil.copyfileobj(archive.extractfile(member), f, 1 << 20)
                count += 1
            else:
                raise SourceError("source_unsafe", "The source archive holds %r, which is not a file or a directory; "
                                  "links and special files are not accepted in a source archive." % name)
    return count


def unpack_source(fileobj, job_dir):
    """extract_tar into `<job_dir>/source`. SourceError, or OSError, TarError, EOFError."""
    tmp = tempfile.mkdtemp(prefix=".source-", dir=job_dir)
    try:
        count = extract_tar(fileobj, tmp)
        os.rename(tmp, os.path.join(job_dir, "source"))
        return count
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def clone_source(url, ref, job_dir, where, timeout):
    """`git clone` of `url` and a detached checkout of `ref` into `<job_dir>/source`, each given
    `timeout` seconds, never prompting; `where` ("on the target") says where git is missing."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR") or
           k.startswith(("GIT_SSH", "SSH_AUTH", "http_", "https_", "HTTP_", "HTTPS_", "no_proxy", "NO_PROXY"))}
    env["GIT_TERMINAL_PROMPT"] = "0"
    tmp = tempfile.mkdtemp(prefix=".source-", dir=job_dir)
    repo = os.path.join(tmp, "repo")
    try:
        for argv in (["git", "clone", "--quiet", "--no-checkout", "--", url, repo],
                     ["git", "-C", repo, "checkout", "--quiet", "--detach", ref]):
            try:
                ran = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=timeout,
                                     check=False)
            except FileNotFoundError:
                raise SourceError("git_missing", "git is not installed %s: install it, or upload the source as an "
                                  "archive." % where) from None
            except subprocess.TimeoutExpired:
                raise SourceError("git_failed", "%s did not finish within %d minutes." % (" ".join(argv[:2]),
                                                                                          timeout // 60)) from None
            if ran.returncode != 0:
                tail = ran.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
                raise SourceError("git_failed", "%s failed: %s" % (" ".join(argv[:2]), " | ".join(tail)))
        os.rename(repo, os.path.join(job_dir, "source"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
