"""The connection check (REFERENCE §3): connect and run `true`, then send the standard-library probe
(`target_probe.py`) to `python3 -` on the target and turn its answer into the check result of
docs/worker-protocol.md. The first failure decides: without a connection every other item is
`not_checked`."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from worker_agent.ssh import CommandTimeout, ConnectError, ConnectionPool, Target
from worker_agent.text import sanitize_detail

log = logging.getLogger("mado.worker.probe")

ITEM_KEYS = ("python", "venv", "pip", "git", "docker", "apptainer", "singularity", "gpu", "work_directory", "api")
STATUSES = ("ok", "failed", "none", "not_checked")
PROBE_TIMEOUT = 90.0
PROBE_SOURCE = Path(__file__).with_name("target_probe.py").read_text(encoding="utf-8")
# Runs the probe with the computer's Python if it has one set, else the first python3 found; the
# probe itself reports whether that Python is good enough for jobs.
BOOTSTRAP = ('for p in "$1" python3 /usr/bin/python3 /usr/local/bin/python3; do '
             '[ -n "$p" ] && command -v "$p" >/dev/null 2>&1 && exec "$p" -; done; '
             'echo "no python3" >&2; exit 127')


# Details are English sentences; the server shows them in the reader's language by matching them
# against computers/check_details.py (unknown text is shown as sent): change a wording there too.
def _item(key: str, status: str, code: str | None = None, detail: str = "") -> dict:
    return {"key": key, "status": status, "code": code, "detail": detail}


def probe_script(params: dict) -> bytes:
    return (PROBE_SOURCE + f"\n\nmain(json.loads({json.dumps(json.dumps(params))}))\n").encode("utf-8")


RESULT_MARKER = "@@mado-probe-result@@ "


def parse_probe_output(stdout: bytes) -> dict | None:
    """The probe's JSON, found after its marker (a login shell may have printed other lines)."""
    for line in reversed(stdout.decode("utf-8", "replace").splitlines()):
        if line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER):])
    return None


def _scrub(value, secrets: tuple[str, ...]):
    """Drop any reported string that names the key or known_hosts file (the server refuses those)."""
    if isinstance(value, str):
        return None if any(s and s in value for s in secrets) else value
    if isinstance(value, list):
        kept = [_scrub(v, secrets) for v in value]
        return [v for v, orig in zip(kept, value, strict=True) if not (v is None and orig is not None)]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            scrubbed = _scrub(v, secrets)
            if scrubbed is None and v is not None:
                return None  # a record that named a secret goes entirely
            out[k] = scrubbed
        return out
    return value


def suggested_runtimes(items: list[dict]) -> list[str]:
    status = {i["key"]: i["status"] for i in items}
    runtimes = []
    if all(status.get(k) == "ok" for k in ("python", "venv", "pip")):
        runtimes.append("python")
    for name in ("docker", "apptainer", "singularity"):
        if status.get(name) == "ok":
            runtimes.append(name)
    return runtimes


def run_check(computer: dict, pool: ConnectionPool, *, api_url: str = "") -> tuple[str, dict]:
    """Check one computer; returns (`succeeded`|`failed`, result) ready for `checks/{id}/complete`."""
    target = Target.from_api(computer)
    first_key = "command_execution" if target.is_local else "connection"
    started = time.monotonic()
    params = {
        "python_path": str(computer.get("python_path") or ""),
        "working_dir": str(computer.get("working_dir") or ""),
        "gpu_ids": [str(g) for g in (computer.get("gpu_ids") or [])],
        "api_url": api_url,
    }
    try:
        connection = pool.get(target, fresh=True)
        ran = connection.run(["true"], timeout=15)
        if not ran.ok:
            raise ConnectError("ssh_failed", f"Running `true` on the target exited with {ran.exit_code}: check the "
                                             "SSH user's login shell.")
    except ConnectError as exc:
        items = [_item(first_key, "failed", exc.code, exc.detail)]
        items += [_item(k, "not_checked", None, "Needs a working connection.") for k in ITEM_KEYS]
        return "failed", _finish({"items": items}, target)
    except CommandTimeout:
        items = [_item(first_key, "failed", "ssh_failed", "Running `true` on the target did not finish in 15 s.")]
        items += [_item(k, "not_checked", None, "Needs a working connection.") for k in ITEM_KEYS]
        return "failed", _finish({"items": items}, target)
    connected = _item(first_key, "ok", None,
                      f"Commands run on {target.label}" if target.is_local else f"Logged in as {target.label}")

    try:
        ran = connection.run(["sh", "-c", BOOTSTRAP, "sh", params["python_path"]], stdin=probe_script(params),
                             timeout=max(5.0, PROBE_TIMEOUT - (time.monotonic() - started)))
        probe = parse_probe_output(ran.stdout) if ran.ok else None
    except (CommandTimeout, ConnectError, ValueError) as exc:
        log.warning("the probe on %s failed: %s", target.label, type(exc).__name__)
        probe, ran = None, None
    if not isinstance(probe, dict) or not isinstance(probe.get("items"), list):
        if ran is not None and ran.exit_code == 127:
            python = _item("python", "failed", "python_missing", "No Python 3 was found on the target.")
        else:
            reason = ran.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] if ran is not None else []
            python = _item("python", "failed", "python_missing",
                           "The check script could not run with the target's Python"
                           + (f": {reason[0]}" if reason else " within 90 s."))
        items = [connected, python] + [_item(k, "not_checked", None, "Needs a Python on the target.")
                                       for k in ITEM_KEYS[1:]]
        return "succeeded", _finish({"items": items}, target)

    by_key = {i.get("key"): i for i in probe["items"] if isinstance(i, dict)}
    items = [connected]
    for key in ITEM_KEYS:
        got = by_key.get(key) or {}
        status = got.get("status") if got.get("status") in STATUSES else "not_checked"
        code = got.get("code") if isinstance(got.get("code"), str) else None
        items.append(_item(key, status, code, str(got.get("detail") or "")))
    result = {
        "items": items,
        "machine": probe.get("machine") or {},
        "pythons": probe.get("pythons") or [],
        "workdirs": probe.get("workdirs") or [],
        "gpus": probe.get("gpus") or [],
        "runtimes": suggested_runtimes(items),
    }
    return "succeeded", _finish(result, target)


def _finish(result: dict, target: Target) -> dict:
    secrets = target.secrets
    for item in result["items"]:
        item["detail"] = sanitize_detail(item["detail"], secrets=secrets)
    for key, default in (("machine", {}), ("pythons", []), ("workdirs", []), ("gpus", []), ("runtimes", [])):
        value = result.get(key, default)
        scrubbed = _scrub(value, secrets)
        result[key] = scrubbed if scrubbed is not None else default
    return result
