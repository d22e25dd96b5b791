"""The SDK against this project's server: its MLflow-compatible API at `<server>/mlflow` (the `tracking`
app), run as a real process on the PostgreSQL test database with a personal token (read, runs:write).
Needs: PostgreSQL (as every server test) and the tracking app's `/mlflow/` routes."""
import pytest

from tests.sdk.cases import *  # noqa: F401,F403  (the SDK's tests, written once)


@pytest.fixture
def server(mado_server):
    return mado_server
