"""A web process killed between admission and the queue frees its tenant's concurrency slot within seconds.

Real processes on Redis and PostgreSQL: `tests.e2e.admission_holder` admits
one request for a tenant limited to one concurrent request and holds it as
the web process does while it enqueues (`AdmissionLease` renewing the
pre-enqueue lease); the test checks the slot stays held while the holder lives
(for several lease lengths: the renewals work), SIGKILLs it, and measures how
long until the tenant's slot admits again: within ADMISSION_LEASE_S (here
1.5 s) plus a margin. Before the lease it stayed held for ADMISSION_HOLD_S
(900 s). The killed request's reservation is then stale, for the sweep.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid

import pytest

from billing.counters.base import Actual, Plan, Slot
from billing.counters.keys import CounterKey
from tenants.services.limits import LimitScope
from tests.e2e.processes import Proc, manage, postgres_database_reset, process_env, servers_required, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REDIS_URL = os.environ.get("ADMISSION_TEST_REDIS_URL", "redis://127.0.0.1:6379/7")
DATABASE_URL = os.environ.get("LEASE_E2E_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llm_lease")
LEASE_S = 1.5


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    servers_required(database_url=DATABASE_URL, redis_url=REDIS_URL)
    import psycopg

    from billing.counters.redis_backend import RedisAdmission

    prefix = f"lease-{uuid.uuid4().hex[:8]}"
    postgres_database_reset(DATABASE_URL)
    env = process_env(DATABASE_URL=DATABASE_URL, REDIS_URL=REDIS_URL, ADMISSION_KEY_PREFIX=prefix,
                      ADMISSION_LEASE_S=str(LEASE_S), LOG_LEVEL="INFO")
    manage(env, "migrate", "--noinput", "-v", "0")
    manage(env, "bootstrap", "--admin-password", "e2e-admin-password-1")
    manage(env, "create_tenant", "--slug", "leased", "--tier", "free")
    manage(env, "limits_set", "--tenant", "leased", "--max-concurrent", "1")
    with psycopg.connect(DATABASE_URL) as conn:
        tenant_id = conn.execute("SELECT id FROM tenants_tenant WHERE slug = 'leased'").fetchone()[0]
    admission = RedisAdmission(url=REDIS_URL, prefix=prefix)
    yield {"env": env, "tmp": tmp_path_factory.mktemp("lease"), "admission": admission, "tenant_id": tenant_id}
    admission.flush()


def _slot_free(stack) -> bool:
    """Whether the tenant's one slot admits a request now (given straight back when it does)."""
    admission = stack["admission"]
    request_id = uuid.uuid4().hex
    slot = Slot(admission.key(CounterKey.concurrency(LimitScope.tenant(stack['tenant_id']))), 1)
    if not admission.admit(Plan(request_id=request_id, slots=(slot,), hold_s=60)).admitted:
        return False
    admission.settle(request_id, Actual())
    return True


def test_a_killed_web_process_frees_its_slot_within_the_lease(stack):
    holder = Proc("holder", [sys.executable, "-m", "tests.e2e.admission_holder", "leased"], stack["env"],
                  stack["tmp"] / "holder.log")
    try:
        held = wait_until(lambda: holder.alive and "held " in holder.log_tail(), timeout=60,
                          what=f"the holder to admit its request:\n{holder.log_tail()}")
        assert held
        request_id = holder.log_tail().split("held ", 1)[1].split()[0]
        deadline = time.monotonic() + 3 * LEASE_S
        while time.monotonic() < deadline:  # three leases long: renewed all along
            assert not _slot_free(stack), "the slot of a live web process's request was given away"
            time.sleep(0.2)
        holder.signal(signal.SIGKILL)
        killed = time.monotonic()
        holder.popen.wait(10)
        wait_until(lambda: _slot_free(stack), timeout=30, interval=0.05, what="the slot to be free")
        freed_after = time.monotonic() - killed
        assert freed_after < LEASE_S + 1.0, f"freed {freed_after:.2f} s after the kill"
        assert request_id in stack["admission"].stale_reservations()  # the sweep gives the rest back
    finally:
        holder.stop()
