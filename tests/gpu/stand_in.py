"""A stand-in `nvidia-smi` for machines without an NVIDIA GPU (all of ours).

It prints exactly the documented CSV of the two queries the worker makes,
`--query-gpu=<fields> --format=csv,noheader,nounits` ("0, GPU-…, 37, 1536, 81559, 45, 71.23") and
`--query-compute-apps=<fields> --format=csv,noheader,nounits` ("GPU-…, 4242, 1536"; nothing when no
process uses a GPU), with `-l N` repeating every N seconds, and fails as the real one does when it
finds no GPU: "No devices were found" on stdout, exit 6 (NVML_ERROR_NOT_FOUND).

What it reports is a JSON file next to it (`state.json`) that a test rewrites at will:
{"gpus": [{"index": 0, "utilization": 37, "memory_used": 1536, ...}], "apps": [{"gpu": 1, "pid": 4242,
"used_memory": 512}]}. `install(directory)` also writes a `python3` wrapper that puts the directory first
on PATH: given to a computer as its Python, every program the worker runs there finds this nvidia-smi."""
from __future__ import annotations

import json
import os
from pathlib import Path

NVIDIA_SMI = r'''#!/usr/bin/python3
import json, os, sys, time
HERE = os.path.dirname(os.path.realpath(__file__))
FIELDS = {"index": "index", "uuid": "uuid", "name": "name", "utilization.gpu": "utilization",
          "memory.used": "memory_used", "memory.total": "memory_total", "temperature.gpu": "temperature",
          "power.draw": "power"}
def state():
    with open(os.path.join(HERE, "state.json")) as f:
        return json.load(f)
def gpu_value(gpu, field):
    if field == "uuid":
        return gpu.get("uuid") or "GPU-%08d-0000-0000-0000-000000000000" % int(gpu["index"])
    value = gpu.get(FIELDS.get(field, field), "[N/A]")
    return value if value is not None else "[N/A]"
def main(argv):
    query = next((a for a in argv if a.startswith("--query-")), None)
    fmt = next((a.split("=", 1)[1] for a in argv if a.startswith("--format=")), "")
    loop = float(argv[argv.index("-l") + 1]) if "-l" in argv else 0
    if query is None or fmt != "csv,noheader,nounits":
        print("stand-in nvidia-smi: only --query-gpu/--query-compute-apps with --format=csv,noheader,nounits")
        return 2
    kind, fields = query[2:].split("=", 1)
    fields = fields.split(",")
    while True:
        now = state()
        gpus = now.get("gpus") or []
        if not gpus:
            print("No devices were found")
            return 6
        with open(os.path.join(HERE, "calls"), "a") as f:
            f.write(kind + "\n")
        if kind == "query-gpu":
            rows = [[gpu_value(g, f) for f in fields] for g in gpus]
        else:
            by_index = dict((str(g["index"]), g) for g in gpus)
            rows = []
            for app in now.get("apps") or []:
                values = {"gpu_uuid": gpu_value(by_index[str(app["gpu"])], "uuid"), "pid": app["pid"],
                          "used_memory": app.get("used_memory", 0), "process_name": app.get("name", "python")}
                rows.append([values.get(f, "[N/A]") for f in fields])
        for row in rows:
            print(", ".join(str(v) for v in row))
        sys.stdout.flush()
        if not loop:
            return 0
        time.sleep(loop)
sys.exit(main(sys.argv[1:]))
'''

PYTHON = '#!/bin/sh\nPATH="{directory}:$PATH" exec /usr/bin/python3 "$@"\n'


def gpu(index: int, **values) -> dict:
    reading = {"index": index, "utilization": 37, "memory_used": 1536, "memory_total": 81559, "temperature": 45,
               "power": 71.23, "name": "NVIDIA H100 80GB HBM3"}
    reading.update(values)
    return reading


def write_state(directory: Path, gpus: list[dict], apps: list[dict] | None = None) -> None:
    path = Path(directory) / "state.json"
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"gpus": gpus, "apps": apps or []}))
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)  # the stand-in never reads half a file


def install(directory: Path, gpus: list[dict], apps: list[dict] | None = None, *, owner: tuple[int, int] | None = None
            ) -> Path:
    """The stand-in in `directory`; returns the `python3` wrapper to give the computer as its Python."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o777)  # the login user appends to `calls`
    smi = directory / "nvidia-smi"
    smi.write_text(NVIDIA_SMI)
    python = directory / "python3"
    python.write_text(PYTHON.format(directory=directory))
    for path in (smi, python):
        os.chmod(path, 0o755)
    write_state(directory, gpus, apps)
    if owner is not None:
        for path in (directory, smi, python, directory / "state.json"):
            os.chown(path, *owner)
    return python


def calls(directory: Path) -> list[str]:
    path = Path(directory) / "calls"
    return path.read_text().split() if path.exists() else []
