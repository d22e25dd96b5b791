"""The researcher CLI's client of the server's API (`mado-tracking`, `datasets`): errors say what to fix."""
from __future__ import annotations

import os
from pathlib import Path

import click
import requests

from worker_agent import __version__
from worker_agent.text import mask_tokens

TIMEOUT = (5, 60)


class Api:
    def __init__(self, url: str, token: str):
        self.url = url.rstrip("/")
        self.token = token
        self.session = requests.Session()
        self.session.headers.update({"Authorization": f"Bearer {token}", "Accept": "application/json",
                                     "User-Agent": f"mado-tracking/{__version__}"})

    def call(self, method: str, path: str, **kwargs):
        try:
            response = self.session.request(method, self.url + path, timeout=TIMEOUT, allow_redirects=False,
                                            **kwargs)
        except requests.RequestException as error:
            raise click.ClickException(
                f"Cannot reach the Mado server at {self.url} ({type(error).__name__}). Check MMT_API_URL and "
                "your network.") from None
        if response.status_code >= 400:
            raise click.ClickException(self._explain(response))
        return response.json() if response.content else {}

    def _explain(self, response) -> str:
        try:
            body = response.json()
            message = body.get("error") or response.reason
            fields = body.get("fields") or {}
        except ValueError:
            message, fields = f"{response.status_code} {response.reason}", {}
        hint = {401: " Issue a new token under Project settings → Project tokens and set MMT_API_TOKEN.",
                403: " Your token or role does not allow this."}.get(response.status_code, "")
        detail = "".join(f"\n  {name}: {' '.join(map(str, msgs))}" for name, msgs in fields.items())
        return mask_tokens(f"{message}{hint}{detail}", self.token)


def api_client(ctx: click.Context) -> Api:
    """The API client, built on first use so that --help works without any configuration."""
    root = ctx.find_root()
    if isinstance(root.obj, Api):
        return root.obj
    settings = root.obj or {}
    token = os.environ.get("MMT_API_TOKEN", "").strip()
    if settings.get("token_file"):
        try:
            token = Path(settings["token_file"]).read_text().strip()
        except OSError as error:
            raise click.ClickException(f"Cannot read the token file {settings['token_file']}: "
                                       f"{error.strerror}.") from None
    if not settings.get("api_url"):
        raise click.ClickException("Set MMT_API_URL (or --api-url) to the address of the Mado server.")
    if not token:
        raise click.ClickException("Set MMT_API_TOKEN, or MMT_API_TOKEN_FILE to a file holding your API token "
                                   "(Project settings → Project tokens → Issue personal token).")
    root.obj = Api(settings["api_url"], token)
    # The command's connections end with it, also when it runs inside another program (a script, a test).
    root.call_on_close(root.obj.session.close)
    return root.obj


def token_project(api: Api) -> str:
    return api.call("GET", "/api/auth/token")["project"]
