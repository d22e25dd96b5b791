"""Programs kept on a target by content hash (issues 17, 19): the worker sends a program once per target,
and later runs send its sha256 only.

A run is `python3 -I -S -c BOOT <sha256>[:<size>] <args…>`. The boot looks for
`~/.cache/mado/programs/<sha256>.py` (the directory created 0700), checks that its bytes hash to the name
(a truncated or altered copy counts as missing) and runs it as `__main__` with `__file__` pointing at
it, `sys.argv[1:]` the program's arguments and stdin untouched for the program's own payload; its
compiled code is kept beside it (`<sha256>.<cache tag>.code`: compiling the 61 KB supervisor costs more
than starting Python; a damaged file is compiled again and replaced). A copy
that is missing exits `MISSING` (with a line on stderr) before the program ran, so the worker can send
it and run again. With `:<size>` the program comes first on stdin: the boot reads those bytes, checks
the hash, stores them (a temporary file renamed into place, so concurrent runs never see half a file)
and runs them; the rest of stdin is again the program's. A home the boot cannot store in fails the run
with that reason on stderr.

`run` tries by hash first, so the common case is one exec carrying only the command's own payload;
a stream cannot be tried and run again, so it carries the program unless a run on the same connection
found it there or sent it (remembered per connection). A `run` whose stdin is a file (a source archive)
goes by hash only where the connection knows the program, else with the program in front of a copy of
the file, so a large stdin never goes for nothing. Connections are duck-typed: `run(argv, stdin=,
timeout=)` returning exit_code/stdout/stderr, and `stream(argv, stdin=, timeout=)` with
`read(n)`/`close()` for long-lived commands.

Every program a worker runs on a target goes this way: the supervisor, the GPU probe, and the modules
of worker_agent/target (the job's files, the dataset cache, cluster facts) and authorized_keys.py; a
program made of several modules is their sources joined (`Program.of_modules`), so code the worker or
the site runner also imports has one copy. Two exceptions, both run before a Python is known: the
connection check (worker_agent/probe.py, whose job is to find a Python on the target) and the Add
dialog's directory browse (worker_agent/reads.py, a shell script).

The cache prunes itself: a run that stores a program removes the cached files (`*.py`, `*.code`, a
`*.tmp` left by a killed store) not touched for PRUNE_DAYS, and a run by hash touches its program and
compiled code when they are older than a day, so a program in use is never removed (one utime a day)."""
import ast
import hashlib
import os
import shutil
import tempfile
import threading
import weakref

CACHE_DIR = "~/.cache/mado/programs"
MISSING = 121  # the boot's exit code for "not on this target": no program exits with it here
PRUNE_DAYS = 30

# The first line names what runs in `ps` (a supervisor forked by `start` keeps this command line).
BOOT = """\
# mado: runs ~/.cache/mado/programs/<sha256>.py
import hashlib, marshal, os, sys, time
h, _, n = sys.argv[1].partition(':')
d = os.path.expanduser('CACHE_DIR')
p = os.path.join(d, h + '.py')
c = '%s.%s.code' % (p[:-3], sys.implementation.cache_tag)
def keep(path, data):
    t = '%s.%d.tmp' % (path, os.getpid())
    with open(os.open(t, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 'wb') as f:
        f.write(data)
    os.replace(t, path)
if n:
    s = sys.stdin.buffer.read(int(n))
    if hashlib.sha256(s).hexdigest() != h:
        sys.exit('mado: the program arrived incomplete (%d of %s bytes)' % (len(s), n))
    try:
        os.makedirs(d, 0o700, exist_ok=True)
        keep(p, s)
    except OSError as e:
        sys.exit('mado: cannot keep programs in %s: %s' % (d, e))
    old = time.time() - PRUNE_DAYS * 86400
    for e in os.scandir(d):
        try:
            if e.name.endswith(('.py', '.code', '.tmp')) and e.stat(follow_symlinks=False).st_mtime < old:
                os.unlink(e.path)
        except OSError:
            pass
else:
    try:
        with open(p, 'rb') as f:
            s = f.read()
            m = os.fstat(f.fileno()).st_mtime
    except OSError:
        s = b''
    if hashlib.sha256(s).hexdigest() != h:
        sys.stderr.write('mado: program %s is not on this computer\\n' % h)
        sys.exit(MISSING)
    if m < time.time() - 86400:
        for q in (p, c):
            try:
                os.utime(q)
            except OSError:
                pass
try:
    with open(c, 'rb') as f:
        code = marshal.load(f)
except Exception:
    code = compile(s, p, 'exec')
    try:
        keep(c, marshal.dumps(code))
    except OSError:
        pass
sys.argv = [p] + sys.argv[2:]
exec(code, {'__name__': '__main__', '__file__': p})
""".replace("CACHE_DIR", CACHE_DIR).replace("MISSING", str(MISSING)).replace("PRUNE_DAYS", str(PRUNE_DAYS))


class Program:
    """A program's bytes and their sha256 (its name on targets)."""

    def __init__(self, source, name="program"):
        self.source = source
        self.name = name
        self.sha256 = hashlib.sha256(source).hexdigest()

    @classmethod
    def of_file(cls, path):
        with open(path, "rb") as f:
            return cls(f.read(), os.path.basename(path))

    @classmethod
    def of_modules(cls, *modules, name=None):
        """One program of standard-library modules: their sources joined in order, the last one's
        `if __name__ == "__main__":` its entry. A module's imports of an earlier one are left out (the
        names are defined above it by then), so they must read `from <earlier module> import <names>`;
        `from __future__` imports go first. ValueError for an import of another module of the package
        that is not earlier in the list or has another form, and for a top-level name two modules
        define (the later one would silently replace the earlier)."""
        package = modules[-1].__name__.split(".")[0]
        defined, futures, parts = {}, [], []
        for module in modules:
            with open(module.__file__, encoding="utf-8") as f:
                text = f.read()
            lines = text.splitlines(keepends=True)
            for node in ast.parse(text).body:
                if _imports_between(node, module.__name__, package, defined):
                    if node.module == "__future__":
                        futures.append("".join(lines[node.lineno - 1:node.end_lineno]))
                    lines[node.lineno - 1:node.end_lineno] = [""] * (node.end_lineno - node.lineno + 1)
                    continue
                for top in _top_level_names(node):
                    if defined.get(top, module.__name__) != module.__name__:
                        raise ValueError(f"{module.__name__} and {defined[top]} both define {top}")
                    defined[top] = module.__name__
            parts.append(f"# -- {module.__name__} --\n" + "".join(lines))
        return cls("".join(futures + parts).encode("utf-8"), name or modules[-1].__name__.split(".")[-1] + ".py")

    def command(self, python, args, *, send):
        """The argv of one run; `send`: the program goes first on stdin."""
        ref = f"{self.sha256}:{len(self.source)}" if send else self.sha256
        # -S: no site-packages. The programs use the standard library only, and a target's site (.pth files of
        # conda or pyenv installs) can cost more than the program: 5 ms of 14 for /usr/bin/python3 here.
        return [python or "python3", "-I", "-S", "-c", BOOT, ref, *[str(a) for a in args]]


def _imports_between(node, importer, package, defined):
    """Whether `node` is an import that joining leaves out: `from __future__`, or one of an earlier
    module (checked: its names must be defined there)."""
    if isinstance(node, ast.Import):
        if any(alias.name.split(".")[0] == package for alias in node.names):
            raise ValueError(f"{importer}: `import {node.names[0].name}` cannot be joined; write `from … import`")
        return False
    if not isinstance(node, ast.ImportFrom):
        return False
    if node.module == "__future__":
        return True
    if node.level == 0 and (node.module or "").split(".")[0] != package:
        return False
    for alias in node.names:
        if node.level or alias.asname or defined.get(alias.name) != node.module:
            raise ValueError(f"{importer} imports {alias.name} from {'.' * node.level}{node.module}, which is not "
                             "an earlier module of the program defining it (or not by its own name)")
    return True


def _top_level_names(node):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return [t.id for t in targets if isinstance(t, ast.Name)]


_present = weakref.WeakKeyDictionary()  # connection -> sha256s sent or found there
_lock = threading.Lock()


def _hashes(connection):
    """Under _lock: the sha256s sent or found on `connection`; None for a connection that cannot be weakly
    referenced (never assumed to have a program)."""
    try:
        return _present.setdefault(connection, set())
    except TypeError:
        return None


def known(connection, program):
    with _lock:
        hashes = _hashes(connection)
        return hashes is not None and program.sha256 in hashes


def remember(connection, program):
    with _lock:
        hashes = _hashes(connection)
        if hashes is not None:
            hashes.add(program.sha256)


def forget(connection, program):
    with _lock:
        hashes = _hashes(connection)
        if hashes is not None:
            hashes.discard(program.sha256)


def is_missing(ran):
    return ran.exit_code == MISSING and b"mado: program " in ran.stderr


def run(connection, python, program, args=(), *, stdin=b"", timeout=60.0):
    """Run `program` with `args` on the connection's target, `stdin` its payload: by its hash first (a
    target keeps it across connections and worker restarts), and once more with the program after
    MISSING. `stdin` may be a seekable binary file (`_run_with_file`)."""
    if hasattr(stdin, "read"):
        return _run_with_file(connection, python, program, args, stdin, timeout)
    ran = connection.run(program.command(python, args, send=False), stdin=stdin, timeout=timeout)
    if is_missing(ran):
        ran = connection.run(program.command(python, args, send=True), stdin=program.source + stdin,
                             timeout=timeout)
    remember(connection, program)
    return ran


def _run_with_file(connection, python, program, args, stdin, timeout):
    """By hash where the connection knows the program (a missing copy: the file again from where it
    started, with the program); else the program and the file at once, joined in a temporary file, as a
    local process gets its stdin as the file itself."""
    start = stdin.tell()
    if known(connection, program):
        ran = connection.run(program.command(python, args, send=False), stdin=stdin, timeout=timeout)
        if not is_missing(ran):
            return ran
        stdin.seek(start)
    with tempfile.TemporaryFile(prefix="mado-program-") as joined:
        joined.write(program.source)
        shutil.copyfileobj(stdin, joined, 1 << 20)
        joined.seek(0)
        ran = connection.run(program.command(python, args, send=True), stdin=joined, timeout=timeout)
    remember(connection, program)
    return ran


def stream(connection, python, program, args=(), *, stdin=b"", timeout=15.0):
    """A long-lived run whose stdout is read as it comes (`connection.stream`). The program goes along
    unless known to be there; a stream that ends before its first byte makes the connection forget it,
    so the caller's next try sends it (a cleaned cache)."""
    send = not known(connection, program)
    opened = connection.stream(program.command(python, args, send=send),
                               stdin=(program.source if send else b"") + stdin, timeout=timeout)
    remember(connection, program)
    return _Watched(opened, lambda: forget(connection, program))


class _Watched:
    def __init__(self, inner, on_empty):
        self.inner = inner
        self._on_empty = on_empty
        self._seen = False

    def read(self, n):
        data = self.inner.read(n)
        if data:
            self._seen = True
        elif not self._seen:
            self._on_empty()
        return data

    def close(self):
        self.inner.close()

    def __getattr__(self, name):  # the stream's own attributes (a local process's `proc`)
        return getattr(self.inner, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
