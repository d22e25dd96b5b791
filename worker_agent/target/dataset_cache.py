"""The dataset cache on a target: a standard-library program the worker runs there (`<command>
<cache_root>`, shipped by worker_agent.core.ship), never imported by the worker. REFERENCE §6, seed 002.

Layout under `<working_dir>/.mmt-cache/datasets/` (the root):

    .lock               flock held briefly while pins, usage and eviction change
    <hex>.lock          flock held while one version is fetched: concurrent jobs fetch it once
    <hex>/users/<job>   pins: a job that uses the version (lapses when the state.json of every workspace
                        of the job, `<job>` or a cluster replica's `<job>-<replica>`, is terminal)
    <hex>/partial/      the files while they arrive
    <hex>/verified.jsonl  the files of partial/ verified so far: a cut fetch resumes with them
    <hex>/data/         the version's files, read-only once complete
    <hex>/files.json    the manifest [{path, sha256, size}]
    <hex>/complete.json written last: the entry counts only once this exists
    <hex>/last-used     its mtime orders eviction (least recently used first)

A complete entry is read-only but for `users/` (mode 555 directories, 444 files): one SSH user may
serve every project of a computer, and the jobs that share a version must not change it, even by
accident. Eviction puts the write bits back on the directories before it removes them. The cache
directories are mode 700.

Commands (one JSON object per stdout line; the last line is the answer):

    ensure <root>   stdin: one JSON line {job_id, limit_bytes, version: {id, digest, total_size,
                    file_count}, mode: relay|direct, [api_url, token, manifest_url, files_url,
                    archive_url]}.
                    Pins the version for the job, waits for another fetch of it, and answers
                    {"state": "have"} (complete already) or {"state": "send", "have"?: [paths]} (relay:
                    the worker then writes the manifest as one JSON line and, as one uncompressed tar
                    on stdin, the files not in `have` — those a cut fetch verified, hashed again now).
                    Direct mode downloads the files not in `have` itself with the job token, as ONE
                    tar from archive_url (GET, or POST {files} for part of the version): a member cut
                    off is finished with a Range request of that file, the rest asked for again,
                    retries after 2 s and 4 s; 404, 401/403 and digest mismatch fail at once. Every
                    file's sha256 and the manifest's digest are checked before complete.json is written.
    usage <root>    {limit_bytes?, used_bytes, entries: [...]}
    release <root> <job_id>   drop the job's pins (a job that never started)

A failure answers {"ok": false, "code", "error"} with a sentence that says what to do."""
import fcntl
import hashlib
import http.client
import json
import os
import shutil
import stat
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque

TERMINAL = ("exited", "canceled", "timed_out", "failed_to_start")
PREPARING_SECONDS = 6 * 3600  # a pin of a job whose supervisor has not started yet counts this long
RETRY_DELAYS = (2.0, 4.0)
BLOCK = 1 << 20
GIB = 1 << 30
# Failures after which nothing received is kept: wrong bytes or names in transit. A cut fetch
# (relay_broken, download_failed, the worker gone) keeps the files it verified.
DISTRUSTED = ("digest_mismatch", "unexpected_member", "unsafe_path", "partial_changed", "bad_request")


class Failed(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code, self.message = code, message


SAYING = threading.Lock()  # one JSON line at a time, whoever says it


def say(**kw):
    with SAYING:
        sys.stdout.write(json.dumps(kw) + "\n")
        sys.stdout.flush()


def gib(n):
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20)):
        if n >= size:
            return f"{n / size:.1f}".removesuffix(".0") + f" {unit}"
    return f"{n / 1024:.1f}".removesuffix(".0") + " KiB"


def read_json(path):
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return None


def write_json(path, value, mode=0o644):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


class Lock:
    def __init__(self, path, blocking=True):
        self.path, self.blocking, self.fd = path, blocking, None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if self.blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(self.fd)
            self.fd = None
        return self.fd is not None

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)  # closing releases the flock


# -- paths and manifests --------------------------------------------------------------------------

def digest_key(digest):
    hexpart = str(digest or "").removeprefix("sha256:")
    if len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
        raise Failed("bad_digest", f"The version digest {digest!r} is not sha256:<64 hex digits>.")
    return hexpart


def manifest_digest(items):
    lines = "".join(f"{i['sha256']} {i['size']} {i['path']}\n" for i in sorted(items, key=lambda i: i["path"]))
    return "sha256:" + hashlib.sha256(lines.encode("utf-8")).hexdigest()


def safe_path(path):
    parts = path.split("/") if isinstance(path, str) else []
    if not parts or path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in path:
        raise Failed("unsafe_path", f"The manifest names the unsafe path {path!r}.")
    return parts


def check_manifest(items, version):
    if not isinstance(items, list) or manifest_digest(items) != version["digest"]:
        raise Failed("digest_mismatch", f"The manifest of input dataset version {version['id']} does not match its "
                                        f"digest {version['digest']}: it was changed in transit. Run the job again.")
    for item in items:
        safe_path(item["path"])
    return sorted(items, key=lambda i: i["path"])


def working_dir_of(root):
    return os.path.dirname(os.path.dirname(root.rstrip("/")))


# -- pins, usage and eviction ---------------------------------------------------------------------

def job_states(root, job):
    """The supervisor states of every workspace of the job on this computer: `<jobId>`, and
    `<jobId>-<replica>` for each replica of a cluster job that runs here."""
    jobs = os.path.join(working_dir_of(root), ".mmt", "jobs")
    try:
        names = [n for n in os.listdir(jobs) if n == job or n.startswith(job + "-")]
    except OSError:
        names = []
    states = (read_json(os.path.join(jobs, name, "state.json")) for name in names)
    return [s.get("status") if isinstance(s, dict) else None for s in states if s is not None]


def pin_live(root, pin):
    """Live while any workspace of the job has a supervisor that has not ended; lapsed as soon as all
    have ended. Before any supervisor started (inputs arrive first), it counts PREPARING_SECONDS."""
    states = job_states(root, os.path.basename(pin))
    if not states:
        try:
            return time.time() - os.stat(pin).st_mtime < PREPARING_SECONDS
        except OSError:
            return False
    return any(status not in TERMINAL for status in states)


def live_pins(root, key):
    users = os.path.join(root, key, "users")
    live = []
    for name in sorted(os.listdir(users)) if os.path.isdir(users) else []:
        pin = os.path.join(users, name)
        if pin_live(root, pin):
            live.append(name)
        else:
            try:
                os.unlink(pin)  # the job is terminal: its pin lapses
            except OSError:
                pass
    return live


def entries(root):
    found = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if len(name) != 64 or not os.path.isdir(path):
            continue
        complete = read_json(os.path.join(path, "complete.json"))
        try:
            used = os.stat(os.path.join(path, "last-used")).st_mtime
        except OSError:
            used = 0.0
        found.append({"key": name, "complete": complete is not None,
                      "size": int((complete or read_json(os.path.join(path, "reserved.json")) or {}).get(
                          "total_size", 0)),
                      "version_id": (complete or {}).get("version_id"), "last_used": used,
                      "pinned_by": live_pins(root, name)})
    return found


def fetching(root, key):
    with Lock(os.path.join(root, key + ".lock"), blocking=False) as free:
        return not free


def remove_entry(path):
    for dirpath, dirnames, _ in os.walk(path):
        os.chmod(dirpath, 0o700)
        for d in dirnames:
            full = os.path.join(dirpath, d)
            if not os.path.islink(full):
                os.chmod(full, 0o700)
    shutil.rmtree(path, ignore_errors=True)


def usage(root, limit=None):
    found = entries(root) if os.path.isdir(root) else []
    counted = [e for e in found if e["complete"] or fetching(root, e["key"])]
    out = {"used_bytes": sum(e["size"] for e in counted), "entries": found,
           "complete_count": sum(1 for e in found if e["complete"]),
           "pinned_count": sum(1 for e in found if e["pinned_by"])}
    if limit is not None:
        out["limit_bytes"] = limit
    return out


def make_room(root, key, need, limit):
    """Evict least recently used entries nobody uses until `need` more bytes fit under `limit`.
    Called with the root lock held and the entry's own fetch lock held."""
    found = [e for e in entries(root) if e["key"] != key]
    for e in found:  # abandoned fetches (nobody holds their lock, no live job) are garbage
        if not e["complete"] and not e["pinned_by"] and not fetching(root, e["key"]):
            remove_entry(os.path.join(root, e["key"]))
    found = [e for e in found if os.path.isdir(os.path.join(root, e["key"]))]
    counted = [e for e in found if e["complete"] or fetching(root, e["key"])]
    used = sum(e["size"] for e in counted)
    evicted = []
    for e in sorted((e for e in counted if e["complete"] and not e["pinned_by"]), key=lambda e: e["last_used"]):
        if used + need <= limit:
            break
        remove_entry(os.path.join(root, e["key"]))
        used -= e["size"]
        evicted.append(e["key"])
    if used + need > limit:
        raise Failed("cache_full", f"The dataset cache limit of this computer is {gib(limit)}; versions in use by "
                                   f"other queued or running jobs hold {gib(used)}, so {gib(need)} more does not fit. "
                                   "Wait for those jobs to end, or raise the computer's dataset cache limit.")
    return evicted


# -- receiving files ------------------------------------------------------------------------------

def resume_partial(entry):
    """partial/ and the files in it that an earlier, cut fetch of this version verified (its journal
    `verified.jsonl`), each hashed again now: only a file whose bytes still match is kept as had.
    Anything else in partial/ is overwritten when it arrives (or refused at sealing)."""
    partial, journal = os.path.join(entry, "partial"), os.path.join(entry, "verified.jsonl")
    have = {}
    if os.path.isdir(partial) and os.path.isfile(journal):
        with open(journal, "rb") as f:
            for line in f.read().split(b"\n"):
                try:
                    item = json.loads(line.decode("utf-8"))
                    path = os.path.join(partial, *safe_path(item["path"]))
                    if not os.path.islink(path) and os.path.getsize(path) == int(item["size"]) \
                            and file_sha256(path) == item["sha256"]:
                        have[item["path"]] = {k: item[k] for k in ("path", "sha256", "size")}
                except (ValueError, KeyError, TypeError, OSError, Failed):
                    continue  # a line cut by the kill, or a file gone or changed since: fetched again
    elif os.path.isdir(partial):
        remove_entry(partial)
    os.makedirs(partial, 0o700, exist_ok=True)
    write_json_lines(journal, have.values())
    return partial, have


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json_lines(path, items):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(i, sort_keys=True) + "\n" for i in items)
    os.replace(tmp, path)


class Journal:
    """Appends one line per file verified in partial/, so that a fetch cut midway resumes with what
    arrived: the next fetch hashes those files again and asks only for the others."""

    def __init__(self, entry):
        self.lock = threading.Lock()
        self.file = open(os.path.join(entry, "verified.jsonl"), "a", encoding="utf-8")

    def add(self, item):
        with self.lock:
            self.file.write(json.dumps({k: item[k] for k in ("path", "sha256", "size")}, sort_keys=True) + "\n")
            self.file.flush()  # no fsync: the next fetch hashes the file again anyway

    def close(self):
        self.file.close()


def check_had(items, have, entry, version):
    """The files kept from a cut fetch must be files of this manifest with the same sha256 and size (the
    entry's key is the manifest's digest, so anything else was changed by hand: start over)."""
    by_path = {i["path"]: i for i in items}
    for path, item in have.items():
        wanted = by_path.get(path)
        if wanted is None or wanted["sha256"] != item["sha256"] or int(wanted["size"]) != int(item["size"]):
            remove_entry(os.path.join(entry, "partial"))
            os.unlink(os.path.join(entry, "verified.jsonl"))
            raise Failed("partial_changed", f"The files kept from an earlier fetch of input dataset version "
                                            f"{version['id']} do not match its manifest; they were removed. "
                                            "Run the job again.")


def open_target(partial, path, append=False):
    parts = safe_path(path)
    directory = os.path.join(partial, *parts[:-1])
    os.makedirs(directory, 0o755, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if append else os.O_TRUNC)
    return open(os.open(os.path.join(directory, parts[-1]), flags, 0o644), "ab" if append else "wb")


def mismatch(version, path):
    return Failed("digest_mismatch", f"{path} of input dataset version {version['id']} does not match its sha256: "
                                     "bytes were corrupted in transit. Nothing was kept; run the job again.")


def receive_tar(stream, partial, items, version, have=(), journal=None):
    """The relay tar on `stream`: exactly the manifest's files that are not in `have`, each checked
    against its sha256 as it is written, and journaled once it matches."""
    expected = {i["path"]: i for i in items if i["path"] not in have}
    seen = set()
    counter = Counting(stream)
    try:
        with tarfile.open(fileobj=counter, mode="r|") as archive:
            for member in archive:
                if member.isdir():
                    continue
                item = expected.get(member.name)
                if item is None or not member.isfile() or member.name in seen or member.size != item["size"]:
                    raise Failed("unexpected_member", f"The relayed archive holds {member.name!r}, which is not a "
                                                      "file of the version's manifest.")
                seen.add(member.name)
                source = archive.extractfile(member)
                digest = hashlib.sha256()
                with open_target(partial, member.name) as out:
                    for block in iter(lambda: source.read(BLOCK), b""):
                        digest.update(block)
                        out.write(block)
                if digest.hexdigest() != item["sha256"]:
                    raise mismatch(version, member.name)
                if journal is not None:
                    journal.add(item)
    except (tarfile.TarError, EOFError) as exc:
        raise Failed("relay_broken", f"The relayed archive ended early or is damaged ({exc}); run the job again.") \
            from None
    missing = sorted(set(expected) - seen)
    if missing:
        raise Failed("relay_broken", f"The relayed archive lacks {len(missing)} file(s) of the version, "
                                     f"such as {missing[0]}; run the job again.")
    return counter.count


class Counting:
    def __init__(self, stream):
        self.stream, self.count = stream, 0

    def read(self, n=-1):
        data = self.stream.read(n)
        self.count += len(data)
        return data


def request(url, token, offset=0, body=None):
    """A GET (a POST with a JSON body when `body` is given) with the job token; Range from `offset`."""
    headers = {"Authorization": f"Bearer {token}", "User-Agent": "mado-dataset-cache"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    data = None
    if body is not None:
        data = json.dumps(body).encode("utf-8")
        headers["Content-Type"] = "application/json"
    return urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers,
                                                         method="POST" if data is not None else "GET"), timeout=60)


def server_says(exc):
    """The sentence of the server's JSON error body, when it has one (it names the file and what to do)."""
    try:
        said = json.loads(exc.read(4096).decode("utf-8")).get("error")
    except (OSError, ValueError, AttributeError, UnicodeDecodeError):
        return ""
    return f" ({said})" if isinstance(said, str) and said else ""


def http_failure(exc, what):
    if isinstance(exc, urllib.error.HTTPError):
        if exc.code == 404:
            return Failed("not_found", f"The server answered 404 for {what}{server_says(exc)}: the version or the "
                                       "file is gone. Choose an existing dataset version for the job.")
        if exc.code in (401, 403):
            return Failed("not_allowed", f"The server refused the job token for {what} ({exc.code}"
                                         f"{server_says(exc)}); the job may have ended or its creator may have "
                                         "lost access to the project.")
        if exc.code < 500 and exc.code not in (408, 429):
            return Failed("http_error", f"The server answered {exc.code} for {what}{server_says(exc)}.")
    return None


def with_retries(action, what):
    """`action()` with retries after 2 s and 4 s on network trouble and 5xx; 4xx fail at once."""
    for attempt in range(len(RETRY_DELAYS) + 1):
        try:
            return action()
        except (OSError, http.client.HTTPException) as exc:
            fatal = http_failure(exc, what)
            if fatal is not None:
                raise fatal from None
            if attempt == len(RETRY_DELAYS):
                raise Failed("download_failed", f"Downloading {what} failed {attempt + 1} times ({exc}); check "
                                                "that the computer reaches the API server, or use relay "
                                                "transfer.") from None
            say(state="retrying", what=what, error=str(exc), delay=RETRY_DELAYS[attempt])
            time.sleep(RETRY_DELAYS[attempt])


def download(header, partial, version, have=(), journal=None):
    """Direct mode: the manifest, then the files the cache lacks as ONE uncompressed tar from the
    version's archive endpoint with the job token (GET for the whole version, POST {files} for part of
    it: what a cut fetch left verified is not asked for again). Each member's name and size must be the
    next file asked for, and its sha256 the manifest's, before it is journaled. A download that breaks
    off resumes without fetching a byte twice: the member it broke in is finished with a Range request
    of that file, the rest comes from a new archive request naming only the files still to fetch, after
    2 s and 4 s; three failures in a row give up unless bytes arrived meanwhile (then a new round, at
    most three). 404, 401/403 and a digest mismatch fail at once. Returns (manifest, bytes received)."""
    base = header["api_url"].rstrip("/")
    token = header["token"]
    archive_url = base + (header.get("archive_url") or header["manifest_url"].removesuffix("/manifest") + "/archive")
    files_url = base + header["files_url"]

    def manifest():
        with request(base + header["manifest_url"], token) as answer:
            return json.loads(answer.read().decode("utf-8"))

    items = check_manifest(with_retries(manifest, "the manifest")["items"], version)
    pending = deque(i for i in items if i["path"] not in have)
    whole = len(pending) == len(items)
    # The member whose bytes are arriving: how many are in partial/ and their running sha256.
    state = {"open": None, "have": 0, "digest": None, "moved": 0}

    def receive(source, item):
        with open_target(partial, item["path"], append=state["have"] > 0) as out:
            for block in iter(lambda: source.read(BLOCK), b""):
                if state["have"] + len(block) > item["size"]:
                    raise mismatch(version, item["path"])
                state["digest"].update(block)
                out.write(block)
                state["have"] += len(block)
                state["moved"] += len(block)
        if state["have"] < item["size"]:
            raise ConnectionError(f"the download ended inside {item['path']} after {state['have']} of "
                                  f"{item['size']} bytes")
        if state["digest"].hexdigest() != item["sha256"]:
            raise mismatch(version, item["path"])
        if journal is not None:
            journal.add(item)
        pending.popleft()
        state.update(open=None, have=0, digest=None)

    def attempt():
        item = state["open"]
        if item is not None:  # broke off inside a member: the rest of that one file, with Range
            with request(files_url + urllib.parse.quote(item["path"], safe="/"), token, state["have"]) as answer:
                if state["have"] and answer.status != 206:
                    raise Failed("http_error", f"The server ignored the Range request for {item['path']}.")
                receive(answer, item)
        if not pending:
            return
        everything = whole and len(pending) == len(items)
        with request(archive_url, token, body=None if everything else {"files": [i["path"] for i in pending]}) \
                as answer:
            try:
                with tarfile.open(fileobj=answer, mode="r|", bufsize=BLOCK) as archive:
                    for member in archive:
                        item = pending[0] if pending else None
                        if item is None or member.name != item["path"] or member.size != item["size"] \
                                or not member.isfile():
                            raise Failed("unexpected_member", f"The server's archive of input dataset version "
                                                              f"{version['id']} holds {member.name!r} where "
                                                              f"{item and item['path']!r} was expected; update the "
                                                              "worker or the server.")
                        state.update(open=item, have=0, digest=hashlib.sha256())
                        receive(archive.extractfile(member), item)
            except (tarfile.TarError, EOFError) as exc:
                raise ConnectionError(f"the archive broke off ({type(exc).__name__}: {exc})") from None
        if pending:
            raise ConnectionError(f"the archive ended before {pending[0]['path']}")

    for tries in range(len(RETRY_DELAYS) + 1):
        before = len(pending), state["have"]
        try:
            with_retries(attempt, f"the archive of input dataset version {version['id']}")
            break
        except Failed as exc:
            # A break that still moved bytes starts a fresh round of retries: only a download that makes
            # no progress three times in a row gives up.
            if exc.code != "download_failed" or (len(pending), state["have"]) == before or \
                    tries == len(RETRY_DELAYS):
                raise
    return items, state["moved"]


def check_tree(partial, items):
    """Exactly the manifest's paths, as regular files of the manifest's sizes, before sealing: what a
    cut fetch left behind and nobody sent again cannot slip into a complete entry."""
    found = {}
    for dirpath, _, filenames in os.walk(partial):
        for name in filenames:
            full = os.path.join(dirpath, name)
            found[os.path.relpath(full, partial).replace(os.sep, "/")] = full
    expected = {i["path"]: int(i["size"]) for i in items}
    extra = sorted(set(found) - set(expected))
    missing = sorted(set(expected) - set(found))
    wrong = sorted(p for p in expected if p in found and (os.path.islink(found[p])
                                                           or os.path.getsize(found[p]) != expected[p]))
    if extra or missing or wrong:
        raise Failed("relay_broken", f"The cache entry does not hold exactly the version's files "
                                     f"({(extra + missing + wrong)[0]}); run the job again.")


def seal(entry, items, version, moved):
    """Make the partial files the entry's read-only data; complete.json last."""
    partial, data = os.path.join(entry, "partial"), os.path.join(entry, "data")
    check_tree(partial, items)
    write_json(os.path.join(entry, "files.json"), items, 0o444)
    for dirpath, dirnames, filenames in os.walk(partial, topdown=False):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o444)
        os.chmod(dirpath, 0o555)
    os.rename(partial, data)
    os.unlink(os.path.join(entry, "verified.jsonl"))
    write_json(os.path.join(entry, "complete.json"),
               {"version_id": version["id"], "digest": version["digest"], "total_size": version["total_size"],
                "file_count": len(items), "completed_at": time.time(), "received_bytes": moved}, 0o444)
    touch(entry)
    for name in ("reserved.json", "last-used"):
        try:
            os.chmod(os.path.join(entry, name), 0o444)
        except FileNotFoundError:
            pass
    os.chmod(entry, 0o555)  # nothing is added, renamed or removed in it now; users/ stays writable


def touch(entry):
    """Mark the entry used now: the mtime of `last-used` (the owner may set it on a read-only file)."""
    path = os.path.join(entry, "last-used")
    try:
        os.utime(path)
    except FileNotFoundError:
        write_json(path, time.time(), 0o444)


# -- commands -------------------------------------------------------------------------------------

def ensure(root, stdin):
    header = json.loads(stdin.readline().decode("utf-8"))
    version, limit, job = header["version"], int(header["limit_bytes"]), str(int(header["job_id"]))
    key = digest_key(version["digest"])
    size = int(version["total_size"])
    if size > limit:
        raise Failed("larger_than_cache", f"Input dataset version {version['id']} is {gib(size)}, larger than this "
                                          f"computer's dataset cache limit of {gib(limit)}. Raise the limit in the "
                                          "computer's settings.")
    os.makedirs(os.path.dirname(root), 0o700, exist_ok=True)  # .mmt-cache
    os.makedirs(root, 0o700, exist_ok=True)
    entry = os.path.join(root, key)
    with Lock(os.path.join(root, ".lock")):
        os.makedirs(os.path.join(entry, "users"), 0o700, exist_ok=True)
        write_json(os.path.join(entry, "users", job), {"job_id": job, "pinned_at": time.time()})
    with Lock(os.path.join(root, key + ".lock")):
        if os.path.exists(os.path.join(entry, "complete.json")):
            touch(entry)
            say(state="have")
            return {"ok": True, "fetched": False, "received_bytes": 0, "path": os.path.join(entry, "data"),
                    "usage": usage(root, limit)}
        os.chmod(entry, 0o700)  # writable while it is fetched (an entry that lost its complete.json was sealed)
        with Lock(os.path.join(root, ".lock")):
            evicted = make_room(root, key, size, limit)
            write_json(os.path.join(entry, "reserved.json"), {"total_size": size})
        partial, have = resume_partial(entry)
        journal = Journal(entry)
        try:
            if header.get("mode") == "direct":
                say(state="fetching", **({"have": len(have)} if have else {}))
                items, moved = download(header, partial, version, have, journal)
                check_had(items, have, entry, version)
            else:
                say(state="send", **({"have": sorted(have)} if have else {}))
                items = check_manifest(json.loads(stdin.readline().decode("utf-8") or "null"), version)
                check_had(items, have, entry, version)
                moved = receive_tar(stdin, partial, items, version, have, journal)
            journal.close()
            seal(entry, items, version, moved)
        except BaseException as exc:
            # Never complete, and this job no longer holds the entry. A fetch that was cut keeps the
            # files it verified (partial/ and its journal) for the next fetch of this version; one that
            # received wrong bytes or names trusts nothing it got. A fetch of another version removes
            # what is kept as abandoned.
            journal.close()
            if not isinstance(exc, Failed) or exc.code in DISTRUSTED:
                remove_entry(partial)
                try:
                    os.unlink(os.path.join(entry, "verified.jsonl"))
                except OSError:
                    pass
            for name in ("reserved.json", os.path.join("users", job)):
                try:
                    os.unlink(os.path.join(entry, name))
                except OSError:
                    pass
            raise
        touch(entry)
        return {"ok": True, "fetched": True, "received_bytes": moved, "evicted": evicted,
                "path": os.path.join(entry, "data"), "usage": usage(root, limit)}


def release(root, job):
    job = str(int(job))
    with Lock(os.path.join(root, ".lock")):
        for name in os.listdir(root):
            pin = os.path.join(root, name, "users", job)
            if os.path.lexists(pin):
                os.unlink(pin)
    return {"ok": True}


def main(args, stdin=None):
    stdin = stdin or sys.stdin.buffer
    if len(args) < 2 or args[0] not in ("ensure", "usage", "release"):
        print("usage: dataset_cache.py ensure|usage|release <root> [job_id]", file=sys.stderr)
        return 2
    command, root = args[0], os.path.abspath(args[1])
    try:
        st = os.lstat(root) if os.path.lexists(root) else None
        if st is not None and (stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode)):
            raise Failed("bad_cache", f"{root} is a symbolic link or not a directory; remove it.")
        if command == "ensure":
            result = ensure(root, stdin)
        elif command == "usage":
            result = dict(usage(root), ok=True)
        else:
            result = release(root, args[2]) if os.path.isdir(root) else {"ok": True}
    except Failed as exc:
        result = {"ok": False, "code": exc.code, "error": exc.message}
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        result = {"ok": False, "code": "bad_request", "error": f"The worker sent an unreadable request ({exc!r}); "
                                                               "update the worker."}
    except OSError as exc:
        result = {"ok": False, "code": "cache_error", "error": f"The dataset cache could not be written: {exc}. Check "
                                                               "the working directory's space and permissions."}
    say(**result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
