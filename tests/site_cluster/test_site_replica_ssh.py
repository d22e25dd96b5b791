"""SSH between the replicas of a cluster job on a site, and the launchers' hostfiles there
(docs/cluster-jobs.md, "SSH between replicas" → "On sites"; issue 23).

The two-node Slurm of tests/peers/slurm.py (n1 and n2 on this host, NodeAddr 127.0.0.1) runs a real
2-replica Job under the login user `mmt`; a second real sshd (this file's `home_sshd`) reads that user's
own ~/.ssh/authorized_keys, as a node's sshd does, and stands for the nodes' sshd (the site variable
NODE_SSH_PORT names its port, since nothing listens on port 22 here). main1's code runs `ssh sub1 …` and
`ssh main1 …`, and its sshd connection shows it arrived; afterwards no line of the Job is left and its key
logs in nowhere. What cannot run here: two nodes with distinct addresses and their own sshd each (both
"nodes" are this host, so every replica's line lands in one shared home, as on a cluster with shared
homes; a per-node home is not exercised). PBS and Grid Engine have no scheduler here: their replicas are
checked through the runner's functions with PBS_NODEFILE, down to the files and `ssh -G` (the argv ssh
resolves for `ssh sub1`)."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.peers.sshd import CONFIG, SSHD, ensure_login_user, free_port, keygen
from tests.site_cluster.conftest import ClusterSite
from tests.site_e2e.conftest import open_site, settle, slurm_job_shell
from tests.support import wait_for
from worker_agent import authorized_keys, replica_ssh
from worker_agent.site import runner

from .test_slurm_two_nodes import replica_log


# -- a replica's files, without a scheduler (PBS: nodes from PBS_NODEFILE) ------------------------------

@pytest.fixture
def pbs_replica(tmp_path, monkeypatch, sshd):
    """What a PBS job shell that sets MMT_REPLICA_INDEX hands the runner of sub1: a node file, a home
    whose known_hosts holds the sshd's host key (hashed, as ssh writes it by default) under one node's
    name and the other's address, and the site variable NODE_SSH_PORT."""
    for name in (*runner.REPLICA_INDEX_VARIABLES, "MMT_CLUSTER_NODES", "SLURM_JOB_ID", "SLURM_JOB_NODELIST",
                 "SLURM_NODELIST", "PE_HOSTFILE", "MMT_NODE_SSH_PORT", "MMT_REPLICA_SSH", "MMT_VAR_REPLICA_SSH"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    host_key = sshd.host_public_key().split()
    known_hosts = home / ".ssh/known_hosts"
    known_hosts.write_text(f"[localhost]:{sshd.port} {host_key[0]} {host_key[1]}\n"
                           f"[127.0.0.1]:{sshd.port} {host_key[0]} {host_key[1]}\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(known_hosts)], check=True, capture_output=True)
    theirs = b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITheirOwnKeyStaysByteForByte someone@laptop"  # no final newline
    (home / ".ssh/authorized_keys").write_bytes(theirs)
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("localhost\nlocalhost\n127.0.0.1\n")  # one line per CPU: each node once, in order
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PBS_NODEFILE", str(nodefile))
    monkeypatch.setenv("PBS_JOBID", "77.pbs-server")
    monkeypatch.setenv("MMT_VAR_NODE_SSH_PORT", str(sshd.port))
    monkeypatch.setenv("MMT_REPLICA_INDEX", "1")
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir(mode=0o700)
    work = tmp_path / "work"
    work.mkdir()
    return {"home": home, "theirs": theirs, "spec_dir": spec_dir, "work": work, "host_key": host_key}


def prepared(world: dict, *, index: int = 1, runtime: str = "python") -> tuple[runner.Runner, dict, list, list]:
    """The runner of replica `index` up to the spec's extra files: (runner, cluster, files, PATH entries)."""
    os.environ["MMT_REPLICA_INDEX"] = str(index)
    job = {"id": 9001, "cluster_size": 2, "runtime": runtime, "walltime_seconds": 600, "gpu_ids": ["0", "1"],
           "command": ["python", "-c", "pass"], "computer": {"working_dir": str(world["work"])}}
    run = runner.Runner(runner.Spec(str(world["spec_dir"]), "http://127.0.0.1:9", "mado_mtj_" + "x" * 43, job))
    run.job = run.job_object(None)
    cluster = run.cluster_spec()
    files, prepend = run.launcher_files(cluster, str(world["work"]), runtime)
    return run, cluster, files, prepend


def written(files: list[dict], job_dir: Path) -> None:
    """The spec's files as the supervisor writes them."""
    for entry in files:
        path = job_dir / entry["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(entry["content"])
        path.chmod(entry.get("mode", 0o600))


def ssh_resolved(config: Path, name: str) -> dict[str, str]:
    ran = subprocess.run(["ssh", "-G", "-F", str(config), name], capture_output=True, text=True, check=True)
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in ran.stdout.splitlines() if " " in line}


def test_a_pbs_replica_gets_the_hostfiles_and_an_ssh_that_reaches_every_node_by_replica_name(pbs_replica, sshd,
                                                                                            capsys):
    world = pbs_replica
    run, cluster, files, prepend = prepared(world)
    job_dir = world["work"] / ".mmt/jobs/9001-sub1"
    assert run.nodes == ["localhost", "127.0.0.1"]
    by_path = {f["path"]: f for f in files}
    # Hostfiles: RANK order, slots = the GPUs of each node (the scheduler gives every node as many).
    assert by_path["inputs/cluster-hostfile"]["content"] == "main1 slots=2\nsub1 slots=2\n"
    assert by_path["inputs/cluster-nodes"]["content"] == "main1\nsub1\n"
    env = cluster["env"]
    assert (env["MMT_CLUSTER_HOSTFILE"], env["MMT_CLUSTER_NODEFILE"], env["MMT_CLUSTER_SSH_CONFIG"]) == (
        f"{job_dir}/inputs/cluster-hostfile", f"{job_dir}/inputs/cluster-nodes", f"{job_dir}/ssh/config")
    assert (env["RANK"], env["NODE_RANK"], env["WORLD_SIZE"], env["MMT_CLUSTER_HOST"]) == ("1", "1", "2", "sub1")
    assert prepend == [f"{job_dir}/ssh/bin"]
    assert by_path["ssh/id_ed25519"]["mode"] == 0o600 and by_path["ssh/bin/ssh"]["mode"] == 0o755

    # The Job's key: one pair in the spec directory for every runner, authorized with this replica's tag.
    pair = json.loads((world["spec_dir"] / runner.SSH_KEY_FILE).read_text())
    assert (world["spec_dir"] / runner.SSH_KEY_FILE).stat().st_mode & 0o777 == 0o600
    lines = (world["home"] / ".ssh/authorized_keys").read_bytes().split(b"\n")
    assert lines[1] == world["theirs"]  # theirs has no final newline: ours goes first, so theirs stays intact
    ours = lines[0].decode()
    assert ours.startswith('expiry-time="') and ours.endswith(" mado-job-9001@sub1.77.pbs-server")
    assert ours.split()[1:3] == pair["public"].split()[:2]
    assert "authorized in" in capsys.readouterr().err

    # main1's runner (another node, the same spec directory) uses the very same key.
    main, main_cluster, main_files, _ = prepared(world, index=0)
    assert {f["path"]: f for f in main_files}["ssh/id_ed25519"]["content"] == pair["private"]
    assert main_cluster["env"]["MMT_CLUSTER_SSH_CONFIG"].endswith("/9001-main1/ssh/config")

    written(files, job_dir)
    derived = subprocess.run(["ssh-keygen", "-y", "-f", str(job_dir / "ssh/id_ed25519")], capture_output=True,
                             text=True, check=True).stdout.split()
    assert derived[:2] == pair["public"].split()[:2]
    # The host keys under the replica names, found though the account's known_hosts is hashed.
    assert (job_dir / "ssh/known_hosts").read_text().splitlines() == [
        f"main1 {world['host_key'][0]} {world['host_key'][1]}", f"sub1 {world['host_key'][0]} {world['host_key'][1]}"]
    user = pwd.getpwuid(os.getuid()).pw_name
    for name in ("main1", "sub1"):
        seen = ssh_resolved(job_dir / "ssh/config", name)
        assert (seen["hostname"], seen["port"], seen["user"], seen["hostkeyalias"]) == (
            "127.0.0.1", str(sshd.port), user, name)
        assert seen["identityfile"] == str(job_dir / "ssh/id_ed25519")
        assert seen["userknownhostsfile"] == str(job_dir / "ssh/known_hosts")
        assert (seen["stricthostkeychecking"], seen["batchmode"]) == ("true", "yes")
    # The wrapper first on PATH runs the real ssh with the Job's config.
    path = f"{job_dir}/ssh/bin:{os.environ['PATH']}"
    wrapped = subprocess.run(["ssh", "-G", "sub1"], capture_output=True, text=True, env={**os.environ, "PATH": path},
                             check=True)
    assert f"port {sshd.port}\n" in wrapped.stdout and "hostkeyalias sub1\n" in wrapped.stdout

    # The end: each replica's line goes, theirs stays byte for byte.
    run.revoke_replica_ssh()
    assert b"sub1.77.pbs-server" not in (world["home"] / ".ssh/authorized_keys").read_bytes()
    main.revoke_replica_ssh()
    assert (world["home"] / ".ssh/authorized_keys").read_bytes() == world["theirs"]
    assert "The Job's SSH key is removed" in capsys.readouterr().err


def test_an_unknown_host_key_or_no_sshd_turns_ssh_off_and_the_replica_still_gets_its_hostfiles(pbs_replica, sshd,
                                                                                             monkeypatch, capsys):
    world = pbs_replica
    (world["home"] / ".ssh/known_hosts").write_text("")  # the nodes' host keys are unknown
    _run, cluster, files, prepend = prepared(world)
    assert [f["path"] for f in files] == ["inputs/cluster-hostfile", "inputs/cluster-nodes"] and prepend == []
    assert "MMT_CLUSTER_SSH_CONFIG" not in cluster["env"] and "MMT_CLUSTER_HOSTFILE" in cluster["env"]
    err = capsys.readouterr().err
    assert "SSH between the replicas is off for sub1 of Job 9001: the host key of node localhost" in err
    assert "never accepts an unknown one" in err
    assert (world["home"] / ".ssh/authorized_keys").read_bytes() == world["theirs"]
    assert not (world["spec_dir"] / runner.SSH_KEY_FILE).exists()

    # Known host key, but nothing answers on the nodes' ssh port.
    host_key = world["host_key"]
    closed = free_port()
    (world["home"] / ".ssh/known_hosts").write_text(f"[localhost]:{closed} {host_key[0]} {host_key[1]}\n")
    monkeypatch.setenv("MMT_VAR_NODE_SSH_PORT", str(closed))
    _run, cluster, files, _ = prepared(world)
    assert "MMT_CLUSTER_SSH_CONFIG" not in cluster["env"] and len(files) == 2
    assert f"no sshd answers on node localhost (127.0.0.1 port {closed})" in capsys.readouterr().err
    assert (world["home"] / ".ssh/authorized_keys").read_bytes() == world["theirs"]

    # Other runtimes, and a site that turns it off, get the hostfiles only.
    monkeypatch.setenv("MMT_VAR_NODE_SSH_PORT", str(sshd.port))
    _run, cluster, files, _ = prepared(world, runtime="apptainer")
    assert cluster["env"]["MMT_CLUSTER_HOSTFILE"] == "/mmt/inputs/cluster-hostfile" and len(files) == 2
    monkeypatch.setenv("MMT_VAR_REPLICA_SSH", "off")
    _run, cluster, files, _ = prepared(world)
    assert len(files) == 2 and "the site turns it off (REPLICA_SSH)" in capsys.readouterr().err


def test_grid_engine_nodes_come_from_pe_hostfile(tmp_path, monkeypatch):
    for name in ("MMT_CLUSTER_NODES", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "PBS_NODEFILE"):
        monkeypatch.delenv(name, raising=False)
    hostfile = tmp_path / "pe_hostfile"
    hostfile.write_text("node7.cluster 4 all.q@node7 UNDEFINED\nnode3.cluster 4 all.q@node3 UNDEFINED\n")
    monkeypatch.setenv("PE_HOSTFILE", str(hostfile))
    assert runner.cluster_nodes() == ["node7.cluster", "node3.cluster"]


def test_without_cryptography_the_key_comes_from_ssh_keygen(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.asymmetric.ed25519", None)
    pair = replica_ssh.new_key_pair("mado-job-5@main1.12")
    assert pair["public"].startswith("ssh-ed25519 ") and pair["public"].endswith(" mado-job-5@main1.12")
    key = tmp_path / "key"
    key.write_text(pair["private"])
    key.chmod(0o600)
    derived = subprocess.run(["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, check=True)
    assert derived.stdout.split()[:2] == pair["public"].split()[:2]


def test_expired_lines_of_ours_are_swept_and_nobody_elses(tmp_path):
    key = replica_ssh.new_key_pair("x")["public"]
    old = authorized_keys.key_line(key, "mado-job-1@main1.5", "202001010000")
    live = authorized_keys.key_line(key, "mado-job-2@main1.6", "209901010000")
    theirs = b'expiry-time="202001010000" ssh-ed25519 AAAAC3Nz their-own-expired-line\n'
    new, removed = authorized_keys.rewrite(theirs + old + live, expired_before="202612041200")
    assert (new, removed) == (theirs + live, 1)


# -- the real two-node Slurm -----------------------------------------------------------------------------

HOME_SSHD = CONFIG.replace("AuthorizedKeysFile {dir}/authorized_keys", "AuthorizedKeysFile .ssh/authorized_keys")


@pytest.fixture(scope="module")
def home_sshd():
    """An sshd that reads the login user's own ~/.ssh/authorized_keys (the nodes' sshd), and its host key
    in that user's ~/.ssh/known_hosts, as a cluster's users have their nodes' keys."""
    user = ensure_login_user()
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    server_dir = Path(tempfile.mkdtemp(prefix="mado-home-sshd-"))
    os.chmod(server_dir, 0o755)
    host = keygen(server_dir / "host_ed25519").split()
    port = free_port()
    (server_dir / "sshd_config").write_text(HOME_SSHD.format(port=port, dir=server_dir, user=user.pw_name))
    log = open(server_dir / "sshd.log", "wb")  # noqa: SIM115 -- closed at teardown
    process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(server_dir / "sshd_config")], stdout=log,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    wait_for(lambda: runner.sshd_answers("127.0.0.1", port) or process.poll() is not None, timeout=10,
             what="the nodes' sshd to listen")
    assert process.poll() is None, (server_dir / "sshd.log").read_text()
    ssh_dir = Path(user.pw_dir) / ".ssh"
    if not ssh_dir.exists():
        ssh_dir.mkdir(mode=0o700)
        os.chown(ssh_dir, user.pw_uid, user.pw_gid)
    known_hosts = ssh_dir / "known_hosts"
    existed = known_hosts.exists()
    line = f"[127.0.0.1]:{port} {host[0]} {host[1]}\n"
    with open(known_hosts, "a") as f:
        f.write(line)
    os.chown(known_hosts, user.pw_uid, user.pw_gid)
    yield {"port": port, "host_key": host, "user": user, "server_dir": server_dir, "known_hosts": known_hosts}
    rest = known_hosts.read_text().replace(line, "")
    if rest or existed:
        known_hosts.write_text(rest)
    else:
        known_hosts.unlink()
    process.terminate()
    process.wait(timeout=10)
    log.close()
    shutil.rmtree(server_dir, ignore_errors=True)


@pytest.fixture
def ssh_site(server, registered, world, sshd, slurm_two_nodes, two_node_conf, login_home, tmp_path, home_sshd):
    site = open_site(world, server, registered, sshd, tmp_path, login_home / "work-ssh",
                     job_shell=slurm_job_shell(),
                     variables=f"SLURM_CONF={two_node_conf}\nPARTITION=debug\nNODE_SSH_PORT={home_sshd['port']}")
    site.__class__ = ClusterSite
    yield site
    settle(site, lambda i: slurm_two_nodes.run("scancel", i, check=False), lambda i: bool(slurm_two_nodes.queue(i)))


# main1 reaches sub1 (and itself) by replica name over ssh and leaves a file in sub1's workspace, which
# sub1's code waits for; main1 also waits until sub1's runner has authorized its own line.
SSH_CODE = '''\
import os, pathlib, subprocess, sys, time
job = os.environ["MMT_JOB_ID"]
print("hostfile:" + open(os.environ["MMT_CLUSTER_HOSTFILE"]).read().replace("\\n", ";"), flush=True)
print("nodefile:" + open(os.environ["MMT_CLUSTER_NODEFILE"]).read().replace("\\n", ";"), flush=True)
work = pathlib.Path.cwd()
if os.environ["MMT_CLUSTER_ROLE"] == "main":
    keys = pathlib.Path.home() / ".ssh/authorized_keys"
    deadline = time.monotonic() + 120
    while sum(f"mado-job-{job}@" in l for l in keys.read_text().splitlines()) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    print("lines:" + ",".join(sorted(l.split()[-1].split("@")[1].split(".")[0]
                                     for l in keys.read_text().splitlines() if f"mado-job-{job}@" in l)), flush=True)
    sub_work = str(work).replace(f"/{job}-main1/", f"/{job}-sub1/")
    for name in ("sub1", "main1"):
        ran = subprocess.run(["ssh", name, f"echo reached {name} as $(id -un) via $SSH_CONNECTION"],
                             capture_output=True, text=True, timeout=120)
        print(f"ssh {name}: {ran.returncode} {ran.stdout.strip()} {ran.stderr.strip()}".strip(), flush=True)
    ran = subprocess.run(["ssh", "sub1", f"echo hello-from-main1 > {sub_work}/touched"], timeout=120)
    print(f"touched: {ran.returncode}", flush=True)
else:
    deadline = time.monotonic() + 180
    while not (work / "touched").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    print("sub1 got: " + (work / "touched").read_text().strip(), flush=True)
'''


def test_main1_reaches_sub1_over_ssh_on_a_two_node_slurm_and_the_key_is_gone_after(ssh_site, slurm_two_nodes,
                                                                                   home_sshd):
    site, slurm, port = ssh_site, slurm_two_nodes, home_sshd["port"]
    job = site.cluster_job(SSH_CODE, size=2, walltime_seconds=600)
    site.round()
    row = site.submission(job)
    assert row.status == "submitted", row.error
    slurm_id = row.scheduler_job_id
    job = site.wait_status(job, "finished", "failed", "canceled", timeout=240)
    logs = site.scheduler_logs(job)
    assert (job.status, job.exit_code) == ("finished", 0), (job.error, logs, replica_log(job, "main1", "stderr"))
    main, sub = replica_log(job, "main1"), replica_log(job, "sub1")
    for text in (main, sub):
        assert "hostfile:main1 slots=1;sub1 slots=1;" in text and "nodefile:main1;sub1;" in text
    # Both replicas' own lines were there while the code ran (one shared home, as on most clusters).
    assert "lines:main1,sub1\n" in main, main
    user = home_sshd["user"].pw_name
    for name in ("sub1", "main1"):
        line = next(l for l in main.splitlines() if l.startswith(f"ssh {name}: "))
        assert line.startswith(f"ssh {name}: 0 reached {name} as {user} via 127.0.0.1 "), main
        assert line.endswith(f" 127.0.0.1 {port}"), line  # through the nodes' sshd
    assert "touched: 0" in main and sub.endswith("sub1 got: hello-from-main1\n"), (main, sub)

    wait_for(lambda: not slurm.queue(slurm_id), timeout=60, what="the batch job to leave the queue")
    logs = site.scheduler_logs(job)  # every runner has left: their last notes are written
    assert logs.count("the Job's key is authorized in") == 2 and logs.count("The Job's SSH key is removed") == 2, logs
    # After the end: no line of the Job in the account's authorized_keys, and its key logs in nowhere.
    keys = (Path(home_sshd["user"].pw_dir) / ".ssh/authorized_keys").read_text()
    assert f"mado-job-{job.pk}@" not in keys
    key = site.work_dir / f".mmt/jobs/{job.pk}-main1/ssh/id_ed25519"
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "key"
        shutil.copy(key, copy)
        copy.chmod(0o600)
        (Path(scratch) / "known_hosts").write_text(f"[127.0.0.1]:{port} {' '.join(home_sshd['host_key'][:2])}\n")
        refused = subprocess.run(["ssh", "-F", "/dev/null", "-i", str(copy), "-o", "IdentitiesOnly=yes",
                                  "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={scratch}/known_hosts",
                                  "-o", "StrictHostKeyChecking=yes", "-p", str(port), f"{user}@127.0.0.1", "true"],
                                 capture_output=True, text=True, timeout=60)
    assert refused.returncode == 255 and "Permission denied" in refused.stderr, refused.stderr
