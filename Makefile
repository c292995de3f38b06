# Set-up on a fresh machine is two commands: `make run` (serve) and `make test` (check).
# Both create the virtualenv .venv, install msgtable into it, and install a MySQL-family server
# (MariaDB, with apt-get as root) when the machine has none. Nothing but python3 (with venv),
# make and, for the server, apt-get is assumed. Every apt-get runs through .ci/apt-install,
# which waits for another package manager (unattended upgrades) to finish first: up to
# MSGTABLE_APT_LOCK_TIMEOUT seconds (default 600).
#
#   make run ARGS="--listen 0.0.0.0:50051"     arguments for `msgtable serve`
#   make test PYTEST_ARGS="-k ack -x"          arguments for pytest
#   make bench BENCH_ARGS="--only raw,msgtable" arguments for python -m bench.run
#   make run DB=mysql                          serve on a throwaway MySQL 9.7, not MariaDB
#   make bench BENCH_ARGS=--mysql              the bench on a throwaway MySQL 9.7
#
# `make test` runs the integration and acceptance layers on MariaDB 10.11 and on MySQL 9.7
# (Debian unstable's, unpacked into ~/.cache/msgtable/mysql-9.7 once: .ci/mysql-install).

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
RUFF := $(VENV)/bin/ruff
ARGS ?=
PYTEST_ARGS ?=
BENCH_ARGS ?=
APT_INSTALL := bash .ci/apt-install
DB ?= mariadb
MYSQL_INSTALL := bash .ci/mysql-install
# The environment that has msgtable.testing.devdb start MySQL 9.7 (make run DB=mysql, BENCH_ARGS=--mysql)
WITH_MYSQL = MSGTABLE_MYSQLD="$$($(MYSQL_INSTALL) --print-binary)"
RUN_ENV = $(if $(filter mysql,$(DB)),$(WITH_MYSQL))
BENCH_ENV = $(if $(filter --mysql,$(BENCH_ARGS)),$(WITH_MYSQL))
BENCH_RUN_ARGS = $(filter-out --mysql,$(BENCH_ARGS))

export PIP_DISABLE_PIP_VERSION_CHECK := 1
export DEBIAN_FRONTEND := noninteractive

VENV_STAMP := $(VENV)/.stamp-venv
# What pip (and the other set-up steps) print goes here, not to the terminal: each step says
# in one line what it does and names this log; a step that fails shows the log's end too.
INSTALL_LOG := $(VENV)/install.log
, := ,
INSTALL_STAMP := $(VENV)/.stamp-install
TEST_STAMP := $(VENV)/.stamp-install-test
BENCH_STAMP := $(VENV)/.stamp-install-bench
SPARK_STAMP := $(VENV)/.stamp-install-spark

.DEFAULT_GOAL := help
.PHONY: help run test venv install install-test mysql-server mysql-client-dev spark spark-deps \
	browser-deps node-deps lint proto proto-check pytest docs \
	clean distclean bench bench-full bench-smoke chaos chaos-busy soak mysql97

help:
	@echo "make run            install what is missing, then run msgtable serve \$$ARGS"
	@echo "make test           install what is missing, then proto check, lint, mypy, pytest"
	@echo "make venv|install|install-test|mysql-server   the set-up steps on their own"
	@echo "make mysql97        MySQL 9.7 for the tests, once (~/.cache/msgtable/mysql-9.7)"
	@echo "make spark          the spark extra (PySpark) in .venv, with Java and the JDBC jar"
	@echo "make lint|proto|proto-check|pytest             the checks on their own"
	@echo "make docs           build the documentation site (docs/, mkdocs.yml) into site/"
	@echo "make bench          quick benchmark suite (under a minute): table, targets, JSON line"
	@echo "make bench-full     the full benchmark suite (minutes)"
	@echo "make bench-smoke    every bench section at its smallest (whether each runs; make test does)"
	@echo "make chaos          the fault suite alone (tests/faults, about two minutes), with its counts"
	@echo "make chaos-busy     the fault suite beside two CPU hogs (a machine busy with other work)"
	@echo "make soak           a long run with faults (MSGTABLE_SOAK_MINUTES, 30): resources stay flat"
	@echo "make clean|distclean                            remove caches | and the virtualenv"

run: $(INSTALL_STAMP) mysql-server $(if $(filter mysql,$(DB)),mysql97)
	$(RUN_ENV) $(VENV)/bin/msgtable serve $(ARGS)

test: $(TEST_STAMP) mysql-server mysql97 spark-deps browser-deps node-deps
	$(proto-check-commands)
	$(lint-commands)
	$(docs-commands)
	$(pytest-commands)

# The documentation site: docs/ (Markdown) and mkdocs.yml, built into site/. --strict fails on
# a broken link, a missing page or anchor, an API reference that does not resolve; the pages
# of the CLI and gRPC references are generated from msgtable/cli/flags.py and the proto.
# tests/acceptance/test_docs.py runs every snippet of the pages.
docs: $(TEST_STAMP)
	$(docs-commands)

# Benchmarks (bench/): quick mode, and full mode; BENCH_ARGS go to python -m bench.run.
# --mysql in BENCH_ARGS: on a throwaway MySQL 9.7 (msgtable.testing.devdb with MSGTABLE_MYSQLD).
bench: $(BENCH_STAMP) mysql-server spark-deps $(if $(filter --mysql,$(BENCH_ARGS)),mysql97)
	$(BENCH_ENV) $(PY) -m bench.run --quick $(BENCH_RUN_ARGS)

bench-full: $(BENCH_STAMP) mysql-server spark-deps $(if $(filter --mysql,$(BENCH_ARGS)),mysql97)
	$(BENCH_ENV) $(PY) -m bench.run --full $(BENCH_RUN_ARGS)

# Every section, the full-only ones too, at the smallest sizes that run its code (bench.smoke):
# whether each still runs, its figures mean nothing. `make test` runs it
# (tests/acceptance/test_bench_smoke.py).
bench-smoke: $(BENCH_STAMP) mysql-server spark-deps
	$(PY) -m bench.run --smoke $(BENCH_ARGS)

# The fault suite (also part of `make test`): 100,000 messages through two servers while the
# database restarts and crashes, servers are killed, subscribers die, stall and ack late, and
# the network resets connections, slows and cuts database links; prints its counts.
# MSGTABLE_CHAOS_MESSAGES=N for another size.
chaos: $(TEST_STAMP) mysql-server
	$(PY) -m pytest -p no:cacheprovider -q -s tests/faults $(PYTEST_ARGS)

# The fault suite on a busy machine: two processes spin at normal priority beside it
# (MSGTABLE_CHAOS_HOGS=N for another number).
chaos-busy: $(TEST_STAMP) mysql-server
	MSGTABLE_CHAOS_HOGS=$${MSGTABLE_CHAOS_HOGS:-2} \
		$(PY) -m pytest -p no:cacheprovider -q -s tests/faults/test_chaos.py $(PYTEST_ARGS)

# The soak: MSGTABLE_SOAK_MINUTES (30) at MSGTABLE_SOAK_RATE messages a second (200), a fault
# a minute; prints the steady server's resources every minute and fails on growth. Not in CI.
soak: $(TEST_STAMP) mysql-server
	MSGTABLE_SOAK_MINUTES=$${MSGTABLE_SOAK_MINUTES:-30} \
		$(PY) -m pytest -p no:cacheprovider -q -s tests/faults/test_soak.py $(PYTEST_ARGS)

# --- set-up --------------------------------------------------------------------------------

venv: $(VENV_STAMP)

# A venv made without ensurepip (Debian without python3-venv) has no pip: start it over.
$(VENV_STAMP):
	@if [ -x $(PY) ] && $(PY) -m pip --version >/dev/null 2>&1; then \
		echo "using the virtualenv in $(VENV)"; \
	else \
		rm -rf $(VENV); \
		if ! $(PYTHON) -m venv $(VENV); then \
			rm -rf $(VENV); \
			if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
				echo "$(PYTHON) -m venv failed"; \
				$(APT_INSTALL) --for "the virtualenv" python3-venv && $(PYTHON) -m venv $(VENV); \
			else \
				echo "$(PYTHON) -m venv failed: install your Python's venv module" \
					"(Debian/Ubuntu: apt-get install python3-venv)" >&2; \
				exit 1; \
			fi; \
		fi; \
	fi
	@touch $@

install: $(INSTALL_STAMP)

# The set-up steps are quiet: each says in one line what it does and names $(INSTALL_LOG), where
# its command's output goes; a step that fails shows the log's last lines and its path.
# $(call logged,COMMAND): COMMAND with its output appended to the log, under a line naming it.
logged = { echo "== $$(date '+%F %T') $(1)"; $(1); } >>$(INSTALL_LOG) 2>&1
# $(call failed,WHAT): the end of the log on stderr, the log's path, and exit 1.
failed = { tail -n 25 $(INSTALL_LOG) >&2; \
	echo "msgtable: $(1) failed; the whole log: $(INSTALL_LOG)" >&2; exit 1; }
# $(call step,WHAT,COMMAND): one line, the command logged, a failure shown.
step = echo "$(1) (log: $(INSTALL_LOG))"; $(call logged,$(2)) || $(call failed,$(1))

# msgtable runs on PyMySQL alone; mysqlclient (the `fast` extra, a C driver) reads rows about
# ten times faster and the server picks it when it imports. It compiles against the MySQL
# client library: `mysql-client-dev` installs that (apt-get, as root) when it is missing, and
# without it the server stays on PyMySQL. One pip run installs both; only when that fails
# (mysqlclient did not build) does a second install the server without it.
SERVER_EXTRAS := .[server,fast]
$(INSTALL_STAMP): $(VENV_STAMP) pyproject.toml
	@$(MAKE) --no-print-directory mysql-client-dev || true
	@echo "installing msgtable into $(VENV) (log: $(INSTALL_LOG))"; \
	$(call logged,$(PIP) install -e '$(SERVER_EXTRAS)') || { \
		echo "msgtable: mysqlclient did not build (the log says why): installing without" \
			"it, the server uses PyMySQL (slower)" >&2; \
		$(call logged,$(PIP) install -e '.[server]') || \
			$(call failed,installing msgtable into $(VENV)); \
	}
	@touch $@

install-test: $(TEST_STAMP)

# The tests cover the Spark pipeline too: the spark extra (PySpark, pyarrow, matplotlib); they
# run every bench section at smoke size: the bench extra (kombu, the peer's queue); and they
# build the documentation site and run its snippets: the docs extra (MkDocs, Material).
TEST_EXTRAS := .[test,spark,bench,docs]
$(TEST_STAMP): $(INSTALL_STAMP) pyproject.toml
	@$(call step,installing the test$(,) spark$(,) bench and docs extras into $(VENV),$(PIP) install -e '$(TEST_EXTRAS)')
	@touch $@

# The pipeline (msgtable.spark) in a clone: `pip install 'msgtable[spark]'` is for the published
# package; here the spark extra goes into .venv.
spark: $(SPARK_STAMP) spark-deps

$(SPARK_STAMP): $(INSTALL_STAMP) pyproject.toml
	@$(call step,installing the spark extra into $(VENV),$(PIP) install -e '.[spark]')
	@touch $@

# What Spark needs besides PySpark: a Java runtime (17) and MariaDB Connector/J, Debian's
# libmariadb-java (/usr/share/java/mariadb-java-client.jar), installed with apt-get as root.
JDBC_JAR ?= /usr/share/java/mariadb-java-client.jar
spark-deps:
	@missing=""; \
	command -v java >/dev/null 2>&1 || missing="$$missing default-jre-headless"; \
	[ -f "$(JDBC_JAR)" ] || missing="$$missing libmariadb-java"; \
	[ -z "$$missing" ] || $(APT_INSTALL) --for Spark $$missing

# The browser tests render msgtable's HTML report and drive the dashboard in headless
# Chromium: Debian's chromium (/usr/bin/chromium) and chromium-driver (/usr/bin/chromedriver,
# for selenium), installed with apt-get as root.
browser-deps:
	@missing=""; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null 2>&1 || missing="$$missing chromium-driver"; \
	[ -z "$$missing" ] || $(APT_INSTALL) --for "the browser tests" $$missing

# The fuzz test calls the server from a second client stack, Node's grpc-js (tests/node): Node
# and npm (Debian's nodejs and npm, with apt-get as root, when missing), then the locked
# packages of tests/node/package-lock.json (from the npm registry).
NODE_GRPC := tests/node/node_modules/@grpc/grpc-js/package.json
node-deps: $(NODE_GRPC)

$(NODE_GRPC): tests/node/package-lock.json
	@missing=""; \
	command -v node >/dev/null 2>&1 || missing="$$missing nodejs"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	[ -z "$$missing" ] || $(APT_INSTALL) --for "the fuzz test's Node client" $$missing
	npm ci --prefix tests/node --no-audit --no-fund
	@touch $@

# The bench extra brings the peer queue (kombu) the benchmarks compare against; the spark
# extra the pipeline's figures.
BENCH_EXTRAS := .[bench,spark]
$(BENCH_STAMP): $(INSTALL_STAMP) pyproject.toml
	@$(call step,installing the bench and spark extras into $(VENV),$(PIP) install -e '$(BENCH_EXTRAS)')
	@touch $@

# The headers and pkg-config entry mysqlclient builds against (Debian: libmariadb-dev).
mysql-client-dev:
	@pkg-config --exists libmariadb 2>/dev/null || pkg-config --exists mysqlclient 2>/dev/null || \
		$(APT_INSTALL) --for mysqlclient libmariadb-dev pkg-config

# MySQL 9.7 for the tests (and DB=mysql): Debian unstable's mysql-server-core, downloaded with
# a private apt state and unpacked into ~/.cache/msgtable/mysql-9.7 (MSGTABLE_MYSQL_CACHE) once;
# the system's apt state and its MariaDB are not touched.
mysql97:
	@$(MYSQL_INSTALL)

# Idempotent: finds the server binary the way msgtable.testing.devdb does, installs MariaDB if none.
mysql-server: $(INSTALL_STAMP)
	@if $(PY) -m msgtable.testing.devdb find 2>/dev/null; then \
		:; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "no mariadbd/mysqld found"; \
		$(APT_INSTALL) mariadb-server && $(PY) -m msgtable.testing.devdb find; \
	else \
		echo "no mariadbd/mysqld found, and only root with apt-get can install one here." >&2; \
		$(PY) -m msgtable.testing.devdb find; \
		exit 1; \
	fi

# --- checks --------------------------------------------------------------------------------

define proto-check-commands
$(PY) protos/generate.py --check
endef

# bench/ may not exist yet in a fresh clone (git keeps no empty directories).
define lint-commands
$(RUFF) check msgtable tests $(wildcard bench)
$(RUFF) format --check msgtable tests $(wildcard bench)
$(VENV)/bin/mypy
$(VENV)/bin/lint-imports --no-cache
endef

# PYTHONPATH: the pages document this checkout's msgtable, whatever the venv was installed from.
define docs-commands
NO_MKDOCS_2_WARNING=1 PYTHONPATH=$(CURDIR) $(VENV)/bin/mkdocs build --strict --quiet
endef

# Three runs (.ci/pytest-layers): every layer but the fault suite on MariaDB (pytest-xdist, a
# worker a core), the fault suite on MariaDB alone, and the integration and acceptance layers
# on MySQL 9.7; then each run's counts. pytest's exit 5 (no tests collected) is no failure.
define pytest-commands
@PY=$(PY) bash .ci/pytest-layers $(PYTEST_ARGS)
endef

proto-check: $(TEST_STAMP)
	$(proto-check-commands)

proto: $(TEST_STAMP)
	$(PY) protos/generate.py

lint: $(TEST_STAMP)
	$(lint-commands)

pytest: $(TEST_STAMP) mysql-server mysql97 spark-deps browser-deps node-deps
	$(pytest-commands)

# --- cleaning ------------------------------------------------------------------------------

clean:
	rm -rf build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis $(VENV)/.stamp-*
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) tests/node/node_modules
