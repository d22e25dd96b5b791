"""`mado-tracking-worker`: the command line of the worker agent.

Only the version is answered so far; run/install/upgrade/status/doctor arrive with the worker issue."""
from __future__ import annotations

import click

from worker_agent import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mado-tracking-worker")
def main() -> None:
    """Run Mado Compute jobs on SSH and Local computers."""
