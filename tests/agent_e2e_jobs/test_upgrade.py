"""The worker replaced by a newer version while a job runs: `mado-tracking-worker install` into a venv of
its own, a job started, then `mado-tracking-worker upgrade --package-spec <wheel of 0.1.1>`: pip installs
the new version, the unit is restarted, and the job is neither killed nor started again; the new
worker re-attaches and delivers the rest.

No systemd runs on these machines, so `systemctl` is a stand-in (below) that does what systemd does
for this template unit: it reads the unit file `install` wrote, its EnvironmentFile and drop-ins,
starts ExecStart in a session of its own, and on restart signals only the main process
(`KillMode=process`, asserted to be in the unit), waits for it to exit, and starts it again. Both
versions are wheels built here from this checkout; pip installs them with no index."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent_e2e_jobs.conftest import counter_errors, counter_lines, job_lines, wait_until
from workers.models import Worker

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"

FAKE_SYSTEMCTL = r'''#!{python}
"""Stand-in for `systemctl --user` on a machine without systemd, for the worker's template unit."""
import os, re, signal, subprocess, sys, time
from pathlib import Path

state = Path(os.environ["FAKE_SYSTEMD_DIR"])
args = [a for a in sys.argv[1:] if a != "--user"]
units = Path(os.environ["HOME"]) / ".config" / "systemd" / "user"

def template(unit):
    name, _, instance = unit.partition("@")
    return units / f"{{name}}@.service", instance.removesuffix(".service")

def pid_of(unit):
    try:
        pid = int((state / f"{{unit}}.pid").read_text())
        st = open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[0]
        return pid if st not in ("Z", "X") else None
    except (OSError, ValueError):
        return None

def start(unit):
    path, instance = template(unit)
    text = path.read_text()
    for dropin in sorted((units / (path.name + ".d")).glob("*.conf")):
        text += "\n" + dropin.read_text()
    env = {{k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}}
    for line in text.splitlines():
        if line.startswith("EnvironmentFile="):
            for entry in Path(line.split("=", 1)[1].replace("%i", instance)).read_text().splitlines():
                if "=" in entry and not entry.startswith("#"):
                    k, _, v = entry.partition("=")
                    env[k.strip()] = v.strip()
        elif line.startswith("Environment="):
            k, _, v = line.split("=", 1)[1].partition("=")
            env[k] = v
    execstart = next(l.split("=", 1)[1] for l in text.splitlines() if l.startswith("ExecStart="))
    log = open(state / f"{{unit}}.log", "ab")
    proc = subprocess.Popen(execstart.split(), env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True, cwd=env.get("HOME", "/"))
    (state / f"{{unit}}.pid").write_text(str(proc.pid))

def stop(unit):
    pid = pid_of(unit)
    if pid:
        os.kill(pid, signal.SIGTERM)  # KillMode=process: the main process only
        deadline = time.monotonic() + 90
        while pid_of(unit) and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid_of(unit):
            os.kill(pid, signal.SIGKILL)

cmd, rest = args[0], args[1:]
if cmd == "daemon-reload":
    sys.exit(0)
if cmd == "is-active":
    print("active" if pid_of(rest[0]) else "inactive")
    sys.exit(0 if pid_of(rest[0]) else 3)
if cmd == "enable":
    unit = [a for a in rest if not a.startswith("-")][0]
    if "--now" in rest and not pid_of(unit):
        start(unit)
    sys.exit(0)
if cmd in ("start", "restart", "stop"):
    if cmd != "start":
        stop(rest[0])
    if cmd != "stop":
        start(rest[0])
    sys.exit(0)
if cmd == "show":
    pid = pid_of(rest[0])
    active = "active" if pid else "inactive"
    print(f"LoadState=loaded\nActiveState={{active}}\nSubState={{'running' if pid else 'dead'}}\nMainPID={{pid or 0}}")
    sys.exit(0)
print(f"fake systemctl: {{cmd}} is not implemented", file=sys.stderr)
sys.exit(1)
'''


def build_wheel_of_this_checkout(version: str, where: Path) -> Path:
    """A wheel of worker_agent/ as it is in this checkout, with `version`, assembled with zipfile (a wheel
    is a zip with METADATA, WHEEL, entry_points.txt and RECORD): the setuptools here cannot build wheels
    and nothing may be downloaded."""
    import base64
    import hashlib
    import tomllib
    import zipfile

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dist = f"mado_tracking-{version}.dist-info"
    files: dict[str, bytes] = {}
    for path in sorted((ROOT / "worker_agent").rglob("*.py")):
        data = path.read_bytes()
        if path.name == "__init__.py" and path.parent.name == "worker_agent":
            data = re.sub(rb'__version__ = ".*"', f'__version__ = "{version}"'.encode(), data)
        files[str(path.relative_to(ROOT))] = data
    metadata = ["Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {version}",
                f"Requires-Python: {project['requires-python']}"]
    metadata += [f"Requires-Dist: {dep}" for dep in project["dependencies"]]
    for extra, deps in project.get("optional-dependencies", {}).items():
        metadata.append(f"Provides-Extra: {extra}")
        metadata += [f'Requires-Dist: {dep}; extra == "{extra}"' for dep in deps]
    files[f"{dist}/METADATA"] = ("\n".join(metadata) + "\n").encode()
    files[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: mado-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{dist}/entry_points.txt"] = ("[console_scripts]\n" + "".join(
        f"{name} = {target}\n" for name, target in project["scripts"].items())).encode()
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    where.mkdir(parents=True, exist_ok=True)
    wheel = where / f"mado_tracking-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


@pytest.fixture
def worker_venv(tmp_path):
    """A venv for the installed worker. Its dependencies (click, requests, paramiko, …) come from this
    checkout's venv through a .pth file: nothing is downloaded. The package itself is not visible there."""
    venv = tmp_path / "worker-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    deps = tmp_path / "deps"
    deps.mkdir()
    skip = ("mado", "__editable__", "pip", "setuptools", "_distutils_hack", "distutils-precedence", "pkg_resources",
            "__pycache__")
    for entry in SITE.iterdir():
        if not entry.name.startswith(skip):
            os.symlink(entry, deps / entry.name)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "mado-test-deps.pth").write_text(f"{deps}\n")
    return venv


def test_an_upgrade_mid_job_restarts_the_worker_and_the_job_runs_on(e2e, worker_venv, tmp_path):
    old_wheel = build_wheel_of_this_checkout("0.1.0", tmp_path / "build")
    new_wheel = build_wheel_of_this_checkout("0.1.1", tmp_path / "build")
    python = worker_venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-index", str(old_wheel)], check=True,
                   capture_output=True, timeout=300)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "systemctl").write_text(FAKE_SYSTEMCTL.format(python=sys.executable))
    (bindir / "systemctl").chmod(0o755)
    systemd = tmp_path / "systemd"
    systemd.mkdir()
    token_file = tmp_path / "token"
    token_file.write_text(e2e.world.worker_token + "\n")
    token_file.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MMT_", "MADO_", "VIRTUAL_ENV", "PIP_"))}
    env.update(HOME=str(e2e.home), PATH=f"{bindir}:{env['PATH']}", FAKE_SYSTEMD_DIR=str(systemd), PIP_NO_INDEX="1")
    env.pop("XDG_STATE_HOME", None)
    env.pop("XDG_CONFIG_HOME", None)
    # What an operator would put in a drop-in: the SSH directory and a short long-poll (test teardown).
    dropin = e2e.home / ".config" / "systemd" / "user" / "mado-tracking-worker@.service.d" / "test.conf"
    dropin.parent.mkdir(parents=True)
    dropin.write_text(f"[Service]\nEnvironment=MMT_WORKER_SSH_DIR={e2e.sshd.client_dir}\n"
                      "Environment=MMT_WORKER_CLAIM_WAIT=2\nEnvironment=MMT_LOG_LEVEL=debug\n")
    cli = str(worker_venv / "bin" / "mado-tracking-worker")
    unit = "mado-tracking-worker@lab-worker-1.service"

    installed = subprocess.run([cli, "install", "--api-url", e2e.url, "--worker-id", "lab-worker-1",
                                "--token-file", str(token_file)], env=env, capture_output=True, text=True, timeout=120)
    try:
        assert installed.returncode == 0, installed.stderr
        unit_text = (e2e.home / ".config" / "systemd" / "user" / "mado-tracking-worker@.service").read_text()
        assert "KillMode=process" in unit_text and f"ExecStart={python} -m worker_agent run" in unit_text
        wait_until(lambda: Worker.objects.filter(worker_id="lab-worker-1", version="0.1.0").exists(), timeout=30,
                   what="the installed worker 0.1.0 to say hello")
        old_pid = int((systemd / f"{unit}.pid").read_text())

        # The job holds before line 2000 until the upgraded worker is back, so it outlasts a pip install and a
        # restart however long they take.
        job = e2e.counter_job("upgrade", lines=3000, pause=0.002, hold_at=2000, gpu_ids=["0"])
        e2e.wait_log(job, "line 000300", timeout=60)
        upgraded = subprocess.run([cli, "upgrade", "--worker-id", "lab-worker-1", "--package-spec", str(new_wheel)],
                                  env=env, capture_output=True, text=True, timeout=300)
        assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
        assert "Upgraded and restarted" in upgraded.stdout and "Running jobs were not stopped" in upgraded.stdout
        new_pid = int((systemd / f"{unit}.pid").read_text())
        assert new_pid != old_pid
        wait_until(lambda: Worker.objects.filter(worker_id="lab-worker-1", version="0.1.1").exists(), timeout=30,
                   what="the upgraded worker 0.1.1 to say hello")
        pid = int(e2e.starts("upgrade")[0])
        e2e.release("upgrade")

        e2e.wait_ended(job, timeout=90)
        job = e2e.assert_ended_once(job, "finished")
        assert e2e.stream(job, "stdout").splitlines() == counter_lines(3000)
        assert job_lines(e2e.stream(job, "stderr"), "err ") == counter_errors(3000)
        e2e.assert_delivered_in_order(job)
        assert e2e.starts("upgrade") == [str(pid)], "the job was neither killed nor started again"
        log = (systemd / f"{unit}.log").read_text()
        assert f"left 1 job(s) running on their targets: {job.pk}" in log, log[-3000:]
        assert "lab-worker-1 0.1.1 started" in log and f"resuming job {job.pk}" in log
        version = subprocess.run([str(python), "-c", "import worker_agent; print(worker_agent.__version__)"],
                                 capture_output=True, text=True, check=True, cwd=tmp_path).stdout.strip()
        assert version == "0.1.1"
    finally:
        subprocess.run([str(bindir / "systemctl"), "--user", "stop", unit], env=env, capture_output=True, timeout=120)
