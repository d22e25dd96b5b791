"""Directory reads for step 2 of Add computer: the names and kinds in one directory of the target,
hidden entries included (the server filters them for display). Never file contents.

The listing runs as a POSIX shell script, so it works before a Python is chosen for the target.
Entries come back NUL-separated, so any byte in a name is safe."""
from __future__ import annotations

import logging

from worker_agent.ssh import CommandTimeout, ConnectError, ConnectionPool, Target

log = logging.getLogger("mado.worker.reads")

MAX_ENTRIES = 5000
READ_TIMEOUT = 20.0
ERRORS = ("not_found", "permission_denied", "connect_failed", "not_a_directory")

# $1 is the directory. Errors are told apart before listing; `[ -r ] && [ -x ]` because a directory
# we may enter but not read would otherwise list as empty.
LIST_SCRIPT = r'''
d=$1
case $d in "~") d=$HOME ;; "~/"*) d="$HOME/${d#"~/"}" ;; esac
m=@@mado-list@@
if [ ! -e "$d" ] && [ ! -L "$d" ]; then echo "$m ERR not_found"; exit 0; fi
if [ ! -d "$d" ]; then
  if [ -e "$d" ]; then echo "$m ERR not_a_directory"; else echo "$m ERR not_found"; fi; exit 0
fi
if [ ! -r "$d" ] || [ ! -x "$d" ]; then echo "$m ERR permission_denied"; exit 0; fi
cd -- "$d" 2>/dev/null || { echo "$m ERR permission_denied"; exit 0; }
echo "$m OK"
for f in * .[!.]* ..?*; do
  if [ -L "$f" ]; then k=symlink
  elif [ -d "$f" ]; then k=dir
  elif [ -f "$f" ] && [ -x "$f" ]; then k=exec
  elif [ -e "$f" ]; then k=file
  else continue
  fi
  printf '%s/%s\0' "$k" "$f"
done
'''


MARKER = b"@@mado-list@@ "


def parse_listing(stdout: bytes) -> tuple[list[dict], str | None]:
    # Anything a login shell printed before our header is skipped; names only come after it.
    start = 0 if stdout.startswith(MARKER) else stdout.find(b"\n" + MARKER) + 1
    if start == 0 and not stdout.startswith(MARKER):
        raise ValueError("no listing header")
    head, _, rest = stdout[start + len(MARKER):].partition(b"\n")
    head = head.strip()
    if head.startswith(b"ERR "):
        error = head[4:].decode("ascii", "replace").strip()
        return [], error if error in ERRORS else "permission_denied"
    if head != b"OK":
        raise ValueError("unexpected listing")
    entries = []
    for record in rest.split(b"\0"):
        if not record:
            continue
        kind, _, name = record.partition(b"/")
        if not name or kind.decode("ascii", "replace") not in ("dir", "file", "exec", "symlink"):
            continue
        entries.append({"name": name.decode("utf-8", "replace"), "kind": kind.decode("ascii")})
    entries.sort(key=lambda e: e["name"])
    return entries[:MAX_ENTRIES], None


def read_directory(connection_fields: dict, path: str, pool: ConnectionPool) -> tuple[list[dict], str | None]:
    """(entries, error) for `path` on the target described by `connection_fields` (the read's
    `connection`). Any failure to connect or to run the listing is `connect_failed`."""
    target = Target.from_api(connection_fields)
    if not path:
        return [], "not_found"
    try:
        connection = pool.get(target)
        ran = connection.run(["sh", "-c", LIST_SCRIPT, "sh", path], timeout=READ_TIMEOUT)
        if ran.exit_code != 0:
            return [], "connect_failed"
        return parse_listing(ran.stdout)
    except ConnectError as exc:
        log.info("directory read on %s: cannot connect (%s)", target.label, exc.code)
        return [], "connect_failed"
    except (CommandTimeout, ValueError):
        return [], "connect_failed"
