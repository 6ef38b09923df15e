# NovelForge Session Runtime — developer entry points.
#
#   make setup      venv + PostgreSQL + database (+ Redis, Chromium)   [scripts/bootstrap.sh test]
#   make run        migrate, collectstatic, load_demo, then daphne on http://$(RUN_HOST):$(RUN_PORT)/
#                   with the lease reconciler (every $(RECONCILE_INTERVAL) s), the webhook sender and the mailer beside it (stopped with the server)
#   make test       pytest -m "not browser", then pytest -m browser (exit 5 = none collected is OK)
#   make serve-cluster  N uvicorn processes (N=2, python -m novelforge_sessions.serve) on $(CLUSTER_BASE_PORT)..
#                   sharing Redis, the reconciler, webhook sender and mailer beside them; all stopped together (deploy/nginx.conf in front)
#   make reconcile  manage.py reconcile_runtimes --loop
#   make bench      python bench/run.py $(BENCH_ARGS): the goals as users run the systems, steps/s (3 rounds)
#   make bench-quick  the same table, one round of 5 s windows (a few minutes; make bench BENCH_ARGS=--quick)
#   make harness    python -m harness $(HARNESS_ARGS): faults (kill points, PostgreSQL and Redis
#                   restarts), load and the model-based test on throwaway loopback servers (minutes)
#   make stop-local stop the project-local PostgreSQL/Redis the bootstrap may have started
#   make messages   update locale/zh_Hans/LC_MESSAGES/django.po and djangojs.po from the sources, compile them
#
# scripts/bootstrap.sh prints `export NAME=value` lines on stdout (logs go to stderr); every
# recipe evals them, so DATABASE_URL (and TEST_REDIS_URL in test mode) reach Django and pytest.
# Extra pytest arguments: make test PYTEST_ARGS="-x -k session"

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.ONESHELL:
.DEFAULT_GOAL := help

VENV        := .venv
PY          := $(VENV)/bin/python
MANAGE      := $(PY) manage.py
PYTEST_ARGS ?=
BENCH_ARGS  ?=
HARNESS_ARGS ?=
RUN_HOST    ?= 127.0.0.1
RUN_PORT    ?= 8000
RECONCILE_INTERVAL ?= 2
WEBHOOK_INTERVAL  ?= 1
NOTIFY_INTERVAL   ?= 5
N                 ?= 2
CLUSTER_BASE_PORT ?= 8001
CLUSTER_REDIS_URL ?= redis://127.0.0.1:6379/0

# $(call bootstrap,MODE): run the bootstrap, abort on failure, import its exports.
bootstrap = bootstrap_env="$$(scripts/bootstrap.sh $(1))"; eval "$$bootstrap_env"

.PHONY: help setup run serve-cluster test reconcile bench bench-quick harness stop-local messages

# The translation catalogs (docs/pages.md#language): makemessages finds what templates/, the server's
# Python and static/js mark; translate the new entries in the .po files, then compile (the bootstrap
# and the tests also compile; the .mo files are never committed).
MESSAGES_IGNORE := -i tests -i bench -i harness -i examples -i novelforge_client -i docs -i deploy \
                   -i staticfiles -i build -i '*.egg-info' -i .venv -i locale

help:
	@sed -n '1,19p' Makefile | sed 's/^# \{0,1\}//'

setup:
	@$(call bootstrap,test)

run:
	@$(call bootstrap,run)
	$(MANAGE) migrate --noinput
	$(MANAGE) collectstatic --noinput
	$(MANAGE) load_demo --base-url http://$(RUN_HOST):$(RUN_PORT)
	echo "Serving on http://$(RUN_HOST):$(RUN_PORT)/"
	# Without REDIS_URL the reconciler (another process) wakes this server's websockets through
	# PostgreSQL NOTIFY (LIVE_PG_NOTIFY): its events reach open pages within ~1 s, so the
	# sockets keep the default 15 s sweep (LIVE_SWEEP_SECONDS) as their safety net only.
	# The reconciler runs beside the server (expired leases → lost runtimes, running sessions
	# failed/runtime_lost), every $(RECONCILE_INTERVAL) s: well within one lease. Stopped with it.
	$(MANAGE) reconcile_runtimes --loop --interval $(RECONCILE_INTERVAL) &
	reconciler=$$!
	# The webhook sender (docs/webhooks.md) reads the event log beside the server: a slow or dead
	# endpoint never delays a write. Stopped with the server, like the reconciler.
	$(MANAGE) send_webhooks --loop --interval $(WEBHOOK_INTERVAL) &
	sender=$$!
	# The mailer (docs/notifications.md) emails the people a wait names, from the event log too
	# (console backend unless EMAIL_HOST is set: the mails appear in this terminal).
	$(MANAGE) send_notifications --loop --interval $(NOTIFY_INTERVAL) &
	mailer=$$!
	trap 'kill $$reconciler $$sender $$mailer 2>/dev/null || true; wait $$reconciler $$sender $$mailer 2>/dev/null || true' EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	echo "Reconciling expired runtime leases every $(RECONCILE_INTERVAL) s (pid $$reconciler)"
	echo "Sending webhooks every $(WEBHOOK_INTERVAL) s (pid $$sender)"
	echo "Sending notification emails every $(NOTIFY_INTERVAL) s (pid $$mailer)"
	# The server takes its database connections from psycopg's pool (see docs/deployment.md, Configuration).
	export DB_POOL_MAX_SIZE="$${DB_POOL_MAX_SIZE:-10}"
	$(VENV)/bin/daphne -b $(RUN_HOST) -p $(RUN_PORT) novelforge_sessions.asgi:application

# N processes behind one address (docs/deployment.md, "Several processes behind one address"): each
# server (python -m novelforge_sessions.serve, uvicorn) on its own port with REDIS_URL (the channel
# layer that crosses processes), the reconciler as its own process. Any process exiting, Ctrl-C or
# SIGTERM stops them all: each server gets SIGTERM and drains (requests in flight finish, websockets
# close with 1012; docs/deployment.md, "Graceful shutdown").
serve-cluster:
	@$(call bootstrap,run)
	export REDIS_URL="$${REDIS_URL:-$(CLUSTER_REDIS_URL)}"
	$(PY) -c 'import os, redis; redis.Redis.from_url(os.environ["REDIS_URL"]).ping()' \
	  || { echo "serve-cluster needs Redis at $$REDIS_URL (set REDIS_URL=redis://…)" >&2; exit 1; }
	# Metrics of every process from any one (docs/observability.md#several-processes): with
	# PROMETHEUS_MULTIPROC_DIR set, prometheus_client's files of an earlier run are removed first.
	if [ -n "$${PROMETHEUS_MULTIPROC_DIR:-}" ]; then
	  mkdir -p "$$PROMETHEUS_MULTIPROC_DIR"
	  rm -f "$$PROMETHEUS_MULTIPROC_DIR"/{counter,gauge,histogram,summary}_*.db
	  echo "Request metrics of all processes in $$PROMETHEUS_MULTIPROC_DIR (prometheus_client multi-process mode)"
	fi
	$(MANAGE) migrate --noinput
	$(MANAGE) collectstatic --noinput
	$(MANAGE) load_demo --base-url http://$(RUN_HOST):$(CLUSTER_BASE_PORT)
	export DB_POOL_MAX_SIZE="$${DB_POOL_MAX_SIZE:-10}"
	pids=""
	trap 'kill $$pids 2>/dev/null || true; wait $$pids 2>/dev/null || true' EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	$(MANAGE) reconcile_runtimes --loop --interval $(RECONCILE_INTERVAL) &
	pids="$$!"
	echo "Reconciling expired runtime leases every $(RECONCILE_INTERVAL) s (pid $$!)"
	$(MANAGE) send_webhooks --loop --interval $(WEBHOOK_INTERVAL) &
	pids="$$pids $$!"
	echo "Sending webhooks every $(WEBHOOK_INTERVAL) s (pid $$!)"
	$(MANAGE) send_notifications --loop --interval $(NOTIFY_INTERVAL) &
	pids="$$pids $$!"
	echo "Sending notification emails every $(NOTIFY_INTERVAL) s (pid $$!)"
	for i in $$(seq 0 $$(( $(N) - 1 ))); do
	  port=$$(( $(CLUSTER_BASE_PORT) + i ))
	  $(PY) -m novelforge_sessions.serve --host $(RUN_HOST) --port $$port &
	  pids="$$pids $$!"
	  echo "Serving on http://$(RUN_HOST):$$port/ (pid $$!, REDIS_URL=$$REDIS_URL)"
	done
	echo "One address in front: nginx -p /tmp/nf-nginx -c $$PWD/deploy/nginx.conf (→ :8080)"
	wait -n

test:
	@$(call bootstrap,test)
	rc_main=0; rc_browser=0
	# Browser tests run in their own process (sync Playwright and pytest-asyncio do not mix);
	# they run first so that the main suite's summary is the closing line.
	echo "== pytest -m browser =="
	$(PY) -m pytest -m browser $(PYTEST_ARGS) || rc_browser=$$?
	if [ "$$rc_browser" -eq 5 ]; then echo "(no browser tests collected; treated as success)"; rc_browser=0; fi
	echo "== pytest -m 'not browser' =="
	$(PY) -m pytest -m "not browser" $(PYTEST_ARGS) || rc_main=$$?
	# On success the main suite's summary stays the closing line (CI reads it).
	if [ "$$rc_main" -ne 0 ] || [ "$$rc_browser" -ne 0 ]; then
		echo "pytest exit codes: not-browser=$$rc_main browser=$$rc_browser"; exit 1
	fi

reconcile:
	@$(call bootstrap,run)
	exec $(MANAGE) reconcile_runtimes --loop

bench:
	@$(call bootstrap,run)
	# bench/run.py re-executes itself in bench/.venv (created on first use; the project's .venv
	# only starts it). It uses DATABASE_URL's server and recreates the nfbench_* databases there
	# (BENCH_ARGS="--db-prefix NAME" for others). Each workload is 8 client processes on this
	# machine; verdicts are steps/s ratios, whole-machine CPU per step beside them (bench/README.md).
	$(PY) bench/run.py $(BENCH_ARGS)

# The reliability harness (docs/guarantees.md): it starts its own PostgreSQL cluster, redis-server
# and daphne processes on free loopback ports (never the machine's 5432/6379) and stops them all.
# The bootstrap only makes sure the venv exists; its DATABASE_URL is used by the model-based test.
harness:
	@$(call bootstrap,test)
	$(PY) -m harness $(HARNESS_ARGS)

bench-quick:
	@$(MAKE) --no-print-directory bench BENCH_ARGS="--quick $(BENCH_ARGS)"

stop-local:
	@scripts/bootstrap.sh stop

messages:
	$(MANAGE) makemessages -l zh_Hans --no-obsolete --add-location file $(MESSAGES_IGNORE)
	$(MANAGE) makemessages -l zh_Hans -d djangojs --no-obsolete --add-location file $(MESSAGES_IGNORE)
	$(MANAGE) compilemessages --ignore '*'
