"""usage_record_create and usage_records_insert: one record per request id, whatever happens."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing.models import UsageRecord
from billing.services.price_cache import pricing_snapshot
from billing.services.usage import usage_record_create, usage_records_insert


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


def _race(writers: int, write) -> list:
    """Run write(i) for each writer in its own thread (its own connection), all starting at once;
    the results, or the exceptions raised."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite serialises writers; the race is meaningful on PostgreSQL (make test-postgres)")
    barrier = threading.Barrier(writers)
    results: list = []

    def run(i: int) -> None:
        from django.db import connection as thread_connection

        try:
            barrier.wait()
            results.append(write(i))
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            results.append(exc)
        finally:
            thread_connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.django_db(transaction=True)
def test_racing_writers_leave_one_record(tenant_factory):
    tenant = tenant_factory()
    results = _race(6, lambda i: usage_record_create(**_fields(tenant, request_id="raced", completion_tokens=i))[1])
    assert sorted(results) == [False] * 5 + [True]
    assert UsageRecord.objects.filter(request_id="raced").count() == 1


# ---------------------------------------------------------------- usage_records_insert (the worker's batches)
@pytest.mark.django_db
def test_a_batch_is_written_and_a_request_with_a_record_keeps_the_first(tenant_factory, api_key_factory):
    tenant = tenant_factory()
    key = api_key_factory(tenant=tenant).api_key
    usage_record_create(**_fields(tenant, request_id="b-1", completion_tokens=5))
    batch = [_fields(tenant, request_id=f"b-{i}", api_key_id=key.pk, completion_tokens=10 + i, cached_tokens=99)
             for i in range(4)]
    assert usage_records_insert(batch) == 4
    rows = {r.request_id: r for r in UsageRecord.objects.filter(request_id__startswith="b-")}
    assert sorted(rows) == ["b-0", "b-1", "b-2", "b-3"]
    assert rows["b-1"].completion_tokens == 5 and rows["b-1"].api_key_id is None  # the first write won
    assert [rows[f"b-{i}"].completion_tokens for i in (0, 2, 3)] == [10, 12, 13]
    assert {rows[f"b-{i}"].api_key_id for i in (0, 2, 3)} == {key.pk}
    assert {rows[f"b-{i}"].cached_tokens for i in (0, 2, 3)} == {12}  # clamped to the prompt, as one by one
    assert usage_records_insert([]) == 0


@pytest.mark.django_db
def test_a_bad_record_writes_nothing_of_its_batch(tenant_factory):
    tenant = tenant_factory()
    batch = [_fields(tenant, request_id="ok-1"), _fields(tenant, request_id="bad", finish_reason="timeout")]
    with pytest.raises(ValueError):
        usage_records_insert(batch)
    assert not UsageRecord.objects.filter(request_id__in=["ok-1", "bad"]).exists()


@pytest.mark.django_db
def test_a_batch_costs_the_same_queries_whatever_its_size(tenant_factory, api_key_factory):
    tenant = tenant_factory()
    keys = [api_key_factory(tenant=tenant).api_key for _ in range(2)]
    pricing_snapshot()  # prices are read once per process and TTL (billing.services.price_cache), not per insert
    counts = []
    for size in (1, 16):
        batch = [_fields(tenant, request_id=f"q{size}-{i}", api_key_id=keys[i % 2].pk) for i in range(size)]
        with CaptureQueriesContext(connection) as queries:
            usage_records_insert(batch)
        counts.append(len(queries))
    assert counts[0] == counts[1]
    assert UsageRecord.objects.filter(request_id__startswith="q16-").count() == 16
    with CaptureQueriesContext(connection) as one_by_one:
        for i in range(16):
            usage_record_create(**_fields(tenant, request_id=f"single-{i}", api_key_id=keys[i % 2].pk))
    assert counts[1] * 4 < len(one_by_one)  # one record at a time pays its queries per record


@pytest.mark.django_db(transaction=True)
def test_a_key_deleted_while_its_request_ran_leaves_its_record_without_the_key(tenant_factory, api_key_factory):
    tenant = tenant_factory()
    gone = api_key_factory(tenant=tenant).api_key
    kept = api_key_factory(tenant=tenant).api_key
    gone_id = gone.pk
    gone.delete()
    pricing_snapshot()  # read once per process and TTL, not per insert
    with CaptureQueriesContext(connection) as queries:
        usage_records_insert([_fields(tenant, request_id="late-1", api_key_id=gone_id),
                              _fields(tenant, request_id="late-2", api_key_id=kept.pk)])
    assert len(queries) == 1  # the keys' check is a join in the insert itself
    rows = dict(UsageRecord.objects.filter(request_id__startswith="late-").values_list("request_id", "api_key_id"))
    assert rows == {"late-1": None, "late-2": kept.pk}


@pytest.mark.django_db(transaction=True)
def test_an_insert_refused_at_commit_by_a_key_deleted_meanwhile_is_retried(tenant_factory, api_key_factory,
                                                                            monkeypatch):
    from django.db import IntegrityError

    from billing.services import usage

    tenant = tenant_factory()
    key = api_key_factory(tenant=tenant).api_key
    insert, calls = usage._insert, []

    def deleted_meanwhile(rows):  # the key goes after the statement's join saw it: its foreign key fails at commit
        calls.append(len(rows))
        if len(calls) == 1:
            key.delete()
            raise IntegrityError("insert or update violates foreign key constraint")
        insert(rows)

    monkeypatch.setattr(usage, "_insert", deleted_meanwhile)
    usage_records_insert([_fields(tenant, request_id="raced-1", api_key_id=key.pk)])
    assert calls == [1, 1]
    assert UsageRecord.objects.get(request_id="raced-1").api_key_id is None


@pytest.mark.django_db(transaction=True)
def test_racing_batches_leave_one_record_per_request(tenant_factory):
    tenant = tenant_factory()

    def write(i: int) -> int:  # overlapping batches: every writer has "shared-*", each its own "own-i-*"
        batch = [_fields(tenant, request_id=f"shared-{j}", completion_tokens=i) for j in range(8)]
        return usage_records_insert(batch + [_fields(tenant, request_id=f"own-{i}-{j}") for j in range(4)])

    assert _race(4, write) == [12] * 4
    assert UsageRecord.objects.filter(request_id__startswith="shared-").count() == 8
    assert UsageRecord.objects.filter(request_id__startswith="own-").count() == 16


@pytest.mark.django_db
def test_the_workers_writer_keeps_the_good_records_of_a_batch_with_a_bad_one(tenant_factory):
    from billing.services.settlement import Ending
    from inference.worker.finish import endings_record

    tenant = tenant_factory()
    now = time.time()
    batch = [Ending(**_fields(tenant, request_id=rid, finish_reason=reason), admitted_at=now, created_at=now)
             for rid, reason in (("s-1", "stop"), ("s-bad", "timeout"), ("s-2", "stop"))]
    assert endings_record(batch) is False  # not all written
    assert sorted(UsageRecord.objects.filter(request_id__startswith="s-").values_list("request_id", flat=True)) == [
        "s-1", "s-2"]
    assert endings_record(batch[:1] + batch[2:]) is True  # written again: the first records stay
    assert UsageRecord.objects.filter(request_id__startswith="s-").count() == 2


@pytest.mark.django_db
def test_the_one_statement_insert_stores_every_field_as_the_orm_does(tenant_factory, tier_factory, api_key_factory):
    from datetime import datetime, timezone

    from billing.services.prices import EPOCH, price_create

    tenant = tenant_factory(tier=tier_factory(price_multiplier="1.375"))
    key = api_key_factory(tenant=tenant).api_key
    price_create(model="roundtrip-model", input_per_million="0.123456", cached_input_per_million="0.061728",
                 output_per_million="9.654321", effective_from=EPOCH)
    admitted = datetime(2026, 3, 29, 1, 30, 15, 123457, tzinfo=timezone.utc)
    common = dict(api_key_id=key.pk, model="roundtrip-model", prompt_tokens=1_000_000_007, cached_tokens=123_457,
                  completion_tokens=300_000_001, error="it's \"quoted\"; ünïcode, \\ and %s", queued_s=0.1 + 0.2,
                  ttft_s=None, duration_s=1e-7, worker_id="w'1", admitted_at=admitted, finish_reason="length")
    by_orm, _ = usage_record_create(**_fields(tenant, request_id="by-orm", **common))
    usage_records_insert([_fields(tenant, request_id="by-insert", **common)])
    by_insert = UsageRecord.objects.get(request_id="by-insert")
    skip = {"id", "request_id", "created_at"}
    fields = [f.attname for f in UsageRecord._meta.concrete_fields if f.attname not in skip]
    assert {f: getattr(by_insert, f) for f in fields} == {f: getattr(by_orm, f) for f in fields}
    assert by_insert.admitted_at == admitted and by_insert.price_multiplier == by_orm.price_multiplier
    assert by_insert.cost_femtos > 2**53  # beyond a double's integers: exact through the JSON parameter
    assert abs((by_insert.created_at - by_orm.created_at).total_seconds()) < 60


@pytest.mark.django_db
def test_a_record_written_late_keeps_the_time_its_request_ended(tenant_factory):
    """A worker's spool writes records after a database outage: each keeps its own created_at (so it counts in
    the hour its request ended), while a record without one is stamped at the insert."""
    from datetime import datetime, timezone

    tenant = tenant_factory()
    ended = 1764115200.5  # 2025-11-26 00:00:00.5 UTC
    usage_records_insert([_fields(tenant, request_id="r-late", created_at=ended),
                          _fields(tenant, request_id="r-now")])
    late = UsageRecord.objects.get(request_id="r-late")
    assert late.created_at == datetime.fromtimestamp(ended, tz=timezone.utc)
    assert UsageRecord.objects.get(request_id="r-now").created_at > late.created_at
