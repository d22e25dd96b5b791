"""Issue 13 end to end, with real `mado-tracking-worker run` processes and a real sshd as the computer:
a worker set up as seed 001 says (a Project admin's service account) runs jobs on a global
administrator's Public computer; a worker that goes away — SIGTERM or SIGKILL while its claim
long-poll is open — never keeps a job from running on another worker, and a job that had started is
never started again; a job created right after another ends is claimed at once."""
from __future__ import annotations

import time
import uuid
from datetime import timedelta

from django.test import Client

from computers.models import ComputeTarget
from jobs import services as job_services
from jobs.models import JobEvent
from mado import longpoll, services
from mado.choices import Role, TokenKind
from tests.agent_e2e_jobs.conftest import WorkerProcess, wait_until
from tests.conftest import WORKER_SCOPES


def start(e2e, worker_id: str, token: str | None = None, **env) -> WorkerProcess:
    """A worker of its own (state directory, worker id), so that two can run side by side."""
    extra = {"MMT_WORKER_CANCEL_GRACE": "3", **{k: str(v) for k, v in env.items()}}
    state = e2e.tmp / f"state-{worker_id}"
    worker = WorkerProcess(e2e.url, token or e2e.world.worker_token, state, e2e.home, e2e.sshd.client_dir, e2e.tmp,
                           worker_id=worker_id, extra_env=extra)
    e2e.workers.append(worker)
    return worker


def claimed_by(job) -> list[str]:
    return [m.removeprefix("Claimed by worker ") for m in
            JobEvent.objects.filter(job_id=job.pk, kind="claimed").order_by("pk").values_list("message", flat=True)]


def job_long_polls_opened() -> int:
    """Job-claim long-polls the live server (in this process, mado.longpoll) has opened so far."""
    return longpoll.hub().parked("mado_jobs")[1]


def fresh_long_poll(worker: WorkerProcess) -> None:
    """Wait until the worker has just opened a new job-claim long-poll (so it has seconds left)."""
    before = job_long_polls_opened()
    wait_until(lambda: job_long_polls_opened() > before, timeout=30, interval=0.02,
               what=f"a new claim long-poll ({worker.output()[-2000:]})")


def another_computer(e2e, name: str, *, visibility: str, owner=None) -> ComputeTarget:
    fields = {f: getattr(e2e.computer, f) for f in ("kind", "host", "port", "ssh_user", "ssh_key_path",
                                                     "known_hosts_path", "working_dir", "python_path", "runtimes")}
    return ComputeTarget.objects.create(owner=owner or e2e.world.global_admin, name=f"{name}-{uuid.uuid4().hex[:4]}",
                                        visibility=visibility, enabled=True, gpu_ids=[], concurrency=2, **fields)


def page_of(e2e, job) -> str:
    client = Client()
    client.force_login(e2e.world.member)
    return client.get(f"/projects/lab/jobs/{job.pk}/").content.decode()


def test_a_project_admins_worker_runs_jobs_on_a_global_admins_public_computer_as_seed_001_says(e2e):
    world = e2e.world
    account = services.create_service_account(services.Actor(world.project_admin), world.project,
                                              name="gpu-host-2-worker", role=Role.ADMIN)
    token = world.token(account.user, WORKER_SCOPES, kind=TokenKind.SERVICE)
    bobs_private = another_computer(e2e, "bobs-private", visibility="private", owner=world.member)
    not_listed = another_computer(e2e, "not-listed", visibility="public")
    start(e2e, "gpu-host-2", token, MMT_WORKER_TARGET_IDS=f"{e2e.computer.pk},{bobs_private.pk}")

    job = e2e.create_job(command=["python", "-c", "print('ran on the public computer')"])
    e2e.wait_ended(job, timeout=90)
    assert e2e.job(job).status == "finished", e2e.worker_output()[-3000:]
    assert claimed_by(job) == ["gpu-host-2"]
    e2e.wait_log(job, "ran on the public computer")

    # bob's Private computer runs bob's jobs and those of service accounts bob created: not this worker's.
    private_job = e2e.create_job(computer=bobs_private.pk, command=["true"])
    unlisted_job = e2e.create_job(computer=not_listed.pk, command=["true"])
    follow_up = e2e.create_job(command=["python", "-c", "print('still served')"])
    e2e.wait_ended(follow_up, timeout=90)  # the worker went past both of them
    assert e2e.job(private_job).status == "queued" and e2e.job(unlisted_job).status == "queued"
    private_page = page_of(e2e, private_job)
    assert "No online worker of this Project runs Jobs on " + bobs_private.name in private_page
    assert "that the computer&#x27;s owner created" in private_page, "the page says what to do"
    assert "its target IDs leave out " + not_listed.name in page_of(e2e, unlisted_job), \
        "--target-ids narrows what the worker serves, and the page says so"


def test_a_worker_sigkilled_with_its_long_poll_open_loses_no_job_and_never_starts_one_twice(e2e, monkeypatch):
    # The product waits 60 s for a heartbeat of a claimed job (jobs.services.REQUEUE_AFTER); the mechanism is
    # the same with 20 s, and the suite spends 40 s less here.
    monkeypatch.setattr(job_services, "REQUEUE_AFTER", timedelta(seconds=20))
    first = start(e2e, "worker-a", MMT_WORKER_CLAIM_WAIT=10)
    started = e2e.counter_job("long", lines=4000, pause=0.05)
    e2e.wait_log(started, "line 000005", timeout=60)
    fresh_long_poll(first)
    first.kill()
    created = time.monotonic()
    waiting = e2e.create_job(command=["python", "-c", "print('second worker ran it')"])
    # The dead worker's long-poll is still open on the server and takes the job: nobody will run it.
    wait_until(lambda: claimed_by(waiting) == ["worker-a"], timeout=10, what="the dead worker's claim")

    start(e2e, "worker-b", MMT_WORKER_CLAIM_WAIT=5)  # its claims, which run the requeue sweep, every 5 s
    e2e.wait_status(waiting, "running", "finished", timeout=80)
    took = time.monotonic() - created
    print(f"\njob claimed by a SIGKILLed worker ran on a second worker {took:.1f} s after creation")
    assert took >= 20, "not before the claim had gone without a heartbeat for REQUEUE_AFTER"
    assert claimed_by(waiting) == ["worker-a", "worker-b"]
    assert JobEvent.objects.filter(job_id=waiting.pk, kind="requeued").count() == 1
    e2e.wait_ended(waiting, timeout=60)
    assert e2e.job(waiting).status == "finished"

    assert e2e.job(started).status == "running", "a job that started is never requeued"
    assert claimed_by(started) == ["worker-a"]
    assert len(e2e.starts("long")) == 1, "and never started a second time"


def test_a_worker_stopped_with_sigterm_drains_and_another_runs_the_next_job_at_once(e2e):
    first = start(e2e, "worker-a", MMT_WORKER_CLAIM_WAIT=10)
    started = e2e.counter_job("long", lines=4000, pause=0.05)
    e2e.wait_log(started, "line 000005", timeout=60)
    fresh_long_poll(first)
    assert first.stop() == 0
    assert "go back to the queue" not in first.output()  # nothing claimed and unstarted to release
    created = time.monotonic()
    waiting = e2e.create_job(command=["python", "-c", "print('second worker ran it')"])
    start(e2e, "worker-b")
    e2e.wait_status(waiting, "running", "finished", timeout=70)
    took = time.monotonic() - created
    print(f"\nafter a SIGTERM'd worker, the next job ran on a second worker {took:.1f} s after creation")
    assert took < 70
    assert claimed_by(waiting) == ["worker-b"], "the stopping worker took nothing more"
    assert e2e.job(started).status == "running" and len(e2e.starts("long")) == 1


def test_a_job_created_right_after_another_ends_is_claimed_by_a_wake_up_not_the_next_poll(e2e, caplog):
    # A long claim wait, so that a claim that waited for the next long-poll instead of being woken by
    # the job's creation shows as tens of seconds; the figures themselves are printed.
    start(e2e, "worker-a", MMT_WORKER_CLAIM_WAIT=30)
    first = e2e.create_job(command=["python", "-c", "print('first')"])
    e2e.wait_ended(first, timeout=90)
    figures = []
    for round_ in range(3):
        before = e2e.create_job(command=["python", "-c", "print('one')"])
        e2e.wait_ended(before, timeout=60)
        ended = e2e.job(before).finished_at
        job = e2e.create_job(command=["python", "-c", "print('next')"])
        claimed = wait_until(lambda: e2e.job(job).claimed_at, timeout=10, interval=0.01, what="the claim")
        created = e2e.job(job).created_at
        assert (created - ended).total_seconds() < 10, "created right after the other ended"
        figures.append((claimed - created).total_seconds())
        e2e.wait_ended(job, timeout=60)
    print(f"\nclaimed after creation (job created right after another ended): "
          f"{', '.join(f'{f * 1000:.0f} ms' for f in figures)}")
    assert max(figures) < 10, figures
    assert "unknown_active_jobs" not in e2e.worker_output()
    conflicts = [r.getMessage() for r in caplog.records if r.name == "django.request" and "Conflict" in r.getMessage()]
    assert conflicts == [], "a job's end is a wake-up for the waiting claim, not a conflict in the server log"
