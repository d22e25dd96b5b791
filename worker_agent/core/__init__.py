"""The agent's job-lifecycle logic, written once for the worker and the site runner (which gets it
bundled in SPEC_DIR/lib, worker_agent.site.spec): standard library only, Python >= 3.11; `outputs`
and `source` also go as program text to SSH targets, so they carry no annotations."""
