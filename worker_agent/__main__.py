"""`python -m worker_agent run`: what the systemd unit starts."""
from worker_agent.cli import main

main(prog_name="mado-tracking-worker")
