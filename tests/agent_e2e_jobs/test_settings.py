"""The worker settings these tests shorten keep the product's values by default."""
from __future__ import annotations

from worker_agent.config import WorkerConfig
from worker_agent.job_runner import Rechunker
from worker_agent.runtimes import TargetFacts, build_spec
from worker_agent.supervisor import LogChunk

ENV = {"MMT_API_URL": "http://127.0.0.1:8000", "MMT_API_TOKEN": "mmt_" + "a" * 40, "MMT_WORKER_ID": "w1",
       "MMT_WORKER_STATE_DIR": "/tmp/state"}


def test_a_stopped_job_gets_ten_seconds_between_sigterm_and_sigkill_by_default():
    config = WorkerConfig.from_env(ENV)
    assert config.cancel_grace == 10 and config.parallel_jobs == 2
    job = {"id": 5, "lease_id": "L", "job_token": "mado_mtj_" + "b" * 40, "runtime": "python", "command": ["python", "x"],
           "computer": {"working_dir": "/w", "python_path": "/usr/bin/python3"}}
    assert build_spec(job, TargetFacts(uid=1, gid=1), grace_seconds=config.cancel_grace)["grace_seconds"] == 10
    assert WorkerConfig.from_env({**ENV, "MMT_WORKER_CANCEL_GRACE": "3"}).cancel_grace == 3


def test_a_batch_in_flight_at_a_crash_is_cut_again_at_its_own_offsets():
    """After a restart the stream is followed from the last accepted offsets; the batch that was in flight
    is cut at the offsets and lengths journaled before it was sent, so the server recognises every chunk
    it already has, and what follows starts right after."""
    pending = [["stdout", 100, 50], ["stdout", 150, 30], ["stderr", 7, 5]]
    cut = Rechunker(pending)
    out = cut.feed(LogChunk("stdout", 100, b"a" * 40))
    assert out == []
    out = cut.feed(LogChunk("stdout", 140, b"b" * 100))
    assert [(c.stream, c.offset, len(c.data)) for c in out] == [("stdout", 100, 50), ("stdout", 150, 30),
                                                                 ("stdout", 180, 60)]
    out = cut.feed(LogChunk("stderr", 7, b"e" * 12)) + cut.feed(LogChunk("stdout", 240, b"c"))
    assert [(c.stream, c.offset, len(c.data)) for c in out] == [("stderr", 7, 5), ("stderr", 12, 7),
                                                                 ("stdout", 240, 1)]
    assert cut.drain() == []
