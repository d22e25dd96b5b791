"""The agent side of sites (docs/sites-protocol.md): the runner a site's job shell starts on a compute node."""
