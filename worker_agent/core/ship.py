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
found it there or sent it (remembered per connection). Connections are duck-typed:
`run(argv, stdin=, timeout=)` returning exit_code/stdout/stderr, and `stream(argv, stdin=, timeout=)`
with `read(n)`/`close()` for long-lived commands."""
import hashlib
import os
import threading
import weakref

CACHE_DIR = "~/.cache/mado/programs"
MISSING = 121  # the boot's exit code for "not on this target": no program exits with it here

# The first line names what runs in `ps` (a supervisor forked by `start` keeps this command line).
BOOT = """\
# mado: runs ~/.cache/mado/programs/<sha256>.py
import hashlib, marshal, os, sys
h, _, n = sys.argv[1].partition(':')
d = os.path.expanduser('CACHE_DIR')
p = os.path.join(d, h + '.py')
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
else:
    try:
        with open(p, 'rb') as f:
            s = f.read()
    except OSError:
        s = b''
    if hashlib.sha256(s).hexdigest() != h:
        sys.stderr.write('mado: program %s is not on this computer\\n' % h)
        sys.exit(MISSING)
c = '%s.%s.code' % (p[:-3], sys.implementation.cache_tag)
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
""".replace("CACHE_DIR", CACHE_DIR).replace("MISSING", str(MISSING))


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

    def command(self, python, args, *, send):
        """The argv of one run; `send`: the program goes first on stdin."""
        ref = f"{self.sha256}:{len(self.source)}" if send else self.sha256
        # -S: no site-packages. The programs use the standard library only, and a target's site (.pth files of
        # conda or pyenv installs) can cost more than the program: 5 ms of 14 for /usr/bin/python3 here.
        return [python or "python3", "-I", "-S", "-c", BOOT, ref, *[str(a) for a in args]]


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
    MISSING."""
    ran = connection.run(program.command(python, args, send=False), stdin=stdin, timeout=timeout)
    if is_missing(ran):
        ran = connection.run(program.command(python, args, send=True), stdin=program.source + stdin,
                             timeout=timeout)
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
