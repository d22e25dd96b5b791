"""The agent's job-lifecycle logic, written once for the worker and the site runner (which gets it
bundled in SPEC_DIR/lib, worker_agent.site.spec): standard library only, Python >= 3.11; `outputs`
and `source` are also joined into the `files` program run on SSH targets (worker_agent/target/files.py,
`ship.Program.of_modules`), so they carry no annotations."""
