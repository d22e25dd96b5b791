"""The SDK against the real MLflow tracking server from PyPI (`mlflow server`), a peer of the same protocol
as this project's `<server>/mlflow` API. Needs: the MLflow server installed outside this repository
(tests/sdk/conftest.py installs it once into a cached venv)."""
import pytest

from tests.agent_e2e_jobs.conftest import FlakyPort
from tests.sdk.cases import *  # noqa: F401,F403  (the SDK's tests, written once)
from tests.sdk.conftest import ServerProcess


class Fronted(ServerProcess):
    """The session's MLflow server reached through a port that can go away: `down()` refuses new connections
    and resets the open ones, as a restart does, and `up()` listens again at once, where an MLflow server
    takes 15–30 s to start again (what the SDK sees is the same: the server's address refuses it)."""

    def __init__(self, server: ServerProcess):
        self.__dict__.update(server.__dict__)
        self.front = FlakyPort(server.port)
        self.tracking_uri = server.tracking_uri.replace(f":{server.port}", f":{self.front.port}", 1)
        self.port = self.front.port

    def down(self) -> None:
        self.front.down()

    def up(self) -> None:
        self.front.up()


@pytest.fixture
def server(mlflow_server):
    fronted = Fronted(mlflow_server)
    yield fronted
    fronted.front.close()
