"""The GPU probe (worker_agent.gpu_remote): runs on a target with the computer's Python (3.6+, standard
library only), shipped by content hash (worker_agent.core.ship), and prints one JSON line per sample.

argv: interval seconds (0: one sample, then exit), the nvidia-smi GPU and apps queries and the format,
then optionally "gpus"/"nogpus" and the job's state.json (the supervisor's, with the pgid of the job's
process group; "-": its path comes on stdin, so no job path is on the probe's command line): with one,
each line also carries the CPU ticks and resident memory of that group's processes read from /proc.
Without a state.json it exits after a sample whose nvidia-smi failed (that does not heal by itself);
with one it says the error once and goes on sampling the CPU and memory only."""
import json
import os
import pwd
import select
import shutil
import subprocess
import sys
import time

PAGE = os.sysconf("SC_PAGE_SIZE")


def group(state_path):
    try:
        return read_group(state_path)
    except Exception as exc:  # a probe that dies here would take the GPU samples with it
        return {"error": repr(exc)[:200]}


def job_state(state_path):
    """The supervisor's state.json of the job ({} while there is none to read)."""
    try:
        with open(state_path) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def job_pgid(state):
    try:
        return int(state.get("pgid") or 0)
    except (ValueError, TypeError):
        return 0


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True


def read_group(state_path):
    state = job_state(state_path)
    pgid = job_pgid(state)
    # A Docker Job's group is the docker client's: the container's processes are the daemon's children, so
    # its CPU and memory are not the group's (docs/gpus.md: Docker Jobs report neither).
    if pgid <= 0 or state.get("runtime") == "docker":
        return None
    ticks = rss = count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/" + name + "/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) != pgid or fields[0] in ("Z", "X"):
            continue
        ticks += int(fields[11]) + int(fields[12])
        rss += int(fields[21]) * PAGE
        count += 1
    return {"ticks": ticks, "hz": os.sysconf("SC_CLK_TCK"), "rss": rss, "processes": count}


def smi(query, fmt):
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, "nvidia-smi is not on the PATH of the computer's login shell", None
    try:
        p = subprocess.run([exe, query, fmt], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    except subprocess.TimeoutExpired:
        return None, "nvidia-smi did not answer within 60 s", None
    out = p.stdout.decode("utf-8", "replace")
    if p.returncode != 0:
        said = (out + p.stderr.decode("utf-8", "replace")).strip()[:400]
        return None, said or "nvidia-smi failed", p.returncode
    return out, None, 0


def owner(pid):
    try:
        uid = os.stat("/proc/" + pid).st_uid
    except (OSError, ValueError):
        return [None, None]
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    job = None
    try:
        with open("/proc/" + pid + "/environ", "rb") as f:
            for entry in f.read().split(b"\0"):
                if entry.startswith(b"MMT_JOB_ID="):
                    job = entry[11:].decode("ascii", "replace")
    except OSError:
        pass
    return [user, job]


def main(argv):
    interval = float(argv[0])
    query_gpu, query_apps, fmt = argv[1], argv[2], argv[3]
    want_gpus = len(argv) <= 4 or argv[4] == "gpus"
    state_path = argv[5] if len(argv) > 5 else ""
    if state_path == "-":  # from stdin: the probe is the worker's, not one of the job's processes
        state_path = sys.stdin.readline().strip()
    reader_gone = select.poll()
    reader_gone.register(sys.stdout.fileno(), select.POLLERR | select.POLLHUP)
    while True:
        sample = {"time": time.time()}
        error = None
        if want_gpus:
            gpus, error, code = smi("--query-gpu=" + query_gpu, fmt)
            if error is None:
                apps, error, code = smi("--query-compute-apps=" + query_apps, fmt)
            if error is not None:
                sample.update(error=error, exit=code)
                want_gpus = False
            else:
                sample.update(gpus=gpus, apps=apps)
                pids = set(line.split(",")[1].strip() for line in apps.splitlines() if line.count(",") >= 2)
                sample["owners"] = dict((pid, owner(pid)) for pid in pids if pid.isdigit())
        if state_path:
            sample["group"] = group(state_path)
        sys.stdout.write(json.dumps(sample) + "\n")
        sys.stdout.flush()
        if interval <= 0 or (error is not None and not state_path):
            return 0
        # Ends with the job: once its process group has gone, the probe goes too; and once the worker has
        # closed its end of the stream (a hang-up on stdout), at once rather than at the next write. Both
        # looked at 5 times a second.
        pgid = job_pgid(job_state(state_path)) if state_path else 0
        until = time.time() + interval
        while time.time() < until:
            if pgid > 0 and not group_alive(pgid):
                return 0
            if reader_gone.poll(int(1000 * min(0.2, max(0.0, until - time.time())))):
                return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
