"""MMT_WORKER_TELEMETRY_SECONDS: seconds between two samples of a running job's GPUs, CPU and memory. The
product samples every 10 s; the setting lets a test that waits for a second sample wait seconds, not 20.
A value that is not a number from 0.5 to 3600 is refused when the worker starts, naming the setting."""
from __future__ import annotations

import pytest

from worker_agent import telemetry
from worker_agent.config import ConfigError, WorkerConfig

BASE = {"MMT_API_URL": "http://127.0.0.1:9", "MMT_API_TOKEN": "mmt_" + "a" * 40, "MMT_WORKER_ID": "w1"}


def test_without_the_setting_a_job_is_sampled_every_10_seconds():
    assert telemetry.interval_seconds({}) == 10.0
    assert telemetry.interval_seconds({"MMT_WORKER_TELEMETRY_SECONDS": " "}) == 10.0


def test_the_setting_gives_the_seconds_between_samples():
    assert telemetry.interval_seconds({"MMT_WORKER_TELEMETRY_SECONDS": "2"}) == 2.0
    assert telemetry.interval_seconds({"MMT_WORKER_TELEMETRY_SECONDS": "0.5"}) == 0.5


@pytest.mark.parametrize("raw", ["0", "-1", "soon", "3601"])
def test_a_value_out_of_range_is_refused_at_the_workers_start_with_the_settings_name(raw):
    with pytest.raises(ValueError, match=f"MMT_WORKER_TELEMETRY_SECONDS is the seconds .* from 0.5 to 3600 "
                                         f"\\(got '{raw}'\\)"):
        telemetry.interval_seconds({"MMT_WORKER_TELEMETRY_SECONDS": raw})
    with pytest.raises(ConfigError, match="MMT_WORKER_TELEMETRY_SECONDS"):
        WorkerConfig.from_env({**BASE, "MMT_WORKER_TELEMETRY_SECONDS": raw})
