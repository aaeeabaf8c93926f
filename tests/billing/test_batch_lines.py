"""A batch line's ending, as the worker makes it (inference.worker.finish.job_ending for a Job whose `batch_id`
is set by the batch runner): priced once at the batch price, recorded once by the one settlement path
(idempotent on the line's request id), its reservation settled at that cost."""

from datetime import timedelta

import pytest

from billing.counters.units import cost_femtos_to_nanos
from billing.models import UsageRecord
from billing.services.admission_settle import record_actual
from billing.services.settlement import Ending, endings_write
from inference.worker.finish import job_ending
from tests.billing.conftest import T0
from tests.inference.queue_helpers import make_job


@pytest.fixture
def priced(price_factory):
    return price_factory(model="m", input="2", cached="1", output="8")


def line_ending(tenant, n=1, *, prompt_tokens=1000, cached_tokens=200, completion_tokens=50, finish_reason="stop",
                error=None) -> Ending:
    """The ending the worker makes for line `n` of batch `batch_abc` (its request id is the line's)."""
    job = make_job(tier=tenant.tier.name, tenant_id=tenant.pk, model="m", request_id=f"batch_abc-{n}",
                   batch_id="batch_abc", enqueued_at=(T0 + timedelta(hours=1)).timestamp())
    ending, _done = job_ending(job=job, worker_id="w", finish_reason=finish_reason, prompt_tokens=prompt_tokens,
                               cached_tokens=cached_tokens, completion_tokens=completion_tokens, error=error,
                               now=(T0 + timedelta(hours=2)).timestamp())
    return ending


@pytest.mark.django_db
def test_a_line_is_recorded_once_at_the_batch_price(tenant, priced):
    (ending,) = endings_write([line_ending(tenant)])
    record = UsageRecord.objects.get(request_id="batch_abc-1")
    assert record.batch_id == "batch_abc" and record.price_id == priced.pk
    assert record.cost_femtos == ending.cost.total == 1_100_000_000_000  # half of (800x2 + 200x1 + 50x8) USD per 1M
    assert record.created_at == T0 + timedelta(hours=2)
    # a line run again (its runner killed after the write): the first record stands, nothing is billed twice
    endings_write([line_ending(tenant, prompt_tokens=5000, completion_tokens=900)])
    assert UsageRecord.objects.filter(request_id="batch_abc-1").count() == 1
    assert UsageRecord.objects.get(request_id="batch_abc-1").prompt_tokens == 1000
    assert UsageRecord.objects.count() == 1


@pytest.mark.django_db
def test_the_spooled_ending_keeps_its_batch_and_its_price(tenant, priced):
    """An ending that went through the worker's spool (JSON) is the same batch line, priced the same; one
    spooled before it was priced is priced at the batch price when written."""
    ending = line_ending(tenant, n=1)
    copy = Ending.from_json(ending.to_json())
    assert copy == ending and copy.batch_id == "batch_abc"
    unpriced = Ending.from_json({**ending.to_json(), "request_id": "batch_abc-2", "priced": None})
    (written,) = endings_write([unpriced])
    assert written.cost == ending.cost
    assert UsageRecord.objects.get(request_id="batch_abc-2").cost_femtos == ending.cost.total


@pytest.mark.django_db
def test_the_reservation_settles_to_the_batch_cost(tenant, priced):
    ending = line_ending(tenant)
    record = {k: v for k, v in ending.record_fields().items() if k != "costing"}
    assert record_actual(record).spend == cost_femtos_to_nanos(ending.cost.total)  # priced again: the batch price
    assert record_actual(ending.record_fields()).spend == cost_femtos_to_nanos(ending.cost.total)
    live = {**record, "batch_id": ""}
    assert record_actual(live).spend == 2 * cost_femtos_to_nanos(ending.cost.total)


@pytest.mark.django_db
def test_a_failed_line_that_generated_nothing_costs_nothing(tenant, priced):
    (ending,) = endings_write([line_ending(tenant, finish_reason="error", completion_tokens=0, error="boom")])
    assert ending.cost.total == 0
    assert UsageRecord.objects.get(request_id="batch_abc-1").cost_femtos == 0


@pytest.mark.django_db
def test_admission_reserves_a_line_at_the_batch_price(tenant, priced):
    """A batch line's worst case is reserved at the batch price it is billed at, not the list price: a budget
    covers as many lines as it can pay for (half the list price by default)."""
    from billing.services.admission_plan import worst_case_nanos
    from billing.services.price_cache import pricing_snapshot_load

    snapshot = pricing_snapshot_load()
    args = dict(model="m", tier=tenant.tier.name, prompt_tokens=1000, max_tokens=100, snapshot=snapshot)
    live, line = worst_case_nanos(**args), worst_case_nanos(**args, batch=True)
    assert live == 2_800_000  # 1000 x 2 + 100 x 8 USD per 1M tokens, in nano-dollars
    assert line == 1_400_000
