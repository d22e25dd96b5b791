"""A real Son of Grid Engine 8.1.9 (Debian 12's gridengine-* packages) on this machine, for tests
(recipe: shared/peers/README.md, "Grid Engine"), with the recipe's five fixes:

1. act_qmaster names this host;
2. host_aliases maps the host to `localhost runsc` before the qmaster starts;
3. submit host, exec host, host group and queue added (`pe_list NONE`);
4. the global configuration allows root (min_uid/min_gid 0), since the tests run as root;
5. the scheduler runs every second (`schedule_interval 0:0:1`, `flush_submit_sec 1`).

Two more: the queue has no load threshold, because this small shared machine's load average often
puts a 2-slot queue in alarm state and then nothing is scheduled; and no shell starts as a login shell
(`login_shells none`): root's profile here runs `pyenv rehash`, whose lock file a job killed by qdel
leaves behind, and every later job then waited 60 s for that lock before its first line ran.

Grid Engine keeps one cell per machine (/var/lib/gridengine, /var/spool/gridengine), so a file lock
serialises test runs that use it. Daemons this fixture starts are stopped by PID; ones that already
ran are reused and left running. Debian packages: gridengine-master gridengine-exec gridengine-client."""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SGE_ROOT = Path("/var/lib/gridengine")
SGE_CELL = "default"
SPOOL = Path("/var/spool/gridengine")
LOCK = Path(tempfile.gettempdir()) / "mado-gridengine.lock"

EXEC_HOST = """\
hostname              {host}
load_scaling          NONE
complex_values        NONE
user_lists            NONE
xuser_lists           NONE
projects              NONE
xprojects             NONE
usage_scaling         NONE
report_variables      NONE
"""
HOST_GROUP = "group_name @allhosts\nhostlist {host}\n"
QUEUE = """\
qname all.q
hostlist @allhosts
seq_no 0
load_thresholds NONE
suspend_thresholds NONE
nsuspend 1
suspend_interval 00:05:00
priority 0
min_cpu_interval 00:05:00
processors UNDEFINED
qtype BATCH INTERACTIVE
ckpt_list NONE
pe_list NONE
rerun FALSE
slots 2
tmpdir /tmp
shell /bin/bash
prolog NONE
epilog NONE
shell_start_mode posix_compliant
starter_method NONE
suspend_method NONE
resume_method NONE
terminate_method NONE
notify 00:00:60
owner_list NONE
user_lists NONE
xuser_lists NONE
subordinate_list NONE
complex_values NONE
projects NONE
xprojects NONE
calendar NONE
initial_state default
""" + "".join(f"{limit} INFINITY\n" for limit in (
    "s_rt", "h_rt", "s_cpu", "h_cpu", "s_fsize", "h_fsize", "s_data", "h_data", "s_stack", "h_stack", "s_core",
    "h_core", "s_rss", "h_rss", "s_vmem", "h_vmem"))
SCHEDULER = """\
algorithm default
schedule_interval 0:0:1
maxujobs 0
queue_sort_method load
job_load_adjustments np_load_avg=0.50
load_adjustment_decay_time 0:7:30
load_formula np_load_avg
schedd_job_info true
flush_submit_sec 1
flush_finish_sec 1
params none
reprioritize_interval 0:0:0
halftime 168
usage_weight_list cpu=1.000000,mem=0.000000,io=0.000000
compensation_factor 5.000000
weight_user 0.250000
weight_project 0.250000
weight_department 0.250000
weight_job 0.250000
weight_tickets_functional 0
weight_tickets_share 0
share_override_tickets TRUE
share_functional_shares TRUE
max_functional_jobs_to_schedule 200
report_pjob_tickets TRUE
max_pending_tasks_per_job 50
halflife_decay_list none
policy_hierarchy OFS
weight_ticket 0.500000
weight_waiting_time 0.278000
weight_deadline 3600000.000000
weight_urgency 0.500000
weight_priority 0.000000
max_reservation 0
default_duration INFINITY
"""
GLOBAL_CONF = """\
execd_spool_dir {spool}/execd
mailer /usr/bin/mail
xterm /usr/bin/xterm
load_sensor none
prolog none
epilog none
shell_start_mode posix_compliant
login_shells none
min_uid 0
min_gid 0
user_lists none
xuser_lists none
projects none
xprojects none
enforce_project false
enforce_user auto
load_report_time 00:00:40
max_unheard 00:05:00
reschedule_unknown 00:00:00
loglevel log_warning
administrator_mail root
set_token_cmd none
pag_cmd none
token_extend_time none
shepherd_cmd none
qmaster_params none
execd_params none
reporting_params accounting=true reporting=false flush_time=00:00:15 joblog=false sharelog=00:00:00
finished_jobs 100
gid_range 65400-65500
qlogin_command builtin
qlogin_daemon builtin
rlogin_command builtin
rlogin_daemon builtin
rsh_command builtin
rsh_daemon builtin
max_aj_instances 2000
max_aj_tasks 75000
max_u_jobs 0
max_jobs 0
auto_user_oticket 0
auto_user_fshare 0
auto_user_default_project none
auto_user_delete_time 86400
delegated_file_staging false
reprioritize 0
jsv_url none
jsv_allowed_mod ac,h,i,e,o,j,M,N,p,w
"""


@dataclass
class GridEngine:
    host: str
    lock: object
    started: list[int] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SGE_ROOT": str(SGE_ROOT), "SGE_CELL": SGE_CELL}

    def run(self, *argv: str, check: bool = True, cwd=None) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=30, check=check,
                              cwd=cwd)

    def state(self, job_id: str) -> str | None:
        """The job's state letters in qstat (qw, r, t, Eqw …), or None once it left the queue."""
        for line in self.run("qstat", "-u", "*").stdout.splitlines()[2:]:
            fields = line.split()
            if fields and fields[0] == job_id:
                return fields[4]
        return None

    def stop(self) -> None:
        try:
            for pid in reversed(self.started):
                _signal(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30  # the qmaster takes 5–8 s to stop
            while any(_alive(pid) for pid in self.started) and time.monotonic() < deadline:
                time.sleep(0.2)
            for pid in self.started:
                if _alive(pid):
                    _signal(pid, signal.SIGKILL)
        finally:
            self.lock.close()


def _alive(pid: int, name: str | None = None) -> bool:
    """Running (not a zombie), and named `name` when given (a PID file may be stale)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    state = stat[stat.rindex(")") + 2]
    return state not in "ZX" and (name is None or comm == name)


def _signal(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _pid_from(paths, name: str, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while True:
        for path in paths():
            try:
                pid = int(Path(path).read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            if _alive(pid, name):
                return pid
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)


def _qmaster_pid(timeout: float = 0) -> int | None:
    return _pid_from(lambda: [SPOOL / "qmaster" / "qmaster.pid"], "sge_qmaster", timeout)


def _execd_pid(timeout: float = 0) -> int | None:
    return _pid_from(lambda: list((SPOOL / "execd").glob("*/execd.pid")), "sge_execd", timeout)


def start_gridengine() -> GridEngine:
    if not Path("/usr/sbin/sge_qmaster").exists() or not shutil.which("qsub"):
        raise RuntimeError("Grid Engine is not installed: apt-get install -y --no-install-recommends "
                           "gridengine-master gridengine-exec gridengine-client")
    lock = open(LOCK, "w")  # noqa: SIM115  (held until stop() closes it)
    fcntl.flock(lock, fcntl.LOCK_EX)
    host = socket.gethostname()
    engine = GridEngine(host=host, lock=lock)
    try:
        common = SGE_ROOT / SGE_CELL / "common"
        if _qmaster_pid() is None:
            (common / "act_qmaster").write_text(host + "\n")  # fix 1
            (common / "host_aliases").write_text(f"{host} localhost runsc\n")  # fix 2
            subprocess.run(["/usr/sbin/sge_qmaster"], env=engine.env, check=True, timeout=30)  # daemonizes
            pid = _qmaster_pid(timeout=15)
            if pid is None:
                raise RuntimeError("sge_qmaster did not start; see /var/spool/gridengine/qmaster/messages")
            engine.started.append(pid)
        _configure(engine)
        if _execd_pid() is None:
            # After the global configuration: the execd reads min_uid when it starts.
            subprocess.run(["/usr/sbin/sge_execd"], env=engine.env, check=True, timeout=30)
            pid = _execd_pid(timeout=15)
            if pid is None:
                raise RuntimeError("sge_execd did not start; see /var/spool/gridengine/execd/*/messages")
            engine.started.append(pid)
        engine.run("qmod", "-c", "all.q", check=False)  # clear an error state left by an earlier run
        _wait_for_queue(engine)
        return engine
    except BaseException:
        engine.stop()
        raise


def _configure(engine: GridEngine) -> None:
    with tempfile.TemporaryDirectory(prefix="mado-sge-") as tmp:
        files = {"exechost": EXEC_HOST.format(host=engine.host), "hostgroup": HOST_GROUP.format(host=engine.host),
                 "queue": QUEUE, "sconf": SCHEDULER, "global": GLOBAL_CONF.format(spool=SPOOL)}
        for name, text in files.items():
            Path(tmp, name).write_text(text)
        engine.run("qconf", "-as", engine.host, check=False)  # fix 3 (already there on a second run)
        for add, modify, name in (("-Ae", "-Me", "exechost"), ("-Ahgrp", "-Mhgrp", "hostgroup"),
                                  ("-Aq", "-Mq", "queue")):
            if engine.run("qconf", add, name, cwd=tmp, check=False).returncode != 0:
                engine.run("qconf", modify, name, cwd=tmp)
        engine.run("qconf", "-Msconf", "sconf", cwd=tmp)  # fix 5
        engine.run("qconf", "-Mconf", "global", cwd=tmp)  # fix 4: the file name is the configuration's


def _wait_for_queue(engine: GridEngine) -> None:
    """Until the execd reported in: the queue instance has a load value and no unknown/error state."""
    deadline = time.monotonic() + 30
    while True:
        lines = engine.run("qstat", "-f", check=False).stdout.splitlines()
        instance = next((line.split() for line in lines if line.startswith("all.q@")), None)
        if instance and instance[3] != "-NA-" and len(instance) == 5:
            return
        if time.monotonic() > deadline:
            raise RuntimeError("The Grid Engine queue did not come up:\n" + "\n".join(lines))
        time.sleep(0.2)


@pytest.fixture(scope="session")
def gridengine():
    engine = start_gridengine()
    yield engine
    engine.stop()
