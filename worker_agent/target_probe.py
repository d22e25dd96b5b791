"""The target side of a connection check, sent as the standard input of `python3 -`.

Standard library only and written for any Python 3 the target may have (no f-strings), because it
also runs where the Python is too old for jobs, to say so. It creates nothing on the target: the
working-directory test makes a temporary file and removes it at once. It prints one JSON object.
The worker appends the call `main({...})` with the check's parameters."""
import glob
import json
import os
import platform
import re
import subprocess
import sys
import tempfile

MIN_PYTHON = (3, 11)
STEP_TIMEOUT = 15
CONTAINER_FLAGS = ("--cleanenv", "--containall", "--no-home", "--no-mount", "--no-eval", "--pwd", "--nv")
WORKDIR_FS = ("ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs",
              "beegfs", "cephfs", "ceph", "glusterfs", "fuse.sshfs", "fuse.glusterfs", "f2fs", "overlay")
SYSTEM_PREFIXES = ("/proc", "/sys", "/dev", "/run", "/boot", "/snap", "/var/lib/docker", "/var/lib/containers",
                   "/etc", "/usr", "/bin", "/sbin", "/lib", "/var/snap")
MAX_WORKDIRS = 50
RESULT_MARKER = "@@mado-probe-result@@ "  # a login shell may print its own lines first
MAX_PYTHONS = 20

_ENV = dict(os.environ)
_ENV.update({"LC_ALL": "C", "LANG": "C", "PYTHONDONTWRITEBYTECODE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
             "PIP_NO_INPUT": "1", "DOCKER_CLI_HINTS": "false"})


def run(argv, timeout=STEP_TIMEOUT):
    """(exit code, stdout, stderr); 127 when the program does not exist, 124 on timeout."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=_ENV, universal_newlines=True)
    except (OSError, ValueError) as exc:
        return 127, "", str(exc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return 124, "", "timed out after %d s" % timeout
    return proc.returncode, out, err


def first_line(text):
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


# Details are English sentences; the server shows them in the reader's language by matching them
# against computers/check_details.py (unknown text is shown as sent): change a wording there too.
def item(key, status, code=None, detail=""):
    return {"key": key, "status": status, "code": code, "detail": detail}


def which(name):
    for directory in os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(os.pathsep):
        path = os.path.join(directory or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


# -- machine ------------------------------------------------------------------------------------

def arch_name(raw):
    raw = (raw or "").lower()
    if raw in ("x86_64", "amd64", "x64"):
        return "amd64"
    if raw in ("aarch64", "arm64", "armv8", "armv8l"):
        return "arm64"
    return raw


def memory_bytes():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def machine():
    return {"arch": arch_name(platform.machine()), "cores": os.cpu_count(), "memory_bytes": memory_bytes(),
            "home": os.path.expanduser("~")}


# -- pythons ------------------------------------------------------------------------------------

def version_tuple(text):
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not match:
        return None
    return tuple(int(x or 0) for x in match.groups())


def python_info(path):
    """(version string, executable) of the Python at `path`, or None if it does not run."""
    code, out, _ = run([path, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3]); print(sys.executable)"])
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    if code != 0 or not lines or version_tuple(lines[0]) is None:
        return None
    return lines[0], (lines[1] if len(lines) > 1 else path)


def python_locations():
    home = os.path.expanduser("~")
    names = ["python3"] + ["python3.%d" % minor for minor in range(30, 10, -1)]
    seen_dirs = []
    for directory in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/bin", "/usr/local/bin"]:
        if directory and directory not in seen_dirs:
            seen_dirs.append(directory)
    paths = []
    for directory in seen_dirs:
        for name in names:
            paths.append(os.path.join(directory, name))
    patterns = [home + "/.pyenv/versions/*/bin/python3", home + "/.local/bin/python3*",
                home + "/miniconda3/bin/python3", home + "/anaconda3/bin/python3", home + "/miniforge3/bin/python3",
                home + "/mambaforge/bin/python3", home + "/.conda/envs/*/bin/python3",
                home + "/miniconda3/envs/*/bin/python3", home + "/anaconda3/envs/*/bin/python3",
                "/opt/conda/bin/python3", "/opt/conda/envs/*/bin/python3", "/opt/python*/bin/python3",
                "/usr/local/python*/bin/python3"]
    for pattern in patterns:
        paths.extend(sorted(glob.glob(pattern)))
    return paths


def pythons():
    """Pythons ≥ 3.11 on the target, each once (by the file it resolves to), PATH order first."""
    found, seen = [], set()
    for path in python_locations():
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            continue
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        info = python_info(path)
        if info is None:
            continue
        if version_tuple(info[0]) >= MIN_PYTHON:
            found.append({"path": path, "version": info[0]})
        if len(found) >= MAX_PYTHONS:
            break
    return found


# -- items --------------------------------------------------------------------------------------

def check_python(python_path, candidates):
    """The python item and the interpreter the next items use (None when there is none usable)."""
    if python_path:
        info = python_info(python_path)
        if info is None:
            return item("python", "failed", "python_missing",
                        "%s does not exist or does not run on the target." % python_path), None
        if version_tuple(info[0]) < MIN_PYTHON:
            return item("python", "failed", "python_too_old",
                        "%s is Python %s; jobs need 3.11 or later." % (python_path, info[0])), None
        return item("python", "ok", None, "Python %s (%s)" % (info[0], info[1])), python_path
    if candidates:
        best = candidates[0]
        return item("python", "ok", None, "Python %s (%s)" % (best["version"], best["path"])), best["path"]
    current = python_info(which("python3") or sys.executable)
    if current is not None:
        return item("python", "failed", "python_too_old",
                    "The newest Python found is %s; jobs need 3.11 or later." % current[0]), None
    return item("python", "failed", "python_missing", "No Python 3 was found on the target."), None


def check_venv(python):
    code, _, err = run([python, "-c", "import venv, ensurepip"])
    if code == 0:
        return item("venv", "ok", None, "venv and ensurepip are available")
    return item("venv", "failed", "venv_missing",
                "venv or ensurepip is missing (%s); install python3-venv." % first_line(err)[-80:])


def check_pip(python):
    code, out, _ = run([python, "-m", "pip", "--version"])
    if code == 0:
        return item("pip", "ok", None, first_line(out)[:100])
    code, _, _ = run([python, "-c", "import ensurepip"])
    if code == 0:
        return item("pip", "ok", None, "pip is installed into each job's venv by ensurepip")
    return item("pip", "failed", "pip_missing", "pip is not available; install python3-pip.")


def check_git():
    code, out, _ = run(["git", "--version"])
    if code == 0:
        return item("git", "ok", None, first_line(out))
    return item("git", "none", "git_missing", "git is not installed.")


def check_docker():
    code, out, _ = run(["docker", "--version"])
    if code != 0:
        return item("docker", "none", "docker_missing", "docker is not installed.")
    client = first_line(out)
    code, out, err = run(["docker", "version", "--format", "{{.Server.Version}}"])
    if code == 0 and first_line(out):
        return item("docker", "ok", None, "%s; server %s" % (client, first_line(out)))
    if "permission denied" in (err or "").lower():
        return item("docker", "failed", "docker_socket_denied",
                    "The SSH user cannot use the Docker socket: add it to the docker group and log in again.")
    return item("docker", "failed", "docker_daemon_unreachable",
                "The Docker daemon is not reachable: start it (systemctl start docker).")


def check_container(name):
    code, out, _ = run([name, "--version"])
    if code != 0:
        return item(name, "none", name + "_missing", "%s is not installed." % name)
    version = first_line(out)
    code, out, err = run([name, "exec", "--help"])
    text = (out or "") + (err or "")
    missing = [flag for flag in CONTAINER_FLAGS if flag not in text]
    if code != 0 or missing:
        return item(name, "failed", "container_flags_missing",
                    "%s lacks exec %s; upgrade it." % (version, " ".join(missing) or "--help"))
    return item(name, "ok", None, version)


def parse_gpus(text):
    """Lines of `nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits`.
    A name may contain commas: index and uuid are split from the left, memory from the right."""
    gpus = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line:
            continue
        left = line.split(",", 2)
        if len(left) < 3:
            continue
        name_part, _, memory = left[2].rpartition(",")
        try:
            index = int(left[0].strip())
        except ValueError:
            continue
        try:
            memory_mib = int(float(memory.strip()))
        except ValueError:
            memory_mib = None
        gpus.append({"index": index, "uuid": left[1].strip(), "name": name_part.strip(), "memory_mib": memory_mib})
    return gpus


def check_gpu(gpu_ids):
    code, out, err = run(["nvidia-smi", "--query-gpu=index,uuid,name,memory.total",
                          "--format=csv,noheader,nounits"])
    gpus = parse_gpus(out) if code == 0 else []
    if gpus:
        names = ", ".join("%d: %s" % (g["index"], g["name"]) for g in gpus)
        return item("gpu", "ok", None, "%d GPU(s): %s" % (len(gpus), names)), gpus
    if code == 127:
        reason = "nvidia-smi is not installed"
    elif code == 0:
        reason = "nvidia-smi lists no GPUs"
    else:
        reason = "nvidia-smi failed: %s" % (first_line(err) or first_line(out) or "exit %d" % code)[:100]
    if gpu_ids:
        return item("gpu", "failed", "gpu_query_failed",
                    reason + ", but GPU IDs are set for this computer. Install the NVIDIA driver or clear the "
                    "GPU IDs."), []
    return item("gpu", "none", None, reason + "."), []


def nearest_existing(path):
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def free_bytes(path):
    try:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize
    except OSError:
        return None


def check_workdir(working_dir):
    if not working_dir:
        return item("work_directory", "not_checked", None, "No working directory has been entered yet.")
    working_dir = os.path.expanduser(working_dir)
    base = nearest_existing(working_dir)
    if not os.path.isdir(base):
        return item("work_directory", "failed", "work_directory_not_writable",
                    "%s is not a directory." % base)
    try:
        fd, name = tempfile.mkstemp(prefix=".mmt-check-", dir=base)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        return item("work_directory", "failed", "work_directory_not_writable",
                    "The SSH user cannot write in %s (%s)." % (base, exc.strerror or "error"))
    free = free_bytes(base)
    if base == os.path.abspath(working_dir):
        where = "%s is writable" % working_dir
    else:
        where = "%s does not exist yet and can be created in %s" % (working_dir, base)
    if free is None:
        return item("work_directory", "ok", None, where)
    return item("work_directory", "ok", None, "%s; %.1f GiB free" % (where, free / 1024.0 ** 3))


def check_api(api_url):
    if not api_url:
        return item("api", "not_checked", None, "No API URL was given to check.")
    try:
        from urllib.request import Request, urlopen
        request = Request(api_url.rstrip("/") + "/api/health", headers={"Accept": "application/json"})
        response = urlopen(request, timeout=5)
        body = json.loads(response.read(65536).decode("utf-8", "replace"))
        if response.status == 200 and body.get("status") == "ok":
            return item("api", "ok", None, "%s answers (version %s)" % (api_url, body.get("version", "?")))
        return item("api", "failed", "api_unreachable", "%s answered without status ok." % api_url)
    except Exception as exc:  # any failure means jobs on this target cannot record
        reason = getattr(exc, "reason", None) or type(exc).__name__
        return item("api", "failed", "api_unreachable",
                    "The target cannot reach %s (%s): jobs need it to record." % (api_url, reason))


# -- working directory candidates ---------------------------------------------------------------

def mount_points():
    points = []
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                point = parts[1].replace("\\040", " ")
                if parts[2] not in WORKDIR_FS and not parts[2].startswith("fuse."):
                    continue
                if point == "/" or any(point == p or point.startswith(p + "/") for p in SYSTEM_PREFIXES):
                    continue
                points.append(point)
    except OSError:
        pass
    return points


def workdir_candidates():
    home = os.path.expanduser("~")
    places = [home]
    places.extend(mount_points())
    places.extend(p for p in ("/data", "/work", "/scratch", "/workspace", "/mnt/data", "/srv/data")
                  if os.path.isdir(p))
    try:
        entries = sorted(os.listdir(home))
    except OSError:
        entries = []
    for name in entries:
        path = os.path.join(home, name)
        if not name.startswith(".") and os.path.isdir(path) and not os.path.islink(path):
            places.append(path)
    result, seen = [], set()
    for path in places:
        if path in seen or not os.path.isdir(path):
            continue
        seen.add(path)
        result.append({"path": path, "writable": os.access(path, os.W_OK | os.X_OK), "free_bytes": free_bytes(path)})
        if len(result) >= MAX_WORKDIRS:
            break
    return result


# -- the whole check ----------------------------------------------------------------------------

def main(params):
    candidates = pythons()
    items = []
    python_item, python = check_python(params.get("python_path") or "", candidates)
    items.append(python_item)
    if python:
        items.append(check_venv(python))
        items.append(check_pip(python))
    else:
        items.append(item("venv", "not_checked", None, "Needs a Python 3.11 or later."))
        items.append(item("pip", "not_checked", None, "Needs a Python 3.11 or later."))
    items.append(check_git())
    items.append(check_docker())
    items.append(check_container("apptainer"))
    items.append(check_container("singularity"))
    gpu_item, gpus = check_gpu(params.get("gpu_ids") or [])
    items.append(gpu_item)
    items.append(check_workdir(params.get("working_dir") or ""))
    items.append(check_api(params.get("api_url") or ""))
    result = {"items": items, "machine": machine(), "pythons": candidates, "workdirs": workdir_candidates(),
              "gpus": gpus}
    sys.stdout.write("\n" + RESULT_MARKER + json.dumps(result) + "\n")
    sys.stdout.flush()
