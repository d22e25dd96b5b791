"""worker/jobs/{id}/log-frames (docs/logs.md): a job's stdout/stderr as frames of bytes. A frame resent
at the same offset is stored once, chunks keep their order, bytes PostgreSQL text cannot hold become
U+FFFD, malformed or oversized bodies are refused with what to fix, and the readers (the follow API,
the job page, log.txt) show what was stored."""
from __future__ import annotations

import re

import pytest
from django.urls import resolve
from rest_framework.test import APIClient

from jobs import services as job_services
from jobs import views as job_views
from jobs.models import LogChunk
from tests.conftest import assert_error
from tests.job_fixtures import job_request
from worker_api.logs import JobLogFramesView


@pytest.fixture
def log_frames_routed():
    """The server routes log-frames to its view (older servers answer 404, test_log_frames_delivery.py)."""
    assert resolve("/api/worker/jobs/1/log-frames").func.view_class is JobLogFramesView


def session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def frames(*items: tuple[str, int, bytes]) -> bytes:
    return b"".join(b"%s %d %d\n%s" % (stream.encode(), offset, len(data), data) for stream, offset, data in items)


@pytest.fixture
def claimed(world, gpu_box, job_worker, log_frames_routed):
    session(world.member).post("/api/projects/lab/jobs", job_request(gpu_box), format="json")
    item = job_worker.claim()
    job_worker.heartbeat(item, "running")
    return item


def send(worker, item, body: bytes, lease=None, **query):
    params = "&".join(f"{k}={v}" for k, v in query.items())
    return worker.client.post(f"/api/worker/jobs/{item['id']}/log-frames?worker_id={worker.worker_id}"
                              f"&lease_id={lease or item['lease_id']}&{params}", data=body,
                              content_type="application/octet-stream")


def stored(item) -> list[tuple[str, int, str]]:
    return list(LogChunk.objects.filter(job_id=item["id"]).order_by("id").values_list("stream", "offset", "data"))


def test_frames_are_stored_in_order_once_and_the_readers_show_them(world, claimed, job_worker):
    big = b"".join(b"%010d %s\n" % (i, b"x" * 88) for i in range(30_000))  # 3 MB: one row, not twelve
    body = frames(("stdout", 0, big), ("stderr", 0, b"a warning\n"), ("stdout", len(big), b"last line\n"))
    answer = send(job_worker, claimed, body)
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"stored": 3, "frames": 3}
    again = send(job_worker, claimed, body)  # resent after a lost answer: nothing twice
    assert again.json() == {"stored": 0, "frames": 3}
    assert stored(claimed) == [("stdout", 0, big.decode()), ("stderr", 0, "a warning\n"),
                               ("stdout", len(big), "last line\n")]

    follow = session(world.member).get(f"/api/jobs/{claimed['id']}/logs?after=0")  # `jobs logs --follow`
    assert [(c["stream"], c["data"]) for c in follow.json()["items"]] == [(s, d) for s, _, d in stored(claimed)]
    text = session(world.member).get(f"/projects/lab/jobs/{claimed['id']}/log.txt")
    assert b"".join(text.streaming_content) == big + b"a warning\nlast line\n"
    page = session(world.member).get(f"/projects/lab/jobs/{claimed['id']}/")
    assert page.status_code == 200 and b"0000029999 " in page.content and b"last line" in page.content


def test_the_job_page_shows_the_end_of_chunks_of_megabytes_and_says_the_rest_is_in_the_log(
        world, claimed, job_worker, monkeypatch):
    monkeypatch.setattr(job_views, "LOG_TAIL_CHARS", 200_000)
    lines = [b"%010d %s\n" % (i, b"x" * 88) for i in range(40_000)]  # 4 MB in two chunks of 2 MB
    first, second = b"".join(lines[:20_000]), b"".join(lines[20_000:])
    assert send(job_worker, claimed, frames(("stdout", 0, first), ("stdout", len(first), second))).status_code == 200
    page = session(world.member).get(f"/projects/lab/jobs/{claimed['id']}/").content.decode()
    shown = re.search(r'<pre id="log-output"[^>]*>(.*?)</pre>', page, re.S).group(1)
    assert "0000039999 " in shown and "0000038000 " in shown, "the newest 200,000 characters"
    assert "0000037999 " not in shown and "0000019999 " not in shown and len(page) < 600_000
    assert "open the whole log as text for the rest" in page

    monkeypatch.setattr(job_views, "LOG_TAIL_CHARS", 10_000_000)
    page = session(world.member).get(f"/projects/lab/jobs/{claimed['id']}/").content.decode()
    assert "0000000000 " in page and "open the whole log as text for the rest" not in page, "all of it fits"


def test_bytes_text_cannot_hold_become_replacement_characters(claimed, job_worker):
    body = frames(("stdout", 0, b"ok \xff\xfe and a NUL \x00 here\n"), ("stderr", 0, b"half \xe3\x81"))
    assert send(job_worker, claimed, body).json()["stored"] == 2
    assert [d for _, _, d in stored(claimed)] == ["ok \ufffd\ufffd and a NUL \ufffd here\n", "half \ufffd"]


def test_a_cluster_replica_names_its_frames(world, claimed, job_worker):
    body = frames(("stdout", 0, b"x\n"))
    assert_error(send(job_worker, claimed, body, replica="sub7"), 422, "invalid")
    assert send(job_worker, claimed, body, replica="main1").json()["stored"] == 1
    assert list(LogChunk.objects.filter(job_id=claimed["id"]).values_list("replica", flat=True)) == ["main1"]


@pytest.mark.parametrize("body", [
    b"stdout 0 5\nabc",                    # cut short
    b"app 0 3\nabc",                       # the job's own stream is written with its job token, not here
    b"stdout -1 3\nabc",
    b"stdout 0 3 extra\nabc",
    b"stdout 0 3abc",
    b"stdout 9223372036854775807 3\nabc",  # past the largest offset
])
def test_malformed_frames_store_nothing(claimed, job_worker, body):
    assert_error(send(job_worker, claimed, frames(("stdout", 0, b"kept?\n")) + body), 422, "invalid")
    assert stored(claimed) == []


def test_a_body_over_the_limit_is_refused_before_it_is_read(claimed, job_worker):
    body = frames(("stdout", 0, b"x" * (job_services.MAX_LOG_FRAMES_BODY + 1)))
    assert_error(send(job_worker, claimed, body), 413, "too_large")
    assert stored(claimed) == []


def test_only_the_current_lease_writes_frames(claimed, job_worker):
    body = frames(("stdout", 0, b"x\n"))
    assert_error(send(job_worker, claimed, body, lease="00000000-0000-0000-0000-000000000000"), 409, "invalid_lease")
    assert stored(claimed) == []


def test_json_chunks_from_older_workers_are_still_stored_once(claimed, job_worker):
    chunks = [{"stream": "stdout", "offset": 0, "data": "one\n"}, {"stream": "stdout", "offset": 4, "data": "two\n"}]
    assert job_worker.leased(claimed, "logs", chunks=chunks).json() == {"stored": 2}
    assert job_worker.leased(claimed, "logs", chunks=chunks).json() == {"stored": 0}
    assert send(job_worker, claimed, frames(("stdout", 4, b"two\n"), ("stdout", 8, b"six\n"))).json()["stored"] == 1
    assert [d for _, _, d in stored(claimed)] == ["one\n", "two\n", "six\n"]
