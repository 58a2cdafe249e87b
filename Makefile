# The two commands of the README, plus bench, lint and dist. Everything runs from .venv, built from the pinned files.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: test-pgbouncer run test bench lint format install dist localstripe

# The client distribution (clients/python: the API client and the recovered-tool decorator), which the console
# depends on for what they share: installed from its directory, again whenever one of its files changes.
CLIENT := clients/python
CLIENT_FILES := $(CLIENT)/pyproject.toml $(CLIENT)/README.md $(CLIENT)/src/recovery_client/py.typed \
	$(wildcard $(CLIENT)/src/recovery_client/*.py)

$(VENV)/.installed-run: requirements.txt $(CLIENT_FILES)
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.txt
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --force-reinstall ./$(CLIENT)
	touch $@

$(VENV)/.installed-dev: requirements.txt requirements-dev.txt requirements-adoption.txt requirements-otlp-test.txt $(VENV)/.installed-run
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements-dev.txt -r requirements-adoption.txt
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.txt -r requirements-otlp-test.txt
	touch $@

# axe-core for the accessibility check of every console page (tests/test_console_pages_browser.py), pinned in
# tests/axe/package-lock.json; installed again only when the lock changes. Without npm those checks skip with the
# reason (CI's .ci/run installs it, and REQUIRE_SERVICES=1 makes the skip a failure).
AXE := tests/axe/node_modules/.installed
$(AXE): tests/axe/package-lock.json
	@if command -v npm >/dev/null; then npm ci --prefix tests/axe --no-audit --no-fund && touch $@; \
	else echo "npm not found: the axe-core page checks will skip (apt-get install nodejs npm)"; fi

# The CSS toolkit vendored under static/vendor/ (docs/console.md, "The design system"), pinned in
# tests/vendor/package-lock.json: `npm ci` verifies its tarball against the lock's integrity hash, and
# tests/test_vendored_assets.py checks every vendored file is byte-identical to the verified package's. Node is not
# needed to run the console, only for this check.
VENDOR := tests/vendor/node_modules/.installed
$(VENDOR): tests/vendor/package-lock.json
	@if command -v npm >/dev/null; then npm ci --prefix tests/vendor --no-audit --no-fund --omit=peer && touch $@; \
	else echo "npm not found: the vendored-toolkit check will skip (apt-get install nodejs npm)"; fi

# localstripe for the Stripe tests (tests/test_stripe.py), in a virtualenv of its own: its aiohttp stack stays out of
# .venv. Without it those tests skip with the reason (REQUIRE_SERVICES=1 makes the skip a failure).
LOCALSTRIPE := .venv-localstripe/.installed
$(LOCALSTRIPE): requirements-localstripe.txt
	$(PYTHON) -m venv .venv-localstripe
	.venv-localstripe/bin/pip install --quiet --disable-pip-version-check -r requirements-localstripe.txt
	touch $@

localstripe: $(LOCALSTRIPE)

# The MCP servers the gateway tests call (tests/test_mcp_gateway.py, docs/mcp-gateway.md): mcp-server-git and
# mcp-server-time in a virtualenv of their own, the reference memory server under tests/mcp-memory (its lock pinned).
# Without them those tests skip with the reason (REQUIRE_SERVICES=1 makes the skip a failure).
MCP_SERVERS := .venv-mcp/.installed
$(MCP_SERVERS): requirements-mcp-servers.txt
	$(PYTHON) -m venv .venv-mcp
	.venv-mcp/bin/pip install --quiet --disable-pip-version-check -r requirements-mcp-servers.txt
	touch $@
MCP_MEMORY := tests/mcp-memory/node_modules/.installed
$(MCP_MEMORY): tests/mcp-memory/package-lock.json
	@if command -v npm >/dev/null; then npm ci --prefix tests/mcp-memory --no-audit --no-fund && touch $@; \
	else echo "npm not found: the MCP memory server tests will skip (apt-get install nodejs npm)"; fi

install: $(VENV)/.installed-run

# Embedded default: SQLite under var/ and in-process jobs. Set DATABASE_URL / REDIS_URL for PostgreSQL / RQ.
# ADDR=host:port serves the console elsewhere (manage.py run --addr), SANDBOX_ADDR=host:port the sandbox provider
# (RECOVERY_SANDBOX_ADDR): `make run ADDR=127.0.0.1:8100 SANDBOX_ADDR=127.0.0.1:8101`.
ADDR ?=
SANDBOX_ADDR ?=
run: $(VENV)/.installed-run
	$(if $(SANDBOX_ADDR),RECOVERY_SANDBOX_ADDR=$(SANDBOX_ADDR)) DEBUG=$${DEBUG:-1} $(PY) manage.py run $(if $(ADDR),--addr $(ADDR))

# The whole suite. Tests needing PostgreSQL, Redis or Chromium skip with the reason when those are missing;
# REQUIRE_SERVICES=1 turns each such skip into a failure.
# The suite on TEST_WORKERS processes (one per core by default), each module whole in one of them; the slowest
# tests named at the end, so CI's time budget shows where it goes.
TEST_WORKERS ?= auto
test: $(VENV)/.installed-dev $(AXE) $(VENDOR) $(LOCALSTRIPE) $(MCP_SERVERS) $(MCP_MEMORY)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=25

# The API, job, reconcile, action and drill modules again, every connection through PgBouncer in transaction mode
# (docs/deploy.md; needs PostgreSQL in DATABASE_URL and Debian's pgbouncer). CI runs it after `make test`.
PGBOUNCER_MODULES = tests/test_api.py tests/test_api_lifecycle.py tests/test_jobs.py tests/test_reconcile.py \
	tests/test_actions.py tests/test_action_execution.py tests/test_drills.py
test-pgbouncer: $(VENV)/.installed-dev
	RECOVERY_TEST_PGBOUNCER=1 $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PGBOUNCER_MODULES)

# Ratios against baselines measured in the same run; use DATABASE_URL=postgres://... for the docs/design/quality-targets.md figures.
# Production settings (DEBUG off), with secrets generated for this run unless the environment gives them.
bench: $(VENV)/.installed-dev
	@secret=$$($(PY) -c "import secrets; print(secrets.token_urlsafe(48))"); \
	DEBUG=$${DEBUG:-0} SECRET_KEY=$${SECRET_KEY:-$$secret} RECOVERY_TOKEN_PEPPER=$${RECOVERY_TOKEN_PEPPER:-$$secret} \
	RECOVERY_AUDIT_KEYS=$${RECOVERY_AUDIT_KEYS:-bench:$$secret} ALLOWED_HOSTS=$${ALLOWED_HOSTS:-127.0.0.1,localhost} \
	SECURE_SSL_REDIRECT=$${SECURE_SSL_REDIRECT:-0} $(PY) manage.py bench $(BENCH)

# mypy --strict on the client distribution, checked as the package agents install (its own configuration:
# clients/python/pyproject.toml).
lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	cd $(CLIENT) && ../../$(VENV)/bin/mypy

# The client distribution's wheel and sdist, into dist/ (docs/recovered-tools.md#install): built with the backend
# its pyproject.toml pins, which requirements-dev.txt installs (no isolated download at build time).
dist: $(VENV)/.installed-dev
	$(PY) -m build --no-isolation --outdir dist $(CLIENT)

format: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .
