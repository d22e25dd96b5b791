"""Helpers to render job shells into a temporary working directory and run them with stand-in
scheduler commands on PATH, and the trivial payload that stands in for the runner."""
from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from sites import shells
from tests.support import wait_for  # noqa: F401

# The payload the batch job starts instead of the Mado runner: it records what the job shell handed
# it, then waits until the test writes <spec dir>/release (60 s at most); SIGTERM is recorded.
RUNNER = """\
#!/bin/bash
spec=$1
trap 'echo TERM >> "$spec/signals"; exit 143' TERM
{
    echo "spec=$spec"
    echo "job=${MMT_JOB_ID-}"
    echo "index=${MMT_ARRAY_INDEX-}"
    echo "ids=${MMT_JOB_IDS-}"
} > "$spec/ran.tmp"
mv "$spec/ran.tmp" "$spec/ran"
for _ in $(seq 600); do
    [ -e "$spec/release" ] && exit 0
    sleep 0.1
done
exit 3
"""

# A stand-in command: appends {"argv": [...], "cwd": ...} as one JSON line to $STANDIN_LOG/<name>,
# copies a batch script given as the last argument, then runs the given shell snippet (its answer).
STANDIN = """\
#!/usr/bin/env python3
import json, os, shutil, sys
name = os.path.basename(sys.argv[0])
log = os.path.join(os.environ["STANDIN_LOG"], name)
with open(log, "a") as handle:
    handle.write(json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd()}}) + "\\n")
if len(sys.argv) > 1 and sys.argv[-1].endswith("/batch.sh"):
    shutil.copy(sys.argv[-1], log + ".batch")
sys.stdout.write({stdout!r})
sys.stderr.write({stderr!r})
sys.exit({code})
"""


@dataclass
class Rendered:
    script: Path
    values: shells.ShellValues
    spec_dirs: list[Path]
    work: Path
    content: str = ""

    @property
    def spec_dir(self) -> Path:
        return self.spec_dirs[0]

    def adopting(self, name: str = "adopt.sh") -> Path:
        """The same submission rendered again with adopt=True (the launcher's next try after the
        answer to this one was lost), written next to the first script."""
        script = self.script.with_name(name)
        script.write_text(shells.render_submit(self.content, self.values, title="test adopt", adopt=True))
        return script


def prepare(tmp_path: Path, template: str, *, job_ids=(101,), variables=None, gpu_count=0,
            walltime_seconds=3600, content: str | None = None) -> Rendered:
    """Spec directories for the Jobs (700, as the launcher makes them), the payload runner in the
    first one, and the rendered submit script."""
    work = tmp_path / "work"
    spec_dirs = []
    for job_id in job_ids:
        spec = work / ".mmt-submissions" / str(job_id)
        spec.mkdir(parents=True, mode=0o700)
        spec_dirs.append(spec)
    runner = spec_dirs[0] / "mmt-runner"
    runner.write_text(RUNNER)
    runner.chmod(0o700)
    values = shells.ShellValues(spec_dir=str(spec_dirs[0]), runner=str(runner), job_ids=list(job_ids),
                                project_id=3, target_id=7, gpu_count=gpu_count, walltime_seconds=walltime_seconds,
                                variables=dict(variables or {}))
    script = tmp_path / "submit.sh"
    content = content or shells.builtin_template(template)
    script.write_text(shells.render_submit(content, values, title=f"test {template}"))
    return Rendered(script, values, spec_dirs, work, content)


def standin(bin_dir: Path, name: str, *, stdout: str = "", stderr: str = "", code: int = 0) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(STANDIN.format(stdout=stdout, stderr=stderr, code=code))
    path.chmod(0o755)


def calls(bin_dir: Path, name: str) -> list[dict]:
    log = bin_dir / "log" / name
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def run(script: Path, bin_dir: Path | None = None, env: dict | None = None, timeout: float = 30):
    base = {k: v for k, v in os.environ.items() if not k.startswith("MMT_")}
    if bin_dir is not None:
        (bin_dir / "log").mkdir(parents=True, exist_ok=True)
        base["PATH"] = f"{bin_dir}:{base['PATH']}"
        base["STANDIN_LOG"] = str(bin_dir / "log")
    base.update(env or {})
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=base, timeout=timeout,
                          check=False)


def ran(spec: Path, timeout: float = 20) -> dict:
    """What the payload recorded, once it has started."""
    deadline = time.monotonic() + timeout
    while not (spec / "ran").exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"the runner never started in {spec}")
        time.sleep(0.05)
    return dict(line.split("=", 1) for line in (spec / "ran").read_text().splitlines())




def shellcheck(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["shellcheck", "--shell=bash", str(path)], capture_output=True, text=True, timeout=60,
                          check=False)
