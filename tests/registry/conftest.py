"""The registry tests reuse the tracking tests' live-server MLflow client and running-job fixtures."""
from __future__ import annotations

import pytest

from tests.tracking.conftest import mlflow_env, running_job  # noqa: F401  (fixtures)


@pytest.fixture
def media(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT
