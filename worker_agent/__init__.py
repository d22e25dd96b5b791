"""The Mado Compute worker agent. It never imports Django: it talks to the server over HTTP only."""

__version__ = "0.1.0"
