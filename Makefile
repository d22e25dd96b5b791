# The two commands of the README: `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
TEST_DB := mado_run_$(shell date +%s)_$(shell echo $$$$)
PG_URL ?= postgres://postgres@127.0.0.1:5432

.PHONY: run test venv peers migrate dist messages schema bench clean

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements.txt
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps -e .
	@touch $@

venv: $(STAMP)

# Debian packages the tests need as real peers; installed only when missing.
peers:
	@missing=""; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	test -x /usr/sbin/sshd || missing="$$missing openssh-server"; \
	command -v git >/dev/null || missing="$$missing git"; \
	command -v shellcheck >/dev/null || missing="$$missing shellcheck"; \
	command -v slurmctld >/dev/null || missing="$$missing slurm-wlm"; \
	test -x /usr/sbin/munged || missing="$$missing munge"; \
	test -x /usr/sbin/sge_qmaster || missing="$$missing gridengine-master gridengine-client"; \
	test -x /usr/sbin/sge_execd || missing="$$missing gridengine-exec"; \
	command -v dockerd >/dev/null || missing="$$missing docker.io"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v mpicc >/dev/null || missing="$$missing openmpi-bin libopenmpi-dev"; \
	test -x /bin/busybox || missing="$$missing busybox-static"; \
	test -d /usr/share/fonts/opentype/noto || missing="$$missing fonts-noto-cjk"; \
	if [ -n "$$missing" ]; then \
	  echo "Installing from Debian:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

migrate: venv
	MADO_DEBUG=true MADO_DEV_MODE=true $(PY) manage.py migrate --no-input

# The agent distribution the server offers at /downloads/ (a wheel and an sdist of mado-tracking, built by
# `manage.py build_agent` into var/downloads), rebuilt when its sources change.
AGENT_SOURCES := pyproject.toml $(shell find worker_agent mado_tracking -name '*.py' -not -path '*/__pycache__/*')
var/downloads/manifest.json: $(AGENT_SOURCES) $(STAMP)
	MADO_DEBUG=true MADO_DEV_MODE=true $(PY) manage.py build_agent

dist: var/downloads/manifest.json

# The demo: server on 127.0.0.1:8000 plus one local worker for the Local computer and the periodic
# runner (time-based rules, notifications); Ctrl-C stops all three. The worker serves the Local computer
# by id (MMT_WORKER_TARGET_IDS, which `manage.py demo` writes to var/worker-target-ids), so the checks
# of its details, which name no worker, reach it (seed 002).
run: migrate dist
	MADO_DEBUG=true MADO_DEV_MODE=true $(PY) manage.py demo
	@MADO_DEV_MODE=true MMT_ALLOW_LOCAL_EXECUTOR=true MMT_API_URL=http://127.0.0.1:8000 \
	  MMT_WORKER_TARGET_IDS="$$(cat $(CURDIR)/var/worker-target-ids)" \
	  MMT_API_TOKEN_FILE=$(CURDIR)/var/worker-token MMT_WORKER_ID=local-worker MMT_WORKER_STATE_DIR=$(CURDIR)/var/worker-state \
	  $(VENV)/bin/mado-tracking-worker run > var/worker.log 2>&1 & worker=$$!; \
	  echo "Local worker started (log: var/worker.log)."; \
	  MADO_DEBUG=true MADO_DEV_MODE=true $(PY) manage.py mado_periodic > var/periodic.log 2>&1 & periodic=$$!; \
	  echo "Periodic runner started (log: var/periodic.log)."; \
	  trap 'kill $$worker $$periodic 2>/dev/null' EXIT INT TERM; \
	  MADO_DEBUG=true MADO_DEV_MODE=true $(PY) manage.py runserver 127.0.0.1:8000

# A throwaway PostgreSQL database per run: pytest-django creates test_<name> and drops it at the end.
test: venv peers
	MADO_DATABASE_URL=$(PG_URL)/$(TEST_DB) MADO_VAR_DIR=$$(mktemp -d) DJANGO_ALLOW_ASYNC_UNSAFE=true \
	  $(PY) -m pytest $(PYTEST_ARGS)

messages: venv
	$(PY) manage.py compilemessages --ignore=.venv

schema: venv
	$(PY) manage.py spectacular --file docs/openapi.yaml --validate

# Benchmarks print `name: value unit` lines next to a baseline measured in the same run.
bench: venv
	$(PY) bench/claim_throughput.py
	$(PY) bench/relay_throughput.py
	$(PY) bench/tracking_throughput.py
	$(PY) bench/chart_render.py
	$(PY) bench/list_pages.py

clean:
	rm -rf $(VENV) var
