"""SSH between replicas and the launchers' hostfiles (docs/cluster-jobs.md, "SSH between replicas",
"Hostfiles"): the authorized_keys rewrite as it runs on a computer (worker_agent/authorized_keys.py, here
on files in a temporary home), the key pair and the ssh_config read by the real OpenSSH client
(`ssh -G`, `ssh-keygen -y`), and the hostfiles against the replica environment."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import paramiko
import pytest

from worker_agent import authorized_keys, jobenv, replica_ssh
from worker_agent.core import ship
from worker_agent.ssh import LocalConnection

TAG = "mado-job-42@gpu-host-1"
THEIRS = (b"# the lab's keys\n"
          b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0 alice@laptop\r\n"
          b"\n"
          b'from="10.0.0.0/8" ssh-rsa AAAAB3NzaC1yc2E bob mado-job-7 not ours\n'
          b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFx1 carol")  # no end of line


def public_key() -> str:
    return replica_ssh.new_key_pair(TAG)["public"]


def our_line(tag: str = TAG, expiry: str | None = "202701011200") -> bytes:
    return authorized_keys.key_line(public_key(), tag, expiry)


class TestRewrite:
    def test_adding_keeps_every_other_line_byte_for_byte_and_removing_gives_the_same_bytes_back(self):
        line = our_line()
        for theirs in (THEIRS, THEIRS + b"\n", b""):
            new, removed = authorized_keys.rewrite(theirs, add=line)
            # A last line without an end of line stays last: ours goes in front of the first.
            assert new == (line + theirs if theirs == THEIRS else theirs + line) and removed == 0
            assert authorized_keys.rewrite(new, remove=[TAG]) == (theirs, 1)
        assert line.startswith(b'expiry-time="202701011200",no-agent-forwarding,no-X11-forwarding,no-port-forwarding ssh-ed25519 ')
        assert line.endswith(b" " + TAG.encode() + b"\n")

    def test_adding_again_replaces_the_jobs_line_and_removing_leaves_the_file_as_it_was(self):
        once, _ = authorized_keys.rewrite(THEIRS + b"\n", add=our_line(expiry="202701011200"))
        twice, removed = authorized_keys.rewrite(once, add=our_line(expiry="202702021200"))
        assert removed == 0 and twice.count(TAG.encode()) == 1 and b"202702021200" in twice
        assert authorized_keys.rewrite(twice, remove=[TAG]) == (THEIRS + b"\n", 1)

    def test_the_sweep_removes_only_this_workers_lines_of_jobs_it_no_longer_runs(self):
        data = THEIRS + b"\n" + b"".join(our_line(tag) for tag in (
            "mado-job-40@gpu-host-1", "mado-job-41@gpu-host-1", "mado-job-40@other-worker"))
        new, removed = authorized_keys.rewrite(data, add=our_line(), worker="gpu-host-1", keep=[41, 42])
        assert removed == 1
        tags = [authorized_keys.tag_of(line) for line in authorized_keys.split_lines(new)]
        assert [t for t in tags if t] == [(41, "gpu-host-1"), (40, "other-worker"), (42, "gpu-host-1")]
        assert new.startswith(THEIRS + b"\n")

    def test_lines_that_merely_mention_mado_are_not_ours(self):
        for line in (b"ssh-ed25519 AAAA mado-job-42\n", b"ssh-ed25519 AAAA mado-job-42@gpu-host-1 extra\n",
                     b"ssh-ed25519 AAAA xmado-job-42@gpu-host-1\n"):
            assert authorized_keys.tag_of(line) is None
            assert authorized_keys.rewrite(line, remove=[TAG], worker="gpu-host-1", keep=[]) == (line, 0)


def edit_on(home, op: dict):
    """The operation as the worker runs it on a computer: the module shipped (worker_agent.core.ship), as
    the SSH user whose home is `home`."""
    computer = LocalConnection(env={"HOME": str(home), "PATH": os.environ["PATH"]})
    return ship.run(computer, sys.executable, replica_ssh.PROGRAM, [json.dumps(op, sort_keys=True)], timeout=60)


def run_remote(home, op: dict) -> dict:
    ran = edit_on(home, op)
    assert ran.exit_code == 0, ran.stderr
    return json.loads(ran.stdout.decode().strip().splitlines()[-1])


def authorize(home, tag=TAG, keep=(42,)) -> dict:
    return run_remote(home, replica_ssh.authorize_op(public_key=public_key(), tag=tag, seconds=3600,
                                                     worker_id="gpu-host-1", keep=keep))


class TestOnAComputer:
    def test_the_file_keeps_its_mode_and_other_lines_and_nothing_is_left_beside_it(self, tmp_path):
        ssh = tmp_path / ".ssh"
        ssh.mkdir(mode=0o700)
        keys = ssh / "authorized_keys"
        keys.write_bytes(THEIRS)
        keys.chmod(0o640)
        answer = authorize(tmp_path)
        assert answer["added"] and answer["path"] == str(keys) and len(answer["expiry"]) == 12
        assert stat.S_IMODE(keys.stat().st_mode) == 0o640
        assert keys.read_bytes().endswith(THEIRS) and keys.read_bytes().count(TAG.encode()) == 1
        assert run_remote(tmp_path, replica_ssh.revoke_op([TAG]))["removed"] == 1
        assert keys.read_bytes() == THEIRS and stat.S_IMODE(keys.stat().st_mode) == 0o640
        assert sorted(p.name for p in ssh.iterdir()) == [".mado-authorized_keys.lock", "authorized_keys"]

    def test_a_missing_ssh_directory_is_made_private_and_a_revoke_makes_none(self, tmp_path):
        assert run_remote(tmp_path, replica_ssh.revoke_op([TAG])) == {"added": False, "removed": 0, "expiry": None,
                                                                      "path": None}
        assert not (tmp_path / ".ssh").exists()
        authorize(tmp_path)
        assert stat.S_IMODE((tmp_path / ".ssh").stat().st_mode) == 0o700
        assert stat.S_IMODE((tmp_path / ".ssh" / "authorized_keys").stat().st_mode) == 0o600

    def test_a_linked_file_stays_a_link_and_its_target_is_rewritten(self, tmp_path):
        (tmp_path / ".ssh").mkdir()
        real = tmp_path / "dotfiles-authorized_keys"
        real.write_bytes(THEIRS + b"\n")
        (tmp_path / ".ssh" / "authorized_keys").symlink_to(real)
        authorize(tmp_path)
        assert (tmp_path / ".ssh" / "authorized_keys").is_symlink()
        assert real.read_bytes().count(TAG.encode()) == 1

    def test_a_file_that_cannot_be_rewritten_is_an_error_the_worker_can_report(self, tmp_path):
        (tmp_path / ".ssh" / "authorized_keys").mkdir(parents=True)  # (root may write anywhere: not a mode)
        ran = edit_on(tmp_path, replica_ssh.authorize_op(public_key=public_key(), tag=TAG, seconds=60,
                                                         worker_id="gpu-host-1", keep=[42]))
        assert ran.exit_code == 1 and "Is a directory" in json.loads(ran.stdout)["error"]


NODE_A = {"id": 3, "name": "node-a", "kind": "ssh", "host": "10.0.0.1", "port": 22, "ssh_user": "mmt"}
NODE_B = {"id": 4, "name": "node-b", "kind": "ssh", "host": "node-b.lab", "port": 2222, "ssh_user": "lab"}
REPLICAS = [
    {"index": 0, "name": "main1", "role": "main", "gpu_ids": ["0", "1"], "computer": NODE_A},
    {"index": 1, "name": "sub1", "role": "sub", "gpu_ids": ["2", "3"], "computer": NODE_A},
    {"index": 2, "name": "sub2", "role": "sub", "gpu_ids": ["0", "1"], "computer": NODE_B},
]


class TestClientFiles:
    def test_the_key_pair_is_an_openssh_ed25519_pair(self, tmp_path):
        pair = replica_ssh.new_key_pair(TAG)
        (tmp_path / "id").write_text(pair["private"])
        (tmp_path / "id").chmod(0o600)
        derived = subprocess.run(["ssh-keygen", "-y", "-f", str(tmp_path / "id")], capture_output=True, text=True,
                                 check=True).stdout.split()
        assert pair["public"].split() == [*derived[:2], TAG] and derived[0] == "ssh-ed25519"

    def test_known_hosts_come_from_the_workers_trusted_keys_under_the_replica_names(self, tmp_path):
        keys = {name: paramiko.Ed25519Key.from_private_key_file(str(self.keygen(tmp_path, name)))
                for name in ("a", "b")}
        known = tmp_path / "known_hosts"
        known.write_text(f"10.0.0.1 ssh-ed25519 {keys['a'].get_base64()}\n"
                         f"[node-b.lab]:2222 ssh-ed25519 {keys['b'].get_base64()}\n")
        subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True, capture_output=True)  # hashed names
        replicas = [dict(r, computer=dict(r["computer"], known_hosts_path=str(known))) for r in REPLICAS]
        assert replica_ssh.known_hosts_text(replicas).splitlines() == [
            f"main1 ssh-ed25519 {keys['a'].get_base64()}", f"sub1 ssh-ed25519 {keys['a'].get_base64()}",
            f"sub2 ssh-ed25519 {keys['b'].get_base64()}"]
        stranger = [dict(REPLICAS[0], computer=dict(NODE_A, host="10.0.0.9", known_hosts_path=str(known)))]
        with pytest.raises(replica_ssh.ReplicaSshError, match="no host key for node-a"):
            replica_ssh.known_hosts_text(stranger)

    @staticmethod
    def keygen(tmp_path, name):
        path = tmp_path / f"host_{name}"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
        return path

    def test_the_real_ssh_client_reads_the_config_as_meant(self, tmp_path):
        job_dir = str(tmp_path / "ws with space")
        config = tmp_path / "config"
        config.write_text(replica_ssh.config_text(replica_ssh.peers(REPLICAS), job_dir=job_dir))
        for name, host, port, user in (("main1", "10.0.0.1", "22", "mmt"), ("sub1", "10.0.0.1", "22", "mmt"),
                                       ("sub2", "node-b.lab", "2222", "lab")):
            effective = self.effective(config, name, tmp_path)
            assert (effective["hostname"], effective["port"], effective["user"]) == (host, port, user)
            assert effective["hostkeyalias"] == name and effective["stricthostkeychecking"] == "true"
            assert effective["identityfile"] == f"{job_dir}/ssh/id_ed25519"
            assert effective["userknownhostsfile"] == f"{job_dir}/ssh/known_hosts"
            assert (effective["identitiesonly"], effective["batchmode"]) == ("yes", "yes")
        other = self.effective(config, "example.org", tmp_path)  # any other host: the user's own settings
        assert other["hostname"] == "example.org" and other["stricthostkeychecking"] != "true"

    @staticmethod
    def effective(config, host, home) -> dict:
        ran = subprocess.run(["ssh", "-G", "-F", str(config), host], capture_output=True, text=True, check=True,
                             env={"HOME": str(home), "PATH": os.environ["PATH"]})
        return {k: v for k, _, v in (line.partition(" ") for line in ran.stdout.splitlines())}

    def test_the_wrapper_runs_the_next_ssh_on_path_with_the_jobs_config(self, tmp_path):
        job_dir = str(tmp_path / "ws")
        files = replica_ssh.replica_files(job_dir=job_dir, peers=replica_ssh.peers(REPLICAS), known_hosts="",
                                          private_key="KEY")
        assert [(f["path"], f["mode"]) for f in files] == [("ssh/id_ed25519", 0o600), ("ssh/known_hosts", 0o644),
                                                           ("ssh/config", 0o644), ("ssh/bin/ssh", 0o755)]
        wrapper = tmp_path / "ws" / "ssh" / "bin" / "ssh"
        wrapper.parent.mkdir(parents=True)
        wrapper.write_text(files[-1]["content"])
        wrapper.chmod(0o755)
        fake = tmp_path / "bin" / "ssh"  # stands for the OpenSSH client further down PATH
        fake.parent.mkdir()
        fake.write_text('#!/bin/sh\nprintf "%s|" "$@"\n')
        fake.chmod(0o755)
        ran = subprocess.run(["ssh", "sub1", "echo", "a b"], capture_output=True, text=True,
                             env={"PATH": f"{wrapper.parent}:{fake.parent}:/usr/bin:/bin"})
        assert ran.stdout == f"-F|{job_dir}/ssh/config|sub1|echo|a b|"
        lonely = subprocess.run([str(wrapper), "sub1"], capture_output=True, text=True,
                                env={"PATH": str(wrapper.parent)})
        assert lonely.returncode == 127 and "no OpenSSH client" in lonely.stderr

    def test_only_python_jobs_on_ssh_computers_get_ssh(self):
        job = {"runtime": "python", "replicas": REPLICAS}
        assert replica_ssh.unsupported(job) is None
        assert "docker" in replica_ssh.unsupported(dict(job, runtime="docker"))
        local = [dict(REPLICAS[0], computer={"id": 9, "kind": "local"}), REPLICAS[2]]
        assert "SSH computer" in replica_ssh.unsupported(dict(job, replicas=local))
        assert replica_ssh.key_lifetime(None) == 30 * 86400 and replica_ssh.key_lifetime(600) == 600 + 3600


def test_hostfiles_list_the_replicas_in_rank_order_with_their_gpus_as_slots():
    shuffled = list(reversed(REPLICAS))
    assert jobenv.hostfile_text(shuffled) == "main1 slots=2\nsub1 slots=2\nsub2 slots=2\n"
    assert jobenv.nodefile_text(shuffled) == "main1\nsub1\nsub2\n"
    no_gpus = [dict(r, gpu_ids=[]) for r in REPLICAS]
    assert jobenv.hostfile_text(no_gpus) == "main1 slots=1\nsub1 slots=1\nsub2 slots=1\n"
    assert jobenv.cluster_file_variables("/mmt/inputs/") == {"MMT_CLUSTER_HOSTFILE": "/mmt/inputs/cluster-hostfile",
                                                             "MMT_CLUSTER_NODEFILE": "/mmt/inputs/cluster-nodes"}
    # Line RANK+1 of the hostfile is the replica whose RANK and NODE_RANK that is; MMT_CLUSTER_IDX is its name's number.
    lines = jobenv.nodefile_text(REPLICAS).split()
    for replica in REPLICAS:
        env = jobenv.cluster_environment(replica=replica, replicas=shuffled, mode="multi-node", main_addr="10.0.0.1",
                                         master_port=29500)
        assert lines[int(env["RANK"])] == env["MMT_CLUSTER_HOST"]
        assert env["RANK"] == env["NODE_RANK"] and int(env["RANK"]) < int(env["WORLD_SIZE"]) == len(lines)
        assert env["MMT_CLUSTER_IDX"] == str(jobenv.replica_number(env["MMT_CLUSTER_HOST"]))
