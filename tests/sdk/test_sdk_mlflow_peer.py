"""The SDK against the real MLflow tracking server from PyPI (`mlflow server`), a peer of the same protocol
as this project's `<server>/mlflow` API. Needs: the MLflow server installed outside this repository
(tests/sdk/conftest.py installs it once into a cached venv)."""
import pytest

from tests.sdk.cases import *  # noqa: F401,F403  (the SDK's tests, written once)


@pytest.fixture
def server(mlflow_server):
    yield mlflow_server
    mlflow_server.up() if mlflow_server.process.poll() is not None else None  # a test that stopped it
