"""usage_record_create: one record per request id, whatever happens."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from tenants.models import UsageRecord
from tenants.services.usage import usage_record_create


def _fields(tenant, **overrides):
    fields = dict(
        request_id="req-usage-1", tenant_id=tenant.pk, api_key_id=None, model="smollm2-135m-instruct",
        tier=tenant.tier.name, endpoint="chat.completions", prompt_tokens=12, cached_tokens=4,
        completion_tokens=7, finish_reason="stop", error=None, queued_s=0.01, ttft_s=0.05,
        duration_s=0.2, worker_id="w1",
    )
    fields.update(overrides)
    return fields


@pytest.mark.django_db
def test_creates_once_and_returns_the_first_record(tenant_factory, api_key_factory):
    tenant = tenant_factory()
    key = api_key_factory(tenant=tenant).api_key
    record, created = usage_record_create(**_fields(tenant, api_key_id=key.pk))
    assert created
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (12, 4, 7)
    assert record.api_key_id == key.pk and record.error == "" and record.total_tokens == 19
    again, created_again = usage_record_create(**_fields(tenant, completion_tokens=99, finish_reason="error", error="x"))
    assert not created_again
    assert again.pk == record.pk and again.completion_tokens == 7 and again.finish_reason == "stop"
    assert UsageRecord.objects.filter(request_id="req-usage-1").count() == 1


@pytest.mark.django_db
def test_every_outcome_is_recorded(tenant_factory):
    tenant = tenant_factory()
    for reason in ("stop", "length", "abort", "error"):
        usage_record_create(**_fields(tenant, request_id=f"r-{reason}", finish_reason=reason, ttft_s=None))
    assert sorted(UsageRecord.objects.values_list("finish_reason", flat=True)) == ["abort", "error", "length", "stop"]
    with pytest.raises(ValueError):
        usage_record_create(**_fields(tenant, request_id="r-bad", finish_reason="timeout"))


@pytest.mark.django_db
def test_values_are_sanitised_and_a_deleted_key_is_tolerated(tenant_factory, api_key_factory):
    tenant = tenant_factory()
    key = api_key_factory(tenant=tenant).api_key
    key_id = key.pk
    key.delete()
    record, _ = usage_record_create(**_fields(tenant, api_key_id=key_id, cached_tokens=50, queued_s=-1.0, completion_tokens=-3))
    assert record.api_key_id is None
    assert record.cached_tokens == 12  # never more than the prompt
    assert record.queued_s == 0.0 and record.completion_tokens == 0


@pytest.mark.django_db(transaction=True)
def test_racing_writers_leave_one_record(tenant_factory):
    if connection.vendor == "sqlite":
        pytest.skip("SQLite serialises writers; the race is meaningful on PostgreSQL (make test-postgres)")
    tenant = tenant_factory()
    barrier = threading.Barrier(6)
    results: list[bool] = []

    def write(i: int) -> None:
        from django.db import connection as thread_connection

        try:
            barrier.wait()
            _record, created = usage_record_create(**_fields(tenant, request_id="raced", completion_tokens=i))
            results.append(created)
        finally:
            thread_connection.close()

    threads = [threading.Thread(target=write, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 5 + [True]
    assert UsageRecord.objects.filter(request_id="raced").count() == 1
