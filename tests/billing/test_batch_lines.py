"""A batch line's ending (billing.services.batch_lines.batch_line_bill): priced once at the batch price, recorded
once by the one settlement path (idempotent on the line's request id), its reservation settled at that cost."""

from datetime import timedelta

import pytest

from billing.counters.units import cost_femtos_to_nanos
from billing.models import UsageRecord
from billing.services.admission_settle import record_actual
from billing.services.batch_lines import batch_line_bill
from billing.services.settlement import Ending, endings_write
from tests.billing.conftest import T0


@pytest.fixture
def priced(price_factory):
    return price_factory(model="m", input="2", cached="1", output="8")


def line(tenant, n=1, **overrides):
    fields = dict(request_id=f"batch_abc-{n}", batch_id="batch_abc", tenant_id=tenant.pk, api_key_id=None, model="m",
                  tier=tenant.tier.name, endpoint="chat.completions", prompt_tokens=1000, cached_tokens=200,
                  completion_tokens=50, finish_reason="stop", admitted_at=T0 + timedelta(hours=1),
                  created_at=T0 + timedelta(hours=2))
    fields.update(overrides)
    return fields


@pytest.mark.django_db
def test_a_line_is_recorded_once_at_the_batch_price(tenant, priced, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as settled:
        ending = batch_line_bill(**line(tenant))
    assert len(settled) == 1  # its reservation is settled once the record commits
    record = UsageRecord.objects.get(request_id="batch_abc-1")
    assert record.batch_id == "batch_abc" and record.price_id == priced.pk
    assert record.cost_femtos == ending.cost.total == 1_100_000_000_000  # half of (800x2 + 200x1 + 50x8) USD per 1M
    assert record.created_at == T0 + timedelta(hours=2)
    # a runner killed after the write runs the line again: the first record stands, nothing is billed twice
    again = batch_line_bill(**line(tenant, prompt_tokens=5000, completion_tokens=900))
    assert UsageRecord.objects.filter(request_id="batch_abc-1").count() == 1
    assert UsageRecord.objects.get(request_id="batch_abc-1").prompt_tokens == 1000
    assert again.request_id == ending.request_id
    assert UsageRecord.objects.count() == 1


@pytest.mark.django_db
def test_the_request_id_must_be_the_lines_own(tenant, priced):
    for request_id, batch_id in (("req-1", "batch_abc"), ("batch_xyz-1", "batch_abc"), ("batch_abc-1", "")):
        with pytest.raises(ValueError, match="batch id"):
            batch_line_bill(**line(tenant, request_id=request_id, batch_id=batch_id))
    with pytest.raises(ValueError, match="public id"):
        batch_line_bill(**line(tenant, request_id="b" * 41 + "-1", batch_id="b" * 41))
    assert not UsageRecord.objects.exists()


@pytest.mark.django_db
def test_the_spooled_ending_keeps_its_batch_and_its_price(tenant, priced):
    """An ending that went through the worker's spool (JSON) is the same batch line, priced the same; one
    spooled before it was priced is priced at the batch price when written."""
    ending = batch_line_bill(**line(tenant, n=1))
    copy = Ending.from_json(ending.to_json())
    assert copy == ending and copy.batch_id == "batch_abc"
    unpriced = Ending(**{k: v for k, v in ending.to_json().items() if k != "priced"})
    unpriced = Ending.from_json({**unpriced.to_json(), "request_id": "batch_abc-2", "priced": None})
    (written,) = endings_write([unpriced])
    assert written.cost == ending.cost
    assert UsageRecord.objects.get(request_id="batch_abc-2").cost_femtos == ending.cost.total


@pytest.mark.django_db
def test_the_reservation_settles_to_the_batch_cost(tenant, priced):
    ending = batch_line_bill(**line(tenant))
    record = {k: v for k, v in ending.record_fields().items() if k != "costing"}
    assert record_actual(record).spend == cost_femtos_to_nanos(ending.cost.total)  # priced again: the batch price
    assert record_actual(ending.record_fields()).spend == cost_femtos_to_nanos(ending.cost.total)
    live = {**record, "batch_id": ""}
    assert record_actual(live).spend == 2 * cost_femtos_to_nanos(ending.cost.total)


@pytest.mark.django_db
def test_a_failed_line_that_generated_nothing_costs_nothing(tenant, priced):
    ending = batch_line_bill(**line(tenant, finish_reason="error", completion_tokens=0, error="boom"))
    assert ending.cost.total == 0
    assert UsageRecord.objects.get(request_id="batch_abc-1").cost_femtos == 0
