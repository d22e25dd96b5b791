"""Cluster jobs on the worker (docs/cluster-jobs.md, "What the agent does").

A cluster job runs as a `ClusterRunner`: one `JobTarget` per replica does the steps of
worker_agent.job_runner on its own computer and workspace `<jobId>-<replica>`; all are prepared before any
starts (the source and inputs by the worker; the venv or container by each supervisor, which then
holds until the job releases all replicas at once); each replica's logs are followed on its own
thread and posted with its name; the job ends with main1 (the subs are then stopped) or with the
first sub that fails (the others are stopped; the completion names it); a stop request stops them all.
Python replicas on SSH computers also get `ssh` between them (worker_agent/replica_ssh.py): the job's
key is authorized on every replica's computer before any is prepared and removed before the completion."""
from __future__ import annotations

import ipaddress
import json
import logging
import queue
import threading
from typing import TYPE_CHECKING

from worker_agent import authorized_keys, jobenv, replica_ssh
from worker_agent.core.lifecycle import signal_name
from worker_agent.job_runner import TRANSIENT, JobTarget, LeasedJob, LeaseRejected, StartFailed, Stopping
from worker_agent.remote_files import RemoteFileError, net_fact
from worker_agent.runtimes import CONTAINER_RUNTIMES
from worker_agent.ssh import ConnectError, ConnectionPool, Target
from worker_agent.supervisor import SupervisorError, spec_hash
from worker_agent.text import mask_tokens

if TYPE_CHECKING:
    from worker_agent.jobs import JobManager

log = logging.getLogger("mado.worker.jobs")

def is_cluster(job: dict) -> bool:
    """A job of more than one replica (a cluster job of size 1 is an ordinary job)."""
    return int(job.get("cluster_size") or 1) > 1 and bool(job.get("replicas"))


def is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def target_fact(connection, python: str, *args: str) -> str:
    """worker_agent/target/net.py on the target (`free-port`, `resolve NAME…`); StartFailed when it fails."""
    try:
        return net_fact(connection, python, *args)
    except RemoteFileError as exc:
        raise StartFailed(exc.message) from None


def computer_key(computer: dict) -> str:
    """One authorized_keys file: a computer's id, or its user, host and port."""
    if computer.get("id") is not None:
        return str(computer["id"])
    return f"{computer.get('ssh_user')}@{computer.get('host')}:{computer.get('port') or 22}"


def revoke_key(pool: ConnectionPool, computer: dict, tag: str, stop: threading.Event, *, job_id,
               attempts: int = 3) -> bool:
    """A job's authorized_keys line off one computer, a few tries; False when it could not be done."""
    error = ""
    for attempt in range(attempts):
        if stop.is_set():
            return False
        try:
            connection = pool.get(Target.from_api(computer))
            answer = replica_ssh.edit(connection, str(computer.get("python_path") or "python3"),
                                      replica_ssh.revoke_op([tag]))
            log.info("job %s: the job's SSH key is removed from %s (%d line%s)", job_id, computer.get("name"),
                     answer["removed"], "" if answer["removed"] == 1 else "s")
            return True
        except replica_ssh.ReplicaSshError as exc:
            error = exc.message
        except ConnectError as exc:
            error = exc.detail
        except TRANSIENT as exc:
            error = f"{type(exc).__name__}: {exc}"
        stop.wait(min(5.0, 0.5 * 2 ** attempt))
    log.warning("job %s: the job's SSH key could not be removed from %s (%s); it expires there on its own, or "
                "goes when this worker next runs a cluster job there", job_id, computer.get("name"), mask_tokens(error))
    return False


def revoke_forgotten(pool: ConnectionPool, record: dict, stop: threading.Event) -> None:
    """A cluster job that ended while this worker was gone: its SSH key off the computers that
    authorized it, on a thread of its own (a computer that is down must not hold up the others)."""
    ssh = (record.get("cluster") or {}).get("ssh") or {}
    left = set(ssh.get("authorized") or []) - set(ssh.get("revoked") or [])
    computers = {computer_key(c): c
                 for c in ((r.get("computer") or {}) for r in record["job"].get("replicas") or [])}
    targets = [computers[k] for k in sorted(left) if k in computers]
    if not targets or not ssh.get("tag"):
        return

    def revoke() -> None:
        for computer in targets:
            revoke_key(pool, computer, ssh["tag"], stop, job_id=record["job_id"])

    threading.Thread(target=revoke, name=f"job-{record['job_id']}-revoke", daemon=True).start()


class ClusterRunner(LeasedJob):
    """A cluster job: every replica prepared, then all started; followed together; the job ends with
    main1, or with the first sub that fails (the others are then stopped); a stop request stops them
    all. The decision is journaled (`record["cluster"]["decision"]`) with the master port and the
    hosts file, so a restarted worker re-attaches to every replica and decides the same way. Each
    replica is a JobTarget with its own log offsets in `record["replicas"][name]`; its supervisor
    prepares and then holds the process until the job releases every replica at once."""

    HOLD_START = True

    def __init__(self, manager: JobManager, record: dict):
        super().__init__(manager, record)
        replicas = sorted(self.job["replicas"], key=lambda r: int(r["index"]))
        states = record.setdefault("replicas", {})
        for replica in replicas:
            states.setdefault(str(replica["name"]), {"offsets": {"stdout": 0, "stderr": 0}, "pending": [],
                                                     "final": None, "started": False})
        record.setdefault("cluster", {})
        self.replicas = self.targets = [JobTarget(self, states[str(r["name"])], replica=r,
                                                  started=bool(states[str(r["name"])].get("started")))
                                        for r in replicas]
        self.main = self.replicas[0]

    def replica(self, name: str) -> JobTarget:
        return next(r for r in self.replicas if r.name == name)

    # -- start -----------------------------------------------------------------------------------

    def ensure_started(self) -> None:
        for replica in self.replicas:
            if not replica.job_dir:
                return self.start_failed(replica, f"The computer {replica.computer.get('name')} has no working "
                                                  "directory (an absolute path on the target): set one in its "
                                                  "settings.")
        states = {}
        for replica in self.replicas:
            try:
                states[replica.name] = replica.on_target(
                    lambda c, r=replica: r.remote(c).poll(facts=r.facts_binary),
                    f"asking the supervisor of {replica.name} for its state")
                replica.keep_facts(states[replica.name])
            except SupervisorError as exc:
                message = f"The replica's workspace cannot be used ({exc.code}): {exc.message}"
                if not self.started:
                    return self.start_failed(replica, message, present=states)
                replica.save(final={"status": "refused", "error": message})
                states[replica.name] = {"status": "refused"}
            except StartFailed as exc:
                return self.start_failed(replica, exc.message, reason=exc.reason, present=states)
        present = {name for name, state in states.items() if state.get("status") != "absent"}
        fresh = [r for r in self.replicas if r.name not in present]
        if fresh and self.started:
            for replica in fresh:  # it ran before, and its workspace is gone: it is never started twice
                if replica.record.get("final") is None:
                    replica.save(final={"status": "absent", "error": "The replica's workspace on its computer "
                                                                     "disappeared."})
            fresh = []
        if fresh and self.cancel_requested:
            log.info("job %s: stop requested before its replicas started; not starting them", self.id)
            self.stop_replicas([r for r in self.replicas if r.name in present])
            self.save(completion={"status": "canceled", "end_reason": "canceled"})
            return None
        if fresh and not self.start_replicas(fresh, present):
            return None
        for replica in self.replicas:
            state = states.get(replica.name) or {}
            if state.get("status") == "unknown" and state.get("recoverable"):
                log.info("job %s: the supervisor of %s is gone before it ran; a new one takes over", self.id,
                         replica.name)
                replica.start_supervisor(replica.spec())
            elif replica.name in present:
                log.info("job %s: %s re-attached (status %s)", self.id, replica.name, state.get("status"))
            if not replica.started:
                replica.started = True
                replica.save(started=True)
        if not self.record["cluster"].get("decision") and not self.release_replicas():
            return None
        self.mark_started()
        return None

    def start_replicas(self, fresh: list[JobTarget], present: set[str]) -> bool:
        """Prepare every replica first, then start them all; False when the job ended instead."""
        try:
            self.ensure_cluster_facts()
            self.ensure_replica_ssh()
        except StartFailed as exc:
            self.start_failed(self.main, exc.message, reason=exc.reason, present=present)
            return False
        specs = {}
        for replica in fresh:
            try:
                specs[replica.name] = replica.prepare()
            except StartFailed as exc:
                self.start_failed(replica, exc.message, reason=exc.reason, present=present)
                return False
        if not self.record.get("running_reported"):  # after the `running` heartbeat it can no longer go back
            try:
                self.wait_for_free_gpus()
            except StartFailed as exc:
                self.start_failed(getattr(exc, "unit", None) or self.main, exc.message, reason=exc.reason,
                                  present=present)
                return False
        with self._lock:
            if self.cancel_requested:
                self.stop_replicas([r for r in self.replicas if r.name in present])
                self.save(completion={"status": "canceled", "end_reason": "canceled"})
                return False
        self.confirm_start()  # the lease is still ours, and the job never returns to the queue now
        started = set(present)
        for replica in fresh:
            try:
                answer = replica.start_supervisor(specs[replica.name])
            except StartFailed as exc:
                self.start_failed(replica, exc.message, reason=exc.reason, present=started)
                return False
            started.add(replica.name)
            replica.started = True
            replica.save(started=True)
            log.info("job %s: %s started on %s (GPUs %s, supervisor pid %s)", self.id, replica.name,
                     replica.computer.get("name"), ",".join(replica.gpu_ids) or "none",
                     (answer.get("supervisor") or {}).get("pid"))
        return True

    def give_back(self, reason: str) -> None:
        """As LeasedJob.give_back (which releases the replicas' input pins), and first the job's SSH key
        off the replicas' computers (nothing of it may outlast the claim)."""
        self.revoke_replica_ssh()
        super().give_back(reason)

    def release_replicas(self) -> bool:
        """Start every replica's process together (docs/cluster-jobs.md, step 1): each supervisor prepares
        its replica (venv, container) and holds; once every replica holds (or is past that, after a
        restart), all are released at once. Without this the replica prepared first would run alone
        for as long as the others prepare: a sub that fails at once got the others stopped before
        their processes existed. False when the job ended instead (a replica could not be prepared, or
        a stop request came)."""
        rounds = 0
        said = None
        while True:
            self.check()
            with self._lock:
                canceled = self.cancel_requested
            if canceled:
                log.info("job %s: stop requested while its replicas were being prepared; stopping them", self.id)
                self.stop_replicas(self.replicas)
                self.save(completion={"status": "canceled", "end_reason": "canceled"})
                return False
            held, preparing = [], []
            for replica in self.replicas:
                try:
                    state = replica.on_target(lambda c, r=replica: r.remote(c).poll(),
                                              f"asking the supervisor of {replica.name} whether it is prepared")
                except SupervisorError as exc:
                    message = f"The replica's workspace cannot be used ({exc.code}): {exc.message}"
                    self.start_failed(replica, message, present=[r.name for r in self.replicas])
                    return False
                except StartFailed as exc:
                    self.start_failed(replica, exc.message, reason=exc.reason, present=[r.name for r in self.replicas])
                    return False
                status = state.get("status")
                if state.get("pid") or status == "running":
                    continue  # its process runs or ran: released before (a restarted worker)
                if status == "starting":
                    (held if state.get("held") else preparing).append(replica)
                elif status == "unknown" and state.get("recoverable"):
                    log.info("job %s: the supervisor of %s ended while preparing; a new one takes over", self.id,
                             replica.name)
                    try:
                        replica.start_supervisor(replica.spec())
                    except StartFailed as exc:
                        self.start_failed(replica, exc.message, reason=exc.reason,
                                          present=[r.name for r in self.replicas])
                        return False
                    preparing.append(replica)
                else:  # failed_to_start (venv, requirements, docker create), canceled there, or gone
                    error = state.get("error") or {
                        "absent": "Its workspace on its computer disappeared before it started.",
                        "canceled": "It was stopped on its computer before it started."}.get(
                        status, f"Its supervisor says {status} before it started.")
                    self.start_failed(replica, error, present=[r.name for r in self.replicas])
                    return False
            if not preparing:
                break
            names = ", ".join(r.name for r in preparing)
            if names != said:
                log.info("job %s: waiting for %s to be prepared (%d of %d replicas are)", self.id, names,
                         len(self.replicas) - len(preparing), len(self.replicas))
                said = names
            rounds += 1
            self.pause(min(5.0, 0.5 + 0.25 * rounds))
        failed = self.release_all(held) if held else None
        if failed is not None:
            replica, exc = failed
            self.start_failed(replica, f"Its supervisor refused to start it ({exc.code}): {exc.message}",
                              present=[r.name for r in self.replicas])
            return False
        return True

    def release_all(self, replicas: list[JobTarget]) -> tuple[JobTarget, SupervisorError] | None:
        """`release` to every held replica at the same moment (each on its own computer); the first
        replica whose supervisor refused, with its error, or None."""
        errors: dict[str, BaseException] = {}

        def release(replica: JobTarget) -> None:
            try:
                replica.on_target(lambda c: replica.remote(c).release(), f"starting {replica.name}")
            except BaseException as exc:  # noqa: BLE001  (raised on the job's thread below)
                errors[replica.name] = exc
            finally:
                replica.api.close()

        threads = [threading.Thread(target=release, args=(r,), name=f"job-{self.id}-release-{r.name}", daemon=True)
                   for r in replicas]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for replica in replicas:  # a worker stop or a lost lease first: they leave the job as it is
            exc = errors.get(replica.name)
            if exc is not None and not isinstance(exc, SupervisorError):
                raise exc
        for replica in replicas:
            exc = errors.get(replica.name)
            if exc is not None:
                return replica, exc
        log.info("job %s: every replica is prepared; started %s", self.id, ", ".join(r.name for r in replicas))
        return None

    def start_failed(self, replica: JobTarget, message: str, *, reason: str = "start_failed", present=()) -> None:
        """One replica cannot start: those started are stopped, and the job fails naming the replica."""
        log.warning("job %s: %s could not start: %s", self.id, replica.name, message)
        if isinstance(present, dict):  # poll answers so far: those with a workspace may run
            present = {name for name, state in present.items() if state.get("status") != "absent"}
        self.stop_replicas([r for r in self.replicas if r.name in set(present) and r is not replica])
        self.release_target_inputs()
        error = mask_tokens(f"{replica.name}: {message}", self.job.get("job_token") or "")
        self.save(completion={"status": "failed", "end_reason": reason, "replica": replica.name,
                              "error": error})

    def ensure_cluster_facts(self) -> dict:
        """MASTER_PORT (a free port on main1's computer) and every replica's hosts file, chosen once and
        journaled: a restarted worker must hand the supervisors the very same spec."""
        facts = self.record.get("cluster") or {}
        if facts.get("master_port") and facts.get("hosts"):
            return facts
        main = self.main
        port = main.on_target(lambda c: target_fact(c, main.python, "free-port"),
                              "choosing MASTER_PORT on main1's computer")
        hosts = {replica.name: self.hosts_of(replica) for replica in self.replicas}
        self.save(cluster=dict(facts, master_port=int(port), hosts=hosts))
        log.info("job %s: %d replicas, MASTER_PORT %s on %s", self.id, len(self.replicas), port,
                 main.computer.get("name"))
        return self.record["cluster"]

    def hosts_of(self, replica: JobTarget) -> dict[str, str]:
        """Replica name → address as `replica` reaches it: loopback on its own computer, else the
        computer's host, resolved on the replica's computer where it is a name."""
        wanted = {other.name: jobenv.LOOPBACK if jobenv.same_computer(replica.computer, other.computer)
                  else jobenv.computer_address(other.computer) for other in self.replicas}
        names = sorted({address for address in wanted.values() if not is_ip(address)})
        if names:
            text = replica.on_target(lambda c: target_fact(c, replica.python, "resolve", *names),
                                     f"resolving the other computers' names on {replica.name}'s computer")
            resolved = json.loads(text.splitlines()[-1])
            wanted = {name: str(resolved.get(address, address)) for name, address in wanted.items()}
        return wanted

    def cluster_spec_of(self, replica: JobTarget) -> dict:
        facts = self.record["cluster"]
        replicas = [r.replica for r in self.replicas]
        env = jobenv.cluster_environment(replica=replica.replica, replicas=replicas,
                                         mode=str(self.job.get("cluster_mode") or "single-node"),
                                         main_addr=jobenv.main_address(replica.replica, replicas),
                                         master_port=int(facts["master_port"]))
        runtime = str(self.job.get("runtime") or "python")
        inputs = jobenv.container_locations().inputs_dir if runtime in ("docker", *CONTAINER_RUNTIMES) else \
            jobenv.host_locations(replica.job_dir).inputs_dir
        env.update(jobenv.cluster_file_variables(inputs))
        if (facts.get("ssh") or {}).get("enabled"):
            env["MMT_CLUSTER_SSH_CONFIG"] = f"{replica.job_dir}/{replica_ssh.CONFIG_PATH}"
        return {"name": replica.name, "env": env, "hosts": facts["hosts"][replica.name]}

    def replica_spec(self, replica: JobTarget, spec: dict) -> dict:
        """build_spec's spec plus the launchers' files: the hostfiles (every runtime) and, where the job
        has SSH between its replicas, the replica's `ssh/` with `ssh/bin` first on PATH."""
        replicas = [r.replica for r in self.replicas]
        files = [{"path": f"inputs/{jobenv.CLUSTER_HOSTFILE}", "content": jobenv.hostfile_text(replicas),
                  "mode": 0o644},
                 {"path": f"inputs/{jobenv.CLUSTER_NODEFILE}", "content": jobenv.nodefile_text(replicas),
                  "mode": 0o644}]
        ssh = self.record["cluster"].get("ssh") or {}
        if ssh.get("enabled"):
            files += replica_ssh.replica_files(job_dir=replica.job_dir, peers=ssh["peers"],
                                               known_hosts=ssh["known_hosts"], private_key=ssh["private"])
            spec["path_prepend"] = [f"{replica.job_dir}/{replica_ssh.BIN_DIR}", *(spec.get("path_prepend") or [])]
        spec["files"] = [*spec["files"], *files]
        spec["spec_hash"] = spec_hash(spec)
        return spec

    # -- ssh between the replicas (worker_agent/replica_ssh.py) ------------------------------------

    def ensure_replica_ssh(self) -> None:
        """The job's key pair (journaled before any computer is touched, so its lines are always found
        again), then its public key authorized on every replica's computer. Where that cannot be done
        (another runtime, a Local computer, no trusted host key, an authorized_keys the SSH user cannot
        write) the job runs without SSH between its replicas, as cluster jobs did before: the
        torch.distributed rendezvous does not need it."""
        cluster = self.record["cluster"]
        ssh = dict(cluster.get("ssh") or {})
        if "enabled" not in ssh:
            ssh = self.new_replica_ssh()
            self.save(cluster=dict(cluster, ssh=ssh))
        if not ssh.get("enabled"):
            return
        op = replica_ssh.authorize_op(public_key=ssh["public"], tag=ssh["tag"],
                                      seconds=replica_ssh.key_lifetime(self.job.get("walltime_seconds")),
                                      worker_id=self.config.worker_id, keep=self.manager.active_ids())
        for replica in self.ssh_computers():
            key = computer_key(replica.computer)
            if key not in ssh["authorized"]:
                ssh = dict(ssh, authorized=[*ssh["authorized"], key])
                self.save(cluster=dict(self.record["cluster"], ssh=ssh))
            try:
                answer = replica.on_target(lambda c, r=replica: replica_ssh.edit(c, r.python, op),
                                           f"authorizing the job's SSH key on {replica.computer.get('name')}")
            except replica_ssh.ReplicaSshError as exc:
                reason = (f"the SSH user's ~/.ssh/authorized_keys on {replica.computer.get('name')} cannot be "
                          f"changed: {exc.message}")
                log.warning("job %s: no ssh between its replicas: %s", self.id, reason)
                self.revoke_replica_ssh()
                self.save(cluster=dict(self.record["cluster"], ssh=dict(self.record["cluster"]["ssh"], enabled=False,
                                                                        reason=reason)))
                return
            log.info("job %s: the job's SSH key is authorized on %s (%s)%s", self.id, replica.computer.get("name"),
                     answer.get("path"), f", expiring {answer['expiry']}" if answer.get("expiry") else
                     " without expiry-time (OpenSSH older than 8.2 there)")

    def new_replica_ssh(self) -> dict:
        replicas = [r.replica for r in self.replicas]
        reason = replica_ssh.unsupported(self.job)
        if reason is None:
            tag = authorized_keys.job_tag(self.id, self.config.worker_id)
            try:
                peers = replica_ssh.peers(replicas)
                known_hosts = replica_ssh.known_hosts_text(replicas)
                for replica in self.replicas:  # every workspace path fits into an ssh_config
                    replica_ssh.replica_files(job_dir=replica.job_dir, peers=peers, known_hosts=known_hosts,
                                              private_key="")
            except replica_ssh.ReplicaSshError as exc:
                reason = exc.message
            else:
                pair = replica_ssh.new_key_pair(tag)
                return {"enabled": True, "tag": tag, "private": pair["private"], "public": pair["public"],
                        "peers": peers, "known_hosts": known_hosts, "authorized": [], "revoked": []}
        log.info("job %s: no ssh between its replicas: %s", self.id, reason)
        return {"enabled": False, "reason": reason}

    def ssh_computers(self) -> list[JobTarget]:
        """The first replica on each computer: one authorized_keys edit per computer."""
        seen, firsts = set(), []
        for replica in self.replicas:
            key = computer_key(replica.computer)
            if key not in seen:
                seen.add(key)
                firsts.append(replica)
        return firsts

    def revoke_replica_ssh(self) -> None:
        """The job's key off every computer that authorized it (once; journaled per computer). A computer
        that cannot be reached now keeps the line until its expiry time or this worker's next sweep there."""
        ssh = self.record["cluster"].get("ssh") or {}
        wanted = [r for r in self.ssh_computers()
                  if computer_key(r.computer) in set(ssh.get("authorized") or [])
                  and computer_key(r.computer) not in set(ssh.get("revoked") or [])]
        for replica in wanted:
            if revoke_key(self.manager.pool, replica.computer, ssh["tag"], self.stop, job_id=self.id):
                ssh = self.record["cluster"]["ssh"]
                self.save(cluster=dict(self.record["cluster"], ssh=dict(
                    ssh, revoked=[*(ssh.get("revoked") or []), computer_key(replica.computer)])))

    def deliver(self) -> bool:
        # Every replica has ended (or never started) once there is a completion: the key goes first.
        self.revoke_replica_ssh()
        return super().deliver()

    def drop(self, why: str) -> None:
        try:
            self.revoke_replica_ssh()
        except Exception:  # the job is no longer ours either way; its lines expire on their own
            log.exception("job %s: removing the job's SSH key failed", self.id)
        super().drop(why)

    # -- follow and decide -------------------------------------------------------------------------

    def follow(self) -> dict:
        """Follow every replica until all have ended; the decision: main1 ended first, a sub failed,
        or the walltime."""
        running = [r for r in self.replicas if r.record.get("final") is None]
        events: queue.Queue = queue.Queue()
        threads = []
        for replica in running:
            replica.abort.clear()
            thread = threading.Thread(target=self._follow_replica, args=(replica, events),
                                      name=f"job-{self.id}-{replica.name}", daemon=True)
            thread.start()
            threads.append(thread)
        try:
            for replica in self.replicas:  # ended before a restart: decided in the same order again
                if replica.record.get("final") is not None:
                    self.decide(replica)
            if self.record["cluster"].get("decision") and running:
                self.stop_replicas(running, wait=False)
            left = len(running)
            while left:
                try:
                    replica, outcome = events.get(timeout=0.5)
                except queue.Empty:
                    self.check()
                    continue
                if isinstance(outcome, BaseException):
                    raise outcome
                left -= 1
                replica.save(final=outcome)
                self.decide(replica)
        finally:
            for replica in self.replicas:
                replica.abort.set()
            for thread in threads:
                thread.join(timeout=10)
                if thread.is_alive():
                    log.warning("job %s: %s still follows a replica after the job's follow ended", self.id, thread.name)
            for replica in self.replicas:  # the job goes on with main1 (outputs) and the stops
                replica.abort.clear()
        return dict(self.record["cluster"]["decision"])

    @staticmethod
    def _follow_replica(replica: JobTarget, events: queue.Queue) -> None:
        try:
            events.put((replica, replica.follow()))
        except BaseException as exc:  # noqa: BLE001  (handed to the job's thread, which decides)
            events.put((replica, exc))
        finally:
            replica.api.close()

    def decide(self, replica: JobTarget) -> None:
        cluster = self.record["cluster"]
        if cluster.get("decision"):
            return
        final = replica.record["final"] or {}
        status = final.get("status")
        if replica is self.main:
            decision = {"kind": "main"}
        elif self.cancel_requested:
            return  # every replica is being stopped; main1's end is the job's
        elif status == "exited" and final.get("exit_code") == 0:
            log.info("job %s: %s is done (exit code 0); waiting for main1", self.id, replica.name)
            return
        elif status == "timed_out":
            decision = {"kind": "timed_out"}
        else:
            decision = {"kind": "replica_failed", "replica": replica.name}
        self.save(cluster=dict(cluster, decision=decision))
        others = [r for r in self.replicas if r.record.get("final") is None]
        log.info("job %s: %s ended (%s); stopping %s", self.id, replica.name, status,
                 ", ".join(r.name for r in others) or "nothing: all have ended")
        self.stop_replicas(others, wait=False)

    def conclude(self, final: dict) -> dict:
        kind = final.get("kind")
        if kind == "main":
            completion = self.main.conclude(self.main.record.get("final") or {})
            if completion["status"] != "canceled" and completion.get("end_reason") != "timed_out":
                completion["replica"] = self.main.name
            return completion
        if kind == "timed_out":
            return {"status": "failed", "end_reason": "timed_out",
                    "error": f"The walltime of {self.job.get('walltime_seconds')} s was reached; every replica "
                             "was stopped."}
        return self.replica_failure(self.replica(str(final.get("replica"))))

    def replica_failure(self, replica: JobTarget) -> dict:
        final = replica.record.get("final") or {}
        name, code, sig = replica.name, final.get("exit_code"), final.get("signal")
        completion = {"status": "failed", "end_reason": "replica_failed", "replica": name}
        if final.get("status") == "exited" and code is not None:
            return dict(completion, exit_code=int(code), error=f"{name} exited with code {code}")
        if final.get("status") == "exited" and sig:
            return dict(completion, error=f"{name} was killed by {signal_name(sig)}.")
        if final.get("status") == "canceled":
            return dict(completion, error=f"{name} was stopped on its computer.")
        return dict(completion, error=f"{name}: {replica.conclude(final).get('error')}")

    # -- stop ----------------------------------------------------------------------------------------

    def stop_replicas(self, replicas: list[JobTarget], *, wait: bool = True) -> None:
        """SIGTERM to each, SIGKILL after the grace, all at once (each on its own computer)."""
        threads = [threading.Thread(target=self._stop_replica, args=(r,), name=f"job-{self.id}-stop-{r.name}",
                                    daemon=True) for r in replicas]
        for thread in threads:
            thread.start()
        if wait:
            for thread in threads:
                thread.join()

    def _stop_replica(self, replica: JobTarget) -> None:
        try:
            state = replica.stop_now()
            log.info("job %s: %s stopped (%s)", self.id, replica.name, state.get("status"))
        except (Stopping, LeaseRejected):
            pass
        except (SupervisorError, StartFailed) as exc:
            log.warning("job %s: %s could not be stopped: %s", self.id, replica.name, getattr(exc, "message", exc))
        except Exception:
            log.exception("job %s: stopping %s failed", self.id, replica.name)
        finally:
            replica.api.close()

    def _cancel(self) -> None:
        try:
            self.stop_replicas(self.replicas)
        finally:
            self.api.close()
