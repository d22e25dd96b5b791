"""MMT_WORKER_GPU_WATCH_SECONDS (docs/gpus.md "The GPU watch"): seconds between two readings of each computer's
GPUs, 30 by default, 0 turns the watch off (the worker no longer says the capability `gpu_watch`, so the
server sends it no computers to watch); anything else is refused at start with the setting's name."""
from __future__ import annotations

import pytest

from worker_agent.config import ConfigError, WorkerConfig
from worker_agent.loop import Worker

BASE = {"MMT_API_URL": "http://127.0.0.1:9", "MMT_API_TOKEN": "mmt_" + "a" * 40, "MMT_WORKER_ID": "w1"}


def capabilities(state_dir, **env) -> list[str]:
    worker = Worker(WorkerConfig.from_env({**BASE, "MMT_WORKER_STATE_DIR": str(state_dir), **env}))
    try:
        return worker.hello_payload()["capabilities"]
    finally:
        worker.pool.close_all()


def test_the_watch_is_on_by_default_every_30_seconds_and_0_turns_it_off(tmp_path):
    assert WorkerConfig.from_env(BASE).gpu_watch_seconds == 30
    assert "gpu_watch" in capabilities(tmp_path)
    assert WorkerConfig.from_env({**BASE, "MMT_WORKER_GPU_WATCH_SECONDS": "0"}).gpu_watch_seconds == 0
    assert "gpu_watch" not in capabilities(tmp_path, MMT_WORKER_GPU_WATCH_SECONDS="0")


@pytest.mark.parametrize("value", ["-1", "3601", "half a minute", "1.5"])
def test_a_bad_value_is_refused_with_the_settings_name(value):
    with pytest.raises(ConfigError, match="MMT_WORKER_GPU_WATCH_SECONDS"):
        WorkerConfig.from_env({**BASE, "MMT_WORKER_GPU_WATCH_SECONDS": value})
