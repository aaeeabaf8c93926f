"""Billing figures are the same through the one ending path (an `Ending` priced once where the request ends,
through the worker's spool, written by billing's settlement service) as through the records the worker wrote
before it (the usage-record fields, priced by the insert from the fields): a recorded workload
(tests/billing/fixtures/recorded_endings.json: charged and uncharged endings, cached tokens above the prompt,
two price versions, a tier multiplier, an unpriced model, a row an older worker left in its spool) is replayed
through both, and every record must match field for field, cost included; so must what admission settles."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from tests.billing.conftest import T0

FIXTURE = Path(__file__).parent / "fixtures" / "recorded_endings.json"
COMPARED_OUT = {"id", "request_id"}


def _workload(tenants: dict) -> list[dict]:
    """The recorded endings as the worker's record fields (times in unix seconds, as the worker has them)."""
    rows = []
    for entry in json.loads(FIXTURE.read_text())["endings"]:
        fields = dict(entry["fields"])
        tenant = tenants[fields.pop("tenant")]
        admitted = (T0 + timedelta(hours=fields.pop("admitted_hours"))).timestamp()
        fields.update(tenant_id=tenant.pk, api_key_id=None, tier=tenant.tier.name, admitted_at=admitted,
                      created_at=admitted + fields["duration_s"])
        rows.append({"name": entry["name"], "fields": fields, "old_spool_row": entry.get("old_spool_row", False),
                     "cost_femtos": entry["cost_femtos"]})
    return rows


@pytest.fixture
def recorded(price_factory, tier_factory, tenant_factory):
    price_factory(model="m", input="1", cached="0.5", output="2", effective_from=T0)
    price_factory(model="m", input="3", cached="1", output="4", effective_from=T0 + timedelta(days=10))
    tenants = {"base": tenant_factory(tier=tier_factory()),
               "premium": tenant_factory(tier=tier_factory(price_multiplier="1.5"))}
    return _workload(tenants)


def _record(request_id: str) -> dict:
    from billing.models import UsageRecord

    row = UsageRecord.objects.filter(request_id=request_id).values().get()
    return {k: v for k, v in row.items() if k not in COMPARED_OUT}


@pytest.mark.django_db
def test_the_recorded_workload_bills_the_same_through_the_one_ending_path(recorded, settings, tmp_path):
    from billing.services.admission_settle import record_actual
    from billing.services.settlement import Ending, ending_make
    from billing.services.usage import usage_records_insert
    from inference.worker.finish import endings_record

    settings.WORKER_SPOOL_DIR = str(tmp_path / "llm-spool-test-replay")
    endings = []
    for entry in recorded:
        # before: the record's fields, priced by the insert itself (as a record the spool wrote was)
        usage_records_insert([dict(entry["fields"], request_id="old-" + entry["name"])])
        # now: one Ending, priced once where the request ends, carried through the spool as JSON
        new = dict(entry["fields"], request_id="new-" + entry["name"])
        if entry["old_spool_row"]:  # an older worker's spooled row: the fields only, priced when written
            ending = Ending.from_json(new)
            assert ending.priced is None
        else:
            ending = ending_make(**new)
            assert ending.priced is not None
        endings.append(ending)
    assert endings_record(endings) is True
    for entry, ending in zip(recorded, endings):
        old, new = _record("old-" + entry["name"]), _record("new-" + entry["name"])
        assert new == old, entry["name"]
        assert new["cost_femtos"] == entry["cost_femtos"], entry["name"]  # the figure the old records hold
        if ending.priced is not None:  # the client's usage.cost is the record's
            assert ending.priced.cost.total == new["cost_femtos"]
        old_fields = dict(entry["fields"], request_id=ending.request_id)
        assert record_actual(ending.record_fields()) == record_actual(old_fields), entry["name"]


def test_an_ending_comes_back_from_its_json_unchanged_and_its_cost_exact():
    from billing.money import Cost, PriceTerms
    from billing.services.costs import Priced
    from billing.services.settlement import Ending

    ending = Ending(request_id="r", tenant_id=1, api_key_id=None, model="m", tier="t", finish_reason="stop",
                    admitted_at=1.5, created_at=2.25, prompt_tokens=3, ttft_s=None,
                    priced=Priced(PriceTerms(7, 10**16, 1, 2), 1500, Cost(input=10**40 + 1, cached_input=0, output=9)))
    assert Ending.from_json(json.loads(json.dumps(ending.to_json()))) == ending
    free = Ending(request_id="f", tenant_id=1, api_key_id=2, model="x", tier="t", finish_reason="error",
                  admitted_at=1.0, created_at=1.0, priced=Priced(None, 1000, Cost()))
    assert Ending.from_json(json.loads(json.dumps(free.to_json()))) == free
