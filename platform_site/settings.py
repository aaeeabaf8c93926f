"""Settings, read from the environment here and nowhere else.

The only other readers of the environment are the entry points that name this
module (manage.py, platform_site/asgi.py, platform_site/celery.py set
DJANGO_SETTINGS_MODULE) and the benchmark scripts.

ENV_FILE      a dotenv file whose variables fill in what the environment leaves
              unset (default: `.env` in the project root, written by `make run`
              with a generated SECRET_KEY and DEBUG=1; platform_site/envfile.py).
              Under pytest only an explicit ENV_FILE is read, so a developer's
              .env does not change the tests.
DATABASE_URL  absent: SQLite file in the project root; postgres://... uses psycopg 3.
REDIS_URL     absent: embedded backends (in-memory channel layer, in-process
              queue, engine thread inside the web process, eager Celery).
"""

import json
import os
import tempfile
from datetime import timedelta
from pathlib import Path

import dj_database_url
from dotenv import dotenv_values

BASE_DIR = Path(__file__).resolve().parent.parent
TESTING = "PYTEST_VERSION" in os.environ
ENV_FILE = os.environ.get("ENV_FILE") or ("" if TESTING else str(BASE_DIR / ".env"))
# The environment wins over the file; os.environ itself is left as it is, so child processes see only what was set.
ENV: dict[str, str] = {
    **{k: v for k, v in (dotenv_values(ENV_FILE) if ENV_FILE else {}).items() if v is not None},
    **os.environ,
}


def env_bool(name: str, default: bool) -> bool:
    value = ENV.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in ENV.get(name, default).split(",") if item.strip()]


def env_opt(name: str, cast=str):
    """The variable cast to its type, or None when unset: the component's own default then applies."""
    value = ENV.get(name, "").strip()
    return cast(value) if value else None


def env_flag(name: str) -> bool | None:
    value = env_opt(name, str.lower)
    if value is None:
        return None
    if value not in {"1", "true", "yes", "on", "0", "false", "no", "off"}:
        raise ValueError(f"{name} must be 0 or 1; got {value!r}")
    return value in {"1", "true", "yes", "on"}


# ---------------------------------------------------------------- core
DEBUG = env_bool("DEBUG", False)
SECRET_KEY = ENV.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not (DEBUG or TESTING):
        raise RuntimeError("SECRET_KEY must be set when DEBUG is off (see deploy/env.example; `make run` writes a local .env)")
    SECRET_KEY = "django-insecure-development-only-" + "k" * 40
# Server-side pepper mixed into every API key hash (HMAC-SHA-256).
API_KEY_PEPPER = ENV.get("API_KEY_PEPPER", "") or ("dev-pepper:" + SECRET_KEY)
# Seconds the completion endpoints keep a verified key's row (tenants.services.api_key_cache); 0: off.
API_KEY_CACHE_TTL_S = float(ENV.get("API_KEY_CACHE_TTL_S", "2"))
API_KEY_CACHE_KEEP_WARM_S = float(ENV.get("API_KEY_CACHE_KEEP_WARM_S", "30"))
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "channels",
    "axes",
    "tenants",
    "billing",
    "inference",
    "batches",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # paths under /v1 answer errors in the OpenAI shape, under DEBUG too (Django's own pages are HTML)
    "common.middleware.ApiErrorShapeMiddleware",
    # login throttling (django-axes): last, as its docs ask
    "axes.middleware.AxesMiddleware",
]
# django-axes checks (and counts) every login made with a request before the model backend does.
AUTHENTICATION_BACKENDS = ["tenants.auth.LoginThrottleBackend", "django.contrib.auth.backends.ModelBackend"]

ROOT_URLCONF = "platform_site.urls"
ASGI_APPLICATION = "platform_site.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# ---------------------------------------------------------------- database
DATABASE_URL = ENV.get("DATABASE_URL", "")
DATABASES = {
    "default": dj_database_url.parse(
        DATABASE_URL or f"sqlite:///{BASE_DIR / 'db.sqlite3'}",
        conn_max_age=int(ENV.get("DB_CONN_MAX_AGE", "0")),
        # a persistent connection is checked before a request reuses it, and with DB_POOL each pooled one
        # as it leaves the pool (Django passes psycopg's ConnectionPool.check_connection): none left
        # broken by a database restart answers a 500
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"].setdefault("OPTIONS", {})
    DATABASES["default"]["OPTIONS"].update({"timeout": 30})
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and env_bool("DB_POOL", True):
    # Under ASGI Django's docs ask for the driver's pool, not persistent connections
    # (CONN_MAX_AGE must then be 0). Without either, every request that reaches the
    # database opens a connection, which costs many times a query on an open one.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": int(ENV.get("DB_POOL_MIN_SIZE", "1")),
        "max_size": int(ENV.get("DB_POOL_MAX_SIZE", "8")),
        "timeout": float(ENV.get("DB_POOL_TIMEOUT_S", "10")),
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# ---------------------------------------------------------------- redis / channels / queue
REDIS_URL = ENV.get("REDIS_URL", "")
EMBEDDED = not REDIS_URL
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "inference.channel_layer.RedisChannelLayer",  # channels_redis, send in one round trip
            # redis-py's 5 s default socket timeout would race channels_redis's 5 s blocking pop.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 30}], "capacity": 10000, "expiry": 60},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": 10000}}}

# ---------------------------------------------------------------- celery
CELERY_BROKER_URL = ENV.get("CELERY_BROKER_URL", REDIS_URL or "memory://")
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = EMBEDDED
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TIMEZONE = "UTC"

# ---------------------------------------------------------------- inference
# Engine thread inside the web process (embedded mode); off for web replicas
# that front separate `run_worker` processes.
EMBEDDED_WORKER = env_bool("EMBEDDED_WORKER", EMBEDDED)
ENGINE_DEVICE = ENV.get("ENGINE_DEVICE", "cpu")
DEFAULT_MODEL = ENV.get("DEFAULT_MODEL", "smollm2-135m-instruct")
# The models the embedded engines of this process serve, comma-separated (`make run SERVE_MODELS=a,b`): one
# engine thread per model, started by its first request; empty: DEFAULT_MODEL alone. Separate workers serve
# what each `run_worker --model NAME` was started with.
SERVE_MODELS = env_list("SERVE_MODELS", "")
# A request for an enabled model no live worker serves waits this long for one (starting) before its 503.
MODEL_WAIT_S = float(ENV.get("MODEL_WAIT_S", "3"))
# Engine and kernel knobs, applied by inference.worker.engine_factory. Unset (None) keeps the engine's
# or the kernels' own default (inference.engine.EngineConfig and cpu_matmul, kernels.config), so each
# default is written once, where offline users (tests, benchmarks) get it too.
ENGINE_DTYPE = env_opt("ENGINE_DTYPE")
ENGINE_KV_CACHE_MB = env_opt("ENGINE_KV_CACHE_MB", int)
# Unset ENGINE_KV_CACHE_MB: the KV cache is sized from the memory free at start (inference.engine.kv_sizing),
# ENGINE_KV_CACHE_FRACTION of it (0.5 on the CPU, 0.9 on CUDA) split among the ENGINE_WORKERS_PER_DEVICE
# workers sharing the device (the host's RAM for cpu, one GPU for cuda:N); ENGINE_FREE_MEMORY_MB replaces
# the figure read from the device (a pinned size, or tests).
ENGINE_KV_CACHE_FRACTION = env_opt("ENGINE_KV_CACHE_FRACTION", float)
ENGINE_WORKERS_PER_DEVICE, ENGINE_FREE_MEMORY_MB = env_opt("ENGINE_WORKERS_PER_DEVICE", int), env_opt("ENGINE_FREE_MEMORY_MB", int)
ENGINE_MAX_NUM_SEQS = env_opt("ENGINE_MAX_NUM_SEQS", int)
ENGINE_CPU_UPCAST_MATMUL, ENGINE_CPU_PREPACK = env_opt("ENGINE_CPU_UPCAST_MATMUL"), env_flag("ENGINE_CPU_PREPACK")  # auto|0|1
# speculative decoding (inference.engine.ngram_proposer): off or ngram, and the drafts per step
ENGINE_SPECULATIVE, ENGINE_NUM_SPECULATIVE_TOKENS = env_opt("ENGINE_SPECULATIVE"), env_opt("ENGINE_NUM_SPECULATIVE_TOKENS", int)
KERNELS_BACKEND = env_opt("KERNELS_BACKEND")  # auto, ref, cpu, triton
KERNELS_CPU_NATIVE = env_flag("KERNELS_CPU_NATIVE")
KERNELS_CACHE_DIR = env_opt("KERNELS_CACHE_DIR")
KERNELS_CC = env_opt("CC")  # the native CPU kernels' compiler, read from $CC as build tools do
KERNELS_TUNE_MALLOC = env_flag("KERNELS_TUNE_MALLOC")
# Queue (inference.queue): keys live under QUEUE_KEY_PREFIX in Redis; a (model, tier) queue holding QUEUE_MAX_DEPTH
# jobs refuses more (0 = unbounded). A worker whose heartbeat is older than WORKER_HEARTBEAT_TIMEOUT_S is dead.
QUEUE_KEY_PREFIX = ENV.get("QUEUE_KEY_PREFIX", "llmq")
QUEUE_MAX_DEPTH = int(ENV.get("QUEUE_MAX_DEPTH", "10000"))
WORKER_HEARTBEAT_TIMEOUT_S = float(ENV.get("WORKER_HEARTBEAT_TIMEOUT_S", "10"))
# Prefix-aware routing between a model's workers (inference.queue.routing; README's table): prefix|off.
QUEUE_ROUTING, QUEUE_ROUTING_STEAL_S = ENV.get("QUEUE_ROUTING", "prefix"), float(ENV.get("QUEUE_ROUTING_STEAL_S", "0.25"))
QUEUE_ROUTING_SCAN, QUEUE_ROUTING_BALANCE = int(ENV.get("QUEUE_ROUTING_SCAN", "32")), int(ENV.get("QUEUE_ROUTING_BALANCE", "2"))
QUEUE_ROUTING_KEYS_PER_WORKER, ROUTING_BLOCK_TOKENS = int(ENV.get("QUEUE_ROUTING_KEYS_PER_WORKER", "4096")), int(ENV.get("ROUTING_BLOCK_TOKENS", "16"))
# Each process keeps its finished requests' usage records in a SQLite file here (fsynced) until they are
# written to PostgreSQL and their reservations settled (inference.worker.spool); a restarted worker
# writes what a dead one left. Production: a persistent local folder, one per host.
WORKER_SPOOL_DIR = ENV.get("WORKER_SPOOL_DIR", "") or (
    str(Path(tempfile.gettempdir()) / f"llm-spool-test-{os.getpid()}") if TESTING
    else str(BASE_DIR / "var" / "spool"))
# Reply channels' liveness: a web process refreshes a Redis key per reply channel every REPLY_ALIVE_INTERVAL_S; a
# worker cancels the jobs of a channel whose key is gone (its web process died) after REPLY_ALIVE_TIMEOUT_S.
REPLY_ALIVE_INTERVAL_S = float(ENV.get("REPLY_ALIVE_INTERVAL_S", "1"))
REPLY_ALIVE_TIMEOUT_S = float(ENV.get("REPLY_ALIVE_TIMEOUT_S", "3"))
# `manage.py bootstrap`: the admin user it creates (ADMIN_PASSWORD unset: generated, printed once) and the base URL.
BOOTSTRAP_ADMIN_USERNAME = ENV.get("ADMIN_USERNAME", "admin")
BOOTSTRAP_ADMIN_PASSWORD = ENV.get("ADMIN_PASSWORD") or None
BASE_URL = ENV.get("BASE_URL", "http://127.0.0.1:8000")
# API streams (SSE): a `: keep-alive` comment after this many idle seconds.
SSE_KEEPALIVE_S = float(ENV.get("SSE_KEEPALIVE_S", "15"))
# A request body not wholly received this many seconds after the request began (a slow client, or one
# that sent less than its Content-Length) is answered 408 and its connection closed (common.request_body).
REQUEST_BODY_TIMEOUT_S = float(ENV.get("REQUEST_BODY_TIMEOUT_S", "30"))
# WebSocket /v1/realtime: an Origin header (browsers send one) must match one of these host patterns
# (Channels' OriginValidator syntax: "example.com", ".example.com", "https://example.com:8443", "*").
# A socket without Origin (the SDKs, curl) is let through: it still needs an API key.
WEBSOCKET_ALLOWED_ORIGINS = env_list("WEBSOCKET_ALLOWED_ORIGINS", ",".join(ALLOWED_HOSTS))
CELERY_BEAT_SCHEDULE = {
    "reap-dead-workers": {"task": "inference.tasks.reap_dead_workers", "schedule": 5.0, "options": {"expires": 5.0}},
    # idempotent: a missed or doubled run changes nothing the next one would not
    "rollup-hourly-usage": {"task": "billing.tasks.rollup_hourly_usage", "schedule": 300.0,
                            "options": {"expires": 300.0}},
    "close-invoices": {"task": "billing.tasks.close_invoices", "schedule": 900.0, "options": {"expires": 900.0}},
    "release-stale-reservations": {"task": "billing.tasks.release_stale_reservations", "schedule": 60.0,
                                   "options": {"expires": 60.0}},
    # batches whose validation task was lost (batches.services.validation); batches past their window
    "validate-pending-batches": {"task": "batches.tasks.validate_pending", "schedule": 60.0,
                                 "options": {"expires": 60.0}},
    "expire-batches": {"task": "batches.tasks.expire_batches", "schedule": 60.0, "options": {"expires": 60.0}},
}

# Prometheus metrics (inference.metrics). PROMETHEUS_MULTIPROC_DIR: a directory (emptied before the web
# processes start) where every uvicorn worker writes its metrics, so that /metrics sums them all. The client
# library reads it from the process environment itself when it is imported, so a .env cannot set it: it is
# read here from os.environ alone. METRICS_TOKEN: when set, /metrics asks for `Authorization: Bearer <it>`.
METRICS_MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
METRICS_TOKEN = ENV.get("METRICS_TOKEN", "")

# ---------------------------------------------------------------- billing
# Seconds a process keeps its snapshot of prices and tier multipliers; a new
# price version starts no sooner than this after it is added (billing.services.price_cache).
PRICE_CACHE_TTL_S = float(ENV.get("PRICE_CACHE_TTL_S", "10"))
# E-mail (budget alerts): the console in development; set EMAIL_BACKEND and EMAIL_HOST etc. in production.
EMAIL_BACKEND = ENV.get("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = ENV.get("EMAIL_HOST", "localhost")
EMAIL_PORT = int(ENV.get("EMAIL_PORT", "25"))
DEFAULT_FROM_EMAIL = ENV.get("DEFAULT_FROM_EMAIL", "billing@localhost")
# Admission (billing.counters): rate limits, concurrency, quotas and budgets are checked
# before a request is queued (off: nothing is checked, for A/B measurements only). Counters
# live under ADMISSION_KEY_PREFIX in Redis when REDIS_URL is set (unreachable Redis: 503
# limits_unavailable), else in this process. ADMISSION_HOLD_S is the longest a request can
# live: a slot or reservation older than that is released by the periodic sweep.
ADMISSION_ENABLED = env_bool("ADMISSION_ENABLED", True)
ADMISSION_KEY_PREFIX = ENV.get("ADMISSION_KEY_PREFIX", "lim")
ADMISSION_HOLD_S = float(ENV.get("ADMISSION_HOLD_S", "900"))
# Between admission and the queue a request's reservation (its concurrency slot above all) is held on a lease
# of this many seconds, renewed by its web process until the job is queued: a web process killed in between
# leaves nothing held for longer than this (billing.counters.base).
ADMISSION_LEASE_S = float(ENV.get("ADMISSION_LEASE_S", "5"))
# Budget alerts e-mail the tenant's owners at these percentages of the monthly budget.
BUDGET_ALERT_PERCENTS = [int(p) for p in ENV.get("BUDGET_ALERT_PERCENTS", "50,80,100").split(",") if p.strip()]
# Hours after a period ends before its invoices are finalized (late usage records still land in them).
INVOICE_GRACE_HOURS = float(ENV.get("INVOICE_GRACE_HOURS", "1"))

# ---------------------------------------------------------------- files and batches (the Batch API: batches app)
# Files (`/v1/files`) live in FILE_STORAGE, a Django storage backend, one folder per tenant: by default a local
# directory, FILE_STORAGE_DIR (var/files; a temporary one under pytest); production may name any storage class
# with its options as JSON, e.g. S3 through django-storages (deploy/env.example). Several web replicas need a
# shared storage (S3, or one network folder): a file written by one is read by another.
FILE_STORAGE_BACKEND = ENV.get("FILE_STORAGE_BACKEND", "django.core.files.storage.FileSystemStorage")
FILE_STORAGE_OPTIONS = json.loads(ENV.get("FILE_STORAGE_OPTIONS", "") or "{}")
if FILE_STORAGE_BACKEND == "django.core.files.storage.FileSystemStorage":
    FILE_STORAGE_OPTIONS.setdefault("location", ENV.get("FILE_STORAGE_DIR", "") or (
        str(Path(tempfile.gettempdir()) / f"llm-files-test-{os.getpid()}") if TESTING else str(BASE_DIR / "var" / "files")))
FILE_STORAGE = {"BACKEND": FILE_STORAGE_BACKEND, "OPTIONS": FILE_STORAGE_OPTIONS}
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "files": FILE_STORAGE,  # django.core.files.storage.storages["files"]
}
# An upload's size limit (OpenAI: 200 MB) and a batch's requests (OpenAI's 50,000); POST /v1/files alone may
# pass DATA_UPLOAD_MAX_MEMORY_SIZE, up to FILES_MAX_BYTES and the form's own bytes (platform_site/asgi.py).
FILES_MAX_BYTES = int(ENV.get("FILES_MAX_BYTES", str(50 * 1024 * 1024)))
BATCH_MAX_LINES = int(ENV.get("BATCH_MAX_LINES", "50000"))
# The batch runner (batches.runner; README "Batch API"): `manage.py run_batches`, or in the embedded mode a task
# on the web's event loop; BATCH_ENGINE_PRIORITY is below every tier's (theirs stop at 32767).
BATCH_RUNNER_EMBEDDED = env_bool("BATCH_RUNNER_EMBEDDED", EMBEDDED_WORKER)
BATCH_MAX_IN_FLIGHT, BATCH_ENGINE_PRIORITY = int(ENV.get("BATCH_MAX_IN_FLIGHT", "4")), int(ENV.get("BATCH_ENGINE_PRIORITY", "40000"))
BATCH_LEASE_S, BATCH_POLL_S = float(ENV.get("BATCH_LEASE_S", "120")), float(ENV.get("BATCH_POLL_S", "1.0"))
BATCH_LINE_ATTEMPTS = int(ENV.get("BATCH_LINE_ATTEMPTS", "3"))  # tries of a line the server failed (a 500)

# ---------------------------------------------------------------- auth / i18n / static
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/dashboard/"
LOGOUT_REDIRECT_URL = "/accounts/login/"
# Login throttling (django-axes): after AXES_FAILURE_LIMIT failed logins of one username from one
# address, that pair is refused (429) for AXES_COOLOFF_MINUTES; a success resets its count. An address
# that failed to log in as AXES_USERNAMES_PER_ADDRESS distinct usernames within that time is refused
# for every username (password spraying; common.login_throttle); 0: no such limit.
AXES_ENABLED = env_bool("AXES_ENABLED", True)
AXES_FAILURE_LIMIT = int(ENV.get("AXES_FAILURE_LIMIT", "5"))
AXES_COOLOFF_TIME = timedelta(minutes=float(ENV.get("AXES_COOLOFF_MINUTES", "15")))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_HANDLER = "common.login_throttle.LoginThrottleHandler"
AXES_USERNAMES_PER_ADDRESS = int(ENV.get("AXES_USERNAMES_PER_ADDRESS", "10"))
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False

# OpenAPI document of /v1, served at /v1/openapi.json (inference.api.openapi adds the completion endpoints).
SPECTACULAR_SETTINGS = {
    "TITLE": "LLM platform API",
    "DESCRIPTION": "OpenAI-compatible inference, API keys, usage, costs and invoices.",
    "VERSION": "1.0.0",
    "OAS_VERSION": "3.1.0",
    "SERVE_INCLUDE_SCHEMA": True,
    "SCHEMA_PATH_PREFIX": "/v1",
    "PREPROCESSING_HOOKS": ["inference.api.openapi.only_v1_endpoints"],
    "POSTPROCESSING_HOOKS": ["inference.api.openapi.document_complete", "batches.openapi.components_add"],
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_GENERATE_CHOICE_DESCRIPTION": False,
    # the id converters of common.converters: a public id is a string, a row id an integer
    "PATH_CONVERTER_OVERRIDES": {"public_id": str, "row_id": int},
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["tenants.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["tenants.auth.HasTenant"],
    "EXCEPTION_HANDLER": "common.errors.openai_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # DRF's JSON parser with a nesting limit (a 400, not a RecursionError's 500), as the completion views parse
    "DEFAULT_PARSER_CLASSES": ["common.json_parser.JsonBodyParser"],
    "UNAUTHENTICATED_USER": None,
}

# ---------------------------------------------------------------- security (production)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
if not DEBUG:
    # TLS normally ends at the proxy (deploy/nginx.conf); production sets this to 1.
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = int(ENV.get("SECURE_HSTS_SECONDS", "31536000"))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_CONTENT_TYPE_NOSNIFF = True
    X_FRAME_OPTIONS = "DENY"

# Every line goes through one handler whose filter masks API keys and the secrets above
# (common.log_redaction), uvicorn's own loggers (its access log has the request line) included.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"redact_secrets": {"()": "common.log_redaction.RedactSecrets"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["redact_secrets"]}},
    "root": {"handlers": ["console"], "level": ENV.get("LOG_LEVEL", "INFO")},
    "loggers": {
        "django": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "django.server": {"handlers": ["console"], "level": "WARNING", "propagate": False},
        "uvicorn.error": {"handlers": ["console"], "propagate": False},
        "uvicorn.access": {"handlers": ["console"], "propagate": False},
    },
}
