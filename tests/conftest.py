"""Shared fixtures: tiers, tenants, API keys, the served-model row, an API client.

Keep this small; area-specific fixtures belong in tests/<area>/conftest.py.
Models are imported inside fixtures so suites that do not use Django (engine,
kernels) do not pay for it.
"""

import itertools
import os

import pytest

# Without a GPU, the Triton kernels are tested through Triton's interpreter,
# which has to be on before triton is first imported (kernels import it).
if not (os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0")):
    os.environ.setdefault("TRITON_INTERPRET", "1")

_seq = itertools.count(1)


@pytest.fixture
def kernel_config():
    """kernels.dispatch.configure for one test (call it with the fields to change, as a server's
    settings would); the configuration in force before the test comes back after it."""
    from kernels.dispatch import configure

    previous = configure()
    yield configure
    configure(previous)


@pytest.fixture
def cpu_matmul_config():
    """inference.engine.cpu_matmul.configure for one test; the previous upcast and prepack come back after it."""
    from inference.engine import cpu_matmul

    upcast, prepack = cpu_matmul.configure()
    yield cpu_matmul.configure
    cpu_matmul.configure(upcast=upcast, prepack=prepack)


@pytest.fixture
def tier_factory(db):
    from tenants.models import Tier

    def make(name: str | None = None, **fields):
        fields.setdefault("allowed_models", ["*"])
        return Tier.objects.create(name=name or f"tier-{next(_seq)}", **fields)

    return make


BUDGET_FIELDS = ("monthly_spend_limit_micros", "owner_spend_limit_micros", "budget_alert_percents")


@pytest.fixture
def tenant_factory(db, tier_factory):
    from tenants.models import Tenant

    def make(slug: str | None = None, tier=None, **fields):
        """A tenant; its budget fields (billing.models.TenantBudget's) make its budget row when given."""
        from billing.models import TenantBudget

        slug = slug or f"tenant-{next(_seq)}"
        budget = {name: fields.pop(name) for name in BUDGET_FIELDS if name in fields}
        tenant = Tenant.objects.create(slug=slug, name=fields.pop("name", slug), tier=tier or tier_factory(), **fields)
        if budget:
            TenantBudget.objects.create(tenant=tenant, **budget)
        return tenant

    return make


@pytest.fixture
def api_key_factory(db, tenant_factory):
    """make(tenant=None, name="test", scopes=None, expires_at=None) -> NewApiKey (.api_key, .key plaintext)."""
    from tenants.services.api_keys import api_key_create

    def make(tenant=None, name: str = "test", **fields):
        return api_key_create(tenant=tenant or tenant_factory(), name=name, **fields)

    return make


@pytest.fixture
def tier(tier_factory):
    return tier_factory()


@pytest.fixture
def tenant(tenant_factory, tier):
    return tenant_factory(tier=tier)


@pytest.fixture
def api_key(api_key_factory, tenant):
    """A NewApiKey with all scopes for `tenant`; `.key` is the plaintext."""
    return api_key_factory(tenant=tenant)


@pytest.fixture
def served_model(db):
    """The SmolLM2 ServedModel row, as `manage.py bootstrap` creates it."""
    from inference.bootstrap import served_model_ensure

    return served_model_ensure()[0]


@pytest.fixture
def api_client():
    from rest_framework.test import APIClient

    return APIClient()


def bearer(key: str) -> dict:
    """Request kwargs for Django/DRF test clients: client.get(url, **bearer(key))."""
    return {"HTTP_AUTHORIZATION": f"Bearer {key}"}


def _django_settings(request):
    """pytest-django's `settings` fixture, or None where pytest-django is absent (a GPU machine that has torch and
    triton but not the web stack runs the engine and kernel suites: Django's autouse fixtures then do nothing)."""
    if not request.config.pluginmanager.hasplugin("django"):
        return None
    return request.getfixturevalue("settings")


@pytest.fixture(autouse=True)
def _api_key_cache_not_kept_warm(request):
    """No keep-warm task outliving a test's event loop (tests/tenants/test_api_key_cache.py turns it on;
    the end-to-end servers run it as deployed)."""
    settings = _django_settings(request)
    if settings is not None:
        settings.API_KEY_CACHE_KEEP_WARM_S = 0


@pytest.fixture(autouse=True)
def _api_key_cache_empty():
    """Each test starts with an empty verified-key cache (tenants.services.api_key_cache), if loaded."""
    import sys

    cache = sys.modules.get("tenants.services.api_key_cache")
    if cache is not None:
        cache.api_key_cache_clear()
    alerts = sys.modules.get("billing.selectors.alerts")  # the same for the budget alert thresholds: a
    if alerts is not None:  # rolled-back test's tenant id is the next test's, with other thresholds
        alerts.alert_percents_forget()
    yield


@pytest.fixture(autouse=True, scope="session")
def _sqlite_readers_take_no_table_locks(request):
    """The in-memory SQLite test database is one shared cache for every thread's connection, where a reader's
    table lock makes a writer fail at once ("database table is locked": no busy wait, unlike a file database
    with its 30 s timeout): a test reading the ledger while the worker's finisher inserts would push the record
    to the spool's later retry. Readers in read-uncommitted mode take no table locks (SQLite's shared-cache
    documentation); each insert here is one autocommitted statement, so nothing half-done is ever read."""
    if not request.config.pluginmanager.hasplugin("django"):
        yield
        return
    from django.db import connections
    from django.db.backends.signals import connection_created

    def read_uncommitted(connection, **_):
        if connection.vendor == "sqlite" and connection.is_in_memory_db():
            connection.connection.execute("PRAGMA read_uncommitted = 1")

    connection_created.connect(read_uncommitted, dispatch_uid="tests:sqlite_read_uncommitted")
    for connection in connections.all(initialized_only=True):
        if connection.connection is not None:
            read_uncommitted(connection)
    yield
    connection_created.disconnect(dispatch_uid="tests:sqlite_read_uncommitted")


@pytest.fixture(autouse=True)
def _worker_spool_closed():
    """A test that wrote usage records through the worker's spool (inference.worker.spool) leaves no spool
    behind: its flusher thread would retry the test's records on a connection of its own (outside the test's
    transaction) and, pricing them, cache a price snapshot that lacks the next test's uncommitted prices."""
    yield
    import shutil
    import sys

    spool = sys.modules.get("inference.worker.spool")
    if spool is not None and spool._spool is not None:
        directory = spool._spool.directory
        spool.spool_close(flush_timeout=0)
        if directory.name.startswith("llm-spool-test-"):  # the test settings' own folder: its records are the test's
            shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(autouse=True)
def _admission_counters_fresh(request):
    """Each test counts its limits afresh (billing.counters): its own key prefix, emptied after.

    Without pytest-django there are no counters to reset (see _django_settings)."""
    settings = _django_settings(request)
    if settings is None:
        yield
        return
    import uuid

    from billing import counters

    settings.ADMISSION_KEY_PREFIX = f"lim-test:{uuid.uuid4().hex}"
    counters.reset_admission_backend()
    yield
    backend = counters._backend
    if backend is not None:
        try:
            backend.flush()
        except Exception:  # noqa: BLE001 - a test that stopped Redis on purpose
            pass
    counters.reset_admission_backend()


@pytest.fixture(autouse=True, scope="module")
def _embedded_workers_stopped():
    """No embedded engine thread outlives its test module: one left running keeps the job queue it was built
    with, so a later module that resets the queue would enqueue where no engine looks (and wait for ever)."""
    yield
    import sys

    embedded = sys.modules.get("inference.worker.embedded")
    if embedded is not None and embedded._workers:
        embedded.embedded_worker_stop()
