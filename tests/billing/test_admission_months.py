"""Counters and invoices put a request in the same month: the month its usage record is dated (billing.periods).

A request admitted at 23:59:59.9 on the last day of January (the tenant's
zone) and finished after midnight is on February's invoice (its record's
`created_at`). Its quota and budget were reserved on January's counters;
when it settles they go back to January whole and its usage is counted in
February's, so each month's counter equals that month's ledger, the sum its
invoice is built from. Before, it stayed in January's counter while the
invoice (and any rebuild of the counters) put it in February.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
import time_machine
from asgiref.sync import async_to_sync

from billing.counters import reset_admission_backend
from billing.counters.base import QUOTA, SPEND
from billing.counters.keys import CounterKey
from billing.ledger import ledger_totals
from billing.periods import month_period
from billing.services.admission_reserve import aadmission_reserve
from billing.services.admission_settle import admission_settle_records
from billing.services.invoice_lines import usage_line_drafts
from billing.services.usage import usage_record_fields, usage_records_insert
from tenants.services.limits import LimitScope
from tests.billing.admission_helpers import make_backend, require_redis

ZONE = "America/New_York"
MODEL = "m"
admission_time: dict[str, datetime] = {}  # request id -> when it was admitted (the record's admitted_at)


@pytest.fixture(params=["memory", "redis"])
def backend(request):
    if request.param == "redis":
        require_redis()
    backend, _advance = make_backend(request.param)
    reset_admission_backend(backend)
    yield backend
    backend.flush()
    reset_admission_backend()


@pytest.fixture
def tenant(tenant_factory, tier_factory, price_factory):
    price_factory(model=MODEL, input="1", cached="0.5", output="2", effective_from=datetime(2020, 1, 1,
                                                                                           tzinfo=ZoneInfo("UTC")))
    tier = tier_factory(requests_per_minute=0, tokens_per_minute=0, max_concurrent_requests=0,
                        monthly_token_quota=1_000_000)
    return tenant_factory(tier=tier, timezone=ZONE, monthly_spend_limit_micros=50_000_000)


def _local(*args) -> datetime:
    return datetime(*args, tzinfo=ZoneInfo(ZONE))


def _admit(auth, *, prompt: int, max_tokens: int):
    admission = async_to_sync(aadmission_reserve)(auth=auth, request_id=uuid.uuid4().hex, model=MODEL,
                                                  prompt_tokens=prompt, max_tokens=max_tokens)
    assert admission.reserved
    return admission


def _finish(admission, auth, *, prompt: int, completion: int) -> None:
    """What the worker does when a request ends: its record (dated now), then its settlement."""
    record = usage_record_fields(request_id=admission.request_id, tenant_id=auth.tenant.pk, api_key_id=None,
                                 model=MODEL, tier=auth.tier.name, prompt_tokens=prompt, completion_tokens=completion,
                                 finish_reason="stop", admitted_at=admission_time[admission.request_id])
    usage_records_insert([record])
    assert admission_settle_records([record])


def _counter(backend, tenant, month: str, kind: str) -> int | None:
    return backend.counter_get(backend.key(CounterKey.period_total(LimitScope.tenant(tenant.pk), month, kind)))


@pytest.mark.parametrize("february_counter_first", [True, False], ids=["feb-counter-exists", "feb-counter-missing"])
def test_a_request_admitted_at_235959_9_that_ends_after_midnight_counts_in_februarys_counters(
        backend, tenant, february_counter_first):
    from tenants.services.api_keys import AuthContext

    auth = AuthContext(tenant=tenant, tier=tenant.tier, api_key=None)
    with time_machine.travel(_local(2026, 1, 31, 23, 59, 59, 900_000), tick=False):
        crossing = _admit(auth, prompt=100, max_tokens=50)
        admission_time[crossing.request_id] = datetime.now(ZoneInfo("UTC"))
    assert _counter(backend, tenant, "2026-01", QUOTA) == 150  # reserved in January, where it was admitted
    other = None
    if february_counter_first:
        with time_machine.travel(_local(2026, 2, 1, 0, 0, 1), tick=False):
            other = _admit(auth, prompt=10, max_tokens=10)  # February's counters are seeded from the ledger
            admission_time[other.request_id] = datetime.now(ZoneInfo("UTC"))
    with time_machine.travel(_local(2026, 2, 1, 0, 0, 3), tick=False):
        _finish(crossing, auth, prompt=100, completion=40)
        if other is not None:
            _finish(other, auth, prompt=10, completion=5)
        if not february_counter_first:  # the next admission in February seeds its counters from the ledger
            late = _admit(auth, prompt=1, max_tokens=1)
            admission_time[late.request_id] = datetime.now(ZoneInfo("UTC"))
            _finish(late, auth, prompt=1, completion=1)
    january, february = (month_period(year=2026, month=m, tz=ZONE) for m in (1, 2))
    for period in (january, february):
        ledger = ledger_totals(scope=LimitScope.tenant(tenant.pk), start=period.start, end=period.end)
        assert _counter(backend, tenant, period.label, QUOTA) == ledger[QUOTA]
        assert _counter(backend, tenant, period.label, SPEND) == ledger[SPEND]
    assert _counter(backend, tenant, "2026-01", QUOTA) == 0
    assert _counter(backend, tenant, "2026-02", QUOTA) == 140 + (15 if february_counter_first else 2)
    # the invoices agree: January's has nothing, February's bills the crossing request's tokens
    assert usage_line_drafts(tenant=tenant, start=january.start, end=january.end) == []
    february_tokens = sum(line.quantity for line in usage_line_drafts(tenant=tenant, start=february.start,
                                                                       end=february.end))
    assert february_tokens == _counter(backend, tenant, "2026-02", QUOTA)
