"""Programs the worker runs on SSH and local targets, each shipped by worker_agent.core.ship (sent once,
then run by its sha256). Standard library only: they run under the target's Python with `-I -S`, and a
program is one file there, so a module here imports only the standard library and, for code the worker
or the site runner shares with it, earlier modules it is joined with (`ship.Program.of_modules`).

- files.py: a job's files (its source put in place, its outputs listed, read as a byte range or as
  frames for a batch upload), joined after worker_agent.core.source and worker_agent.core.outputs;
- dataset_cache.py: the input dataset cache (worker_agent.dataset_transfer is the worker's side);
- net.py: a cluster job's network facts (a free port, names resolved as the computer resolves them).

worker_agent/supervisor.py, gpu_probe.py and authorized_keys.py are shipped the same way from where they
are: the site runner imports the first and the last in-process, from the modules it is bundled with."""
