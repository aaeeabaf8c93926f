"""Zero overshoot across processes: 50 concurrent admissions from 4 processes against one real Redis.

The plans are the service's own (`plan_build`): a limit of 10 requests per minute admits exactly 10,
and a budget that holds exactly 10 worst-case requests admits 10 and ends exactly at its limit.
Each process has its own Redis client, as each web process has.
"""

from __future__ import annotations

import multiprocessing
import uuid
from datetime import datetime, timezone

from billing.counters.redis_backend import RedisAdmission
from billing.periods import month_containing
from billing.services.admission_plan import plan_build
from billing.counters.units import budget_micros_to_nanos
from tenants.services.limits import LimitScope, ScopeLimits
from tests.billing.admission_helpers import REDIS_TEST_URL, require_redis

PROCESSES, REQUESTS = 4, 50


def _admit_many(prefix: str, plans: list, barrier, results) -> None:
    backend = RedisAdmission(url=REDIS_TEST_URL, prefix=prefix)
    barrier.wait()
    results.put([backend.admit(plan).admitted for plan in plans])


def _run(limits: ScopeLimits, *, spend_nanos: int | None, seed: int | None) -> tuple[int, RedisAdmission, list]:
    require_redis()
    backend = RedisAdmission(url=REDIS_TEST_URL, prefix=f"test:{uuid.uuid4().hex}")
    period = month_containing(instant=datetime.now(timezone.utc), tz="UTC")
    plans = [plan_build(backend=backend, request_id=uuid.uuid4().hex, scopes=[limits], prompt_tokens=100,
                        max_tokens=100, period=period, spend_nanos=spend_nanos) for _ in range(REQUESTS)]
    if seed is not None:
        for counter in plans[0].counters:
            backend.counter_seed(counter.key, seed, 3600)
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(PROCESSES), context.Queue()
    workers = [context.Process(target=_admit_many, args=(backend.prefix, plans[i::PROCESSES], barrier, results))
               for i in range(PROCESSES)]
    for worker in workers:
        worker.start()
    admitted = sum(sum(results.get(timeout=60)) for _ in workers)
    for worker in workers:
        worker.join(10)
    return admitted, backend, plans


def test_ten_requests_per_minute_admit_exactly_ten_of_fifty():
    admitted, backend, _ = _run(ScopeLimits(scope=LimitScope.tenant(1), requests_per_minute=10), spend_nanos=None, seed=None)
    try:
        assert admitted == 10
    finally:
        backend.flush()


def test_a_budget_for_ten_worst_cases_admits_ten_and_never_exceeds_its_limit():
    worst = 123_456  # nano-dollars per request
    limits = ScopeLimits(scope=LimitScope.tenant(1), monthly_spend_limit_micros=worst * 10 // 1000 + 1)  # room for 10, not 11
    admitted, backend, plans = _run(limits, spend_nanos=worst, seed=0)
    try:
        assert admitted == 10
        spent = backend.counter_get(plans[0].counters[0].key)
        assert spent == 10 * worst <= budget_micros_to_nanos(limits.monthly_spend_limit_micros)
    finally:
        backend.flush()
