"""billing.models.femtos: femto-dollar columns and their sums, exact on SQLite and PostgreSQL past 64 bits.

Amounts around each edge of the SQLite representation (the nine low digits summed apart from the rest;
the nano-dollar rounding's six) and far past 2**63 are stored, compared, summed and rounded up in SQL,
and checked against Python's integers.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import Q

from billing.models import UsageRecord
from billing.models.femtos import MAX_FEMTOS, SQLITE_MAX_FEMTOS, FemtoSum

AMOUNTS = [0, 1, 999_999, 1_000_000, 1_000_001, 999_999_999, 1_000_000_000, 1_000_000_001, 123_456_789_012_345,
           2**63 - 1, 2**63, 10**20 + 7, 5 * 10**24 + 999_999_999, SQLITE_MAX_FEMTOS // 1000]


@pytest.fixture
def records(db, tenant_factory):
    tenant = tenant_factory()
    UsageRecord.objects.bulk_create([
        UsageRecord(request_id=f"f-{i}", tenant=tenant, model="m" if i % 2 else "n", tier="t", finish_reason="stop",
                    cost_femtos=amount, output_cost_femtos=amount)
        for i, amount in enumerate(AMOUNTS)])
    return tenant


def test_amounts_are_stored_and_read_back_exactly(records):
    assert sorted(UsageRecord.objects.values_list("cost_femtos", flat=True)) == sorted(AMOUNTS)
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:  # decimal text, not a REAL
            cursor.execute("SELECT DISTINCT typeof(cost_femtos) FROM tenants_usagerecord")
            assert cursor.fetchall() == [("text",)]


@pytest.mark.parametrize("lookup", ["gt", "gte", "lt", "lte", "exact"])
@pytest.mark.parametrize("pivot", [0, 999_999_999, 2**63, 10**20 + 7])
def test_comparisons_are_numeric(records, lookup, pivot):
    import operator

    compare = {"gt": operator.gt, "gte": operator.ge, "lt": operator.lt, "lte": operator.le, "exact": operator.eq}
    got = sorted(UsageRecord.objects.filter(**{f"cost_femtos__{lookup}": pivot}).values_list("cost_femtos", flat=True))
    assert got == sorted(a for a in AMOUNTS if compare[lookup](a, pivot))


def test_sums_grouped_filtered_and_rounded_up_are_exact(records):
    total = UsageRecord.objects.aggregate(total=FemtoSum("cost_femtos"))["total"]
    assert total == sum(AMOUNTS) > 2**63
    grouped = dict(UsageRecord.objects.order_by().values("model").annotate(total=FemtoSum("cost_femtos"))
                   .values_list("model", "total"))
    assert grouped == {"m": sum(AMOUNTS[1::2]), "n": sum(AMOUNTS[0::2])}
    filtered = UsageRecord.objects.aggregate(total=FemtoSum("cost_femtos", filter=Q(model="m")))["total"]
    assert filtered == sum(AMOUNTS[1::2])
    nanos = UsageRecord.objects.aggregate(total=FemtoSum("cost_femtos", ceil_digits=6))["total"]
    assert nanos == sum(-(-a // 10**6) for a in AMOUNTS)
    assert UsageRecord.objects.filter(model="none").aggregate(total=FemtoSum("cost_femtos"))["total"] is None


@pytest.mark.django_db
@pytest.mark.parametrize("bad", [-1, 1.5, MAX_FEMTOS + 1])
def test_a_negative_fractional_or_too_wide_amount_is_refused(tenant_factory, bad):
    with pytest.raises((ValueError, TypeError)):
        UsageRecord.objects.create(request_id="bad", tenant=tenant_factory(), model="m", tier="t",
                                   finish_reason="stop", cost_femtos=bad)


@pytest.mark.django_db
def test_the_largest_amount_each_backend_holds(tenant_factory):
    """PostgreSQL: 38 digits. SQLite: as far as its 64-bit sums reach (SQLITE_MAX_FEMTOS, 9.2e12 USD): one more is
    refused when written rather than summed wrong."""
    tenant = tenant_factory()
    top = MAX_FEMTOS if connection.vendor == "postgresql" else SQLITE_MAX_FEMTOS
    UsageRecord.objects.create(request_id="top", tenant=tenant, model="m", tier="t", finish_reason="stop",
                               cost_femtos=top)
    assert UsageRecord.objects.get(request_id="top").cost_femtos == top
    assert UsageRecord.objects.aggregate(total=FemtoSum("cost_femtos"))["total"] == top
    if connection.vendor == "sqlite":
        with pytest.raises(ValueError, match="SQLite holds"):
            UsageRecord.objects.create(request_id="over", tenant=tenant, model="m", tier="t", finish_reason="stop",
                                       cost_femtos=top + 1)
