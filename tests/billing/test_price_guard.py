"""Issue 35 (2): a price its column cannot hold no longer stops billing for everyone.

Prices are checked in one place (billing.money.price_check, through Price.clean
and price_create) by the CLI and the admin: finite, 0 to MAX_PRICE_PER_MILLION,
at most 6 places. A row that still fails to load (written by hand in SQL) is
skipped with an error logged and marked in the admin, never breaks the other
models' prices; its model is refused with 503 `model_unavailable` (never
served unbilled); it can be retired in the admin (kept, prices nothing). A
request whose record cannot be written stays in the worker's spool, its
reservation settled by the worker at once, and is written once the price is
fixed.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import httpx
import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection
from django.urls import reverse

from billing.models import Price, UsageRecord
from billing.services.price_cache import PriceUnavailable, price_cache_clear, pricing_snapshot_load
from billing.services.prices import EPOCH, price_create

T_BAD = datetime(2026, 1, 1, tzinfo=timezone.utc)
SERVED = "smollm2-135m-instruct"


def bad_row(model: str, value: str, effective_from=T_BAD) -> int:
    """A price row written by hand in SQL, past every check: `value` as its input price."""
    at = connection.ops.adapt_datetimefield_value(effective_from)  # as the ORM stores it
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO billing_price (model, input_per_million, cached_input_per_million, output_per_million, "
            "effective_from, created_at, note) VALUES (%s, %s, 1, 1, %s, %s, '')", [model, value, at, at])
        cursor.execute("SELECT max(id) FROM billing_price")
        pk = cursor.fetchone()[0]
    price_cache_clear()
    return pk


def bad_values() -> list[str]:
    """What each backend lets through by hand: SQLite keeps the issue's 99999999999999 (as a REAL); PostgreSQL's
    NUMERIC(12, 6) refuses it but takes NaN. Both take a value over the bound but within the column."""
    return ["99999999999999" if connection.vendor == "sqlite" else "NaN", "500000"]


# ---------------------------------------------------------------- where prices are set
@pytest.mark.django_db
@pytest.mark.parametrize("value", ["99999999999999", "Infinity", "-Infinity", "NaN", "sNaN", "-1", "10000.000001",
                                   "0.0000001", "1e400", "abc", ""])
def test_price_set_refuses_a_price_out_of_bounds_with_a_message(value):
    with pytest.raises(CommandError, match="input_per_million"):
        call_command("price_set", "--model", "zz", f"--input={value}", "--cached-input", "1", "--output", "1")
    assert not Price.objects.filter(model="zz").exists()
    pricing_snapshot_load()  # the table still loads


@pytest.mark.django_db
def test_price_set_takes_the_bound_itself(capsys):
    call_command("price_set", "--model", "zz", "--input", "10000", "--cached-input", "0", "--output", "1e3",
                 "--effective-from", "2026-01-01T00:00:00Z")
    price = Price.objects.get(model="zz")
    assert (price.input_per_million, price.output_per_million) == (Decimal(10000), Decimal(1000))
    assert pricing_snapshot_load().terms_at("zz", T_BAD).input_picos == 10**10


@pytest.mark.django_db
def test_the_admin_refuses_a_price_out_of_bounds(client):
    client.force_login(get_user_model().objects.create_superuser("root", "r@example.com", "a-long-test-password-1"))
    form = {"model": "zz", "cached_input_per_million": "1", "output_per_million": "1",
            "effective_from_0": "2099-01-01", "effective_from_1": "00:00:00", "note": ""}
    for value, message in (("10000.5", "between 0 and 10000"), ("99999999999999", "12 digits"),
                           ("-2", "between 0 and 10000")):
        page = client.post(reverse("admin:billing_price_add"), {**form, "input_per_million": value})
        assert page.status_code == 200 and message in page.content.decode(), value
    assert not Price.objects.filter(model="zz").exists()
    assert client.post(reverse("admin:billing_price_add"), {**form, "input_per_million": "10000"}).status_code == 302


# ---------------------------------------------------------------- a row written by hand
@pytest.mark.django_db
def test_a_bad_row_is_skipped_logged_and_breaks_no_other_model(caplog):
    good = price_create(model="good", input_per_million="1", cached_input_per_million="0.5", output_per_million="2",
                        effective_from=EPOCH)
    before = price_create(model="zz", input_per_million="3", cached_input_per_million="1", output_per_million="4",
                          effective_from=EPOCH)
    bad_ids = [bad_row("zz", value, T_BAD + timedelta(days=i)) for i, value in enumerate(bad_values())]
    with caplog.at_level(logging.ERROR, logger="billing.services.price_cache"):
        snapshot = pricing_snapshot_load()
    assert snapshot.terms_at("good", T_BAD) == good.terms
    assert snapshot.terms_at("zz", T_BAD - timedelta(seconds=1)) == before.terms  # before the bad version: fine
    with pytest.raises(PriceUnavailable) as refused:
        snapshot.terms_at("zz", T_BAD + timedelta(days=5))
    assert refused.value.status_code == 503 and refused.value.code == "model_unavailable"
    assert [invalid.price_id for invalid in snapshot.invalid] == bad_ids
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert all(any(f"price #{pk} of zz cannot be used" in line for line in logged) for pk in bad_ids)
    # the worker's insert prices the other models' records as before
    from billing.services.usage import usage_records_insert
    from tenants.models import Tenant, Tier

    tenant = Tenant.objects.create(slug="guard", name="guard", tier=Tier.objects.create(name="guard-tier"))
    usage_records_insert([dict(request_id="g-1", tenant_id=tenant.pk, api_key_id=None, model="good",
                               tier="guard-tier", prompt_tokens=1_000_000, completion_tokens=0, finish_reason="stop",
                               admitted_at=T_BAD)])
    assert UsageRecord.objects.get(request_id="g-1").cost_femtos == 10**15  # 1M tokens at 1 USD per 1M


@pytest.mark.django_db
def test_the_admin_lists_marks_and_retires_a_bad_row(client):
    user = get_user_model().objects.create_superuser("root", "r@example.com", "a-long-test-password-1")
    client.force_login(user)
    before = price_create(model="zz", input_per_million="3", cached_input_per_million="1", output_per_million="4",
                          effective_from=EPOCH)
    bad = bad_row("zz", bad_values()[0])
    listing = client.get(reverse("admin:billing_price_changelist"))
    assert listing.status_code == 200  # it was a 500
    html = listing.content.decode()
    assert "INVALID" in html and f"Price #{bad} of zz cannot be used" in html
    assert client.get(reverse("admin:billing_price_change", args=[bad])).status_code == 200
    retired = client.post(reverse("admin:billing_price_changelist"),
                          {"action": "retire", "_selected_action": [bad]}, follow=True)
    assert retired.status_code == 200 and "Retired 1 price version" in retired.content.decode()
    row = Price.objects.only("retired_at", "retired_by").get(pk=bad)  # kept, with who retired it and when: history, not a rewrite
    assert row.retired_at is not None and row.retired_by == user
    price_cache_clear()
    assert pricing_snapshot_load().terms_at("zz", T_BAD + timedelta(days=1)) == before.terms  # the version before
    html = client.get(reverse("admin:billing_price_changelist")).content.decode()
    assert "retired" in html and "cannot be used" not in html


@pytest.mark.django_db
def test_retiring_a_models_only_price_says_it_is_no_longer_charged(client):
    client.force_login(get_user_model().objects.create_superuser("root", "r@example.com", "a-long-test-password-1"))
    only = price_create(model="solo", input_per_million="1", cached_input_per_million="1", output_per_million="1",
                        effective_from=EPOCH)
    page = client.post(reverse("admin:billing_price_changelist"), {"action": "retire", "_selected_action": [only.pk]},
                       follow=True)
    assert "No price version of solo is left" in page.content.decode()


# ---------------------------------------------------------------- a request for its model
@pytest.mark.django_db(transaction=True)
def test_a_request_for_a_model_without_a_valid_price_is_503_not_500(served_model, tier_factory, tenant_factory,
                                                                     api_key_factory):
    from platform_site.asgi import application
    from tenants.models import Tenant

    bad_row(SERVED, bad_values()[0], effective_from=EPOCH)
    tier = tier_factory(allowed_models=["*"], max_output_tokens=64)
    plain = api_key_factory(tenant=tenant_factory(tier=tier)).key
    budgeted = api_key_factory(tenant=tenant_factory(tier=tier, monthly_spend_limit_micros=10**6)).key
    assert Tenant.objects.filter(budget__monthly_spend_limit_micros=10**6).exists()
    body = json.dumps({"model": SERVED, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}).encode()

    async def post(key: str) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=application),
                                     base_url="http://testserver") as client:
            return await client.post("/v1/chat/completions", content=body,
                                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})

    for key in (plain, budgeted):  # (with a budget it was a 500; without one, served and never billed)
        response = async_to_sync(post)(key)
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "model_unavailable"
        assert response.json()["error"]["param"] == "model"
    assert not UsageRecord.objects.exists()
    from django.db import connections

    async_to_sync(sync_to_async(connections.close_all))()


# ---------------------------------------------------------------- the worker's spool
@pytest.mark.django_db
def test_a_record_that_cannot_be_priced_stays_spooled_its_reservation_settled(tmp_path, monkeypatch, tier_factory,
                                                                             tenant_factory, caplog):
    from billing.counters import get_admission_backend, reset_admission_backend
    from billing.counters.memory import MemoryAdmission
    from billing.services.admission_reserve import aadmission_reserve
    from billing.services.settlement import Ending
    from billing.services.prices import price_retire
    from inference.worker import spool as spool_module
    from inference.worker.finish import EndingsSink
    from tenants.services.api_keys import AuthContext

    reset_admission_backend(MemoryAdmission())
    monkeypatch.setattr(spool_module.Spool, "_start_flusher", lambda self: None)  # this test flushes by hand
    monkeypatch.setattr(spool_module, "RETRY_BASE_S", 0.0)  # a retry is due at once
    tier = tier_factory(requests_per_minute=0, tokens_per_minute=0, max_concurrent_requests=3,
                        monthly_token_quota=10**9)
    tenant = tenant_factory(tier=tier)
    auth = AuthContext(tenant=tenant, tier=tier, api_key=None)
    before = price_create(model="zz", input_per_million="3", cached_input_per_million="1", output_per_million="4",
                          effective_from=EPOCH)
    price_create(model="ok", input_per_million="1", cached_input_per_million="1", output_per_million="1",
                 effective_from=EPOCH)
    bad = Price.objects.only("pk").get(pk=bad_row("zz", bad_values()[0]))  # (its amounts cannot be loaded)

    def admitted(request_id: str, model: str) -> Ending:
        async_to_sync(aadmission_reserve)(auth=auth, request_id=request_id, model=model, prompt_tokens=100,
                                          max_tokens=50)
        at = datetime.now(timezone.utc)
        return Ending(request_id=request_id, tenant_id=tenant.pk, api_key_id=None, model=model, tier=tier.name,
                      prompt_tokens=100, cached_tokens=0, completion_tokens=50, finish_reason="stop",
                      admitted_at=at.timestamp(), created_at=at.timestamp())  # (its price unread: bad)

    spool = spool_module.Spool(tmp_path, EndingsSink())
    try:
        records = [admitted("r-ok", "ok"), admitted("r-zz", "zz"), admitted("r-ok2", "ok")]
        assert get_admission_backend().held() == (3, 3)
        spool.add(records)
        with caplog.at_level(logging.ERROR):
            assert spool.process(records) == (False, True)
        # the others are written; the unpriceable one stays, with its error; every reservation is settled now
        assert set(UsageRecord.objects.values_list("request_id", flat=True)) == {"r-ok", "r-ok2"}
        assert [(rid, attempts) for rid, attempts, _ in spool.failing()] == [("r-zz", 1)]
        assert "model_unavailable" in spool.failing()[0][2] or "no valid price" in spool.failing()[0][2]
        assert spool.pending() == 1 and get_admission_backend().held() == (0, 0)
        assert any("r-zz cannot be written" in r.getMessage() and "retried" in r.getMessage() for r in caplog.records)
        # it blocks nothing: a later record goes through while it waits
        later = [admitted("r-ok3", "ok")]
        spool.add(later)
        assert spool.process(later) == (True, True)
        assert spool.flush_once() == 1 and spool.failing()[0][1] == 2  # retried, still failing, still kept
        # the operator retires the bad version: the record is written at the version before it
        price_retire(price=bad)
        price_cache_clear()
        assert spool.flush_once() == 0
        record = UsageRecord.objects.get(request_id="r-zz")
        assert record.price_id == before.pk and record.cost_femtos == (100 * 3 + 50 * 4) * 10**9
    finally:
        spool.close(flush_timeout=0)
