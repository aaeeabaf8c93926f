"""GET /v1/invoices and /v1/invoices/{id}: a tenant's own invoices, with lines."""

from datetime import datetime, timezone
from decimal import Decimal

import pytest
import time_machine

from billing.periods import month_parse
from billing.services.invoices import invoice_draft_refresh
from tests.conftest import bearer


@pytest.mark.django_db
def test_list_and_detail_with_lines_and_no_other_tenants(api_client, tenant_factory, api_key_factory, price_factory,
                                                         record_write):
    price_factory(input="2", cached="1", output="8")
    a, b = tenant_factory(), tenant_factory()
    with time_machine.travel(datetime(2026, 3, 3, tzinfo=timezone.utc), tick=False):
        record_write(a, prompt_tokens=500_000, cached_tokens=100_000, completion_tokens=10_000)
        record_write(b, prompt_tokens=1_000, completion_tokens=10)
    march = month_parse(label="2026-03", tz="UTC")
    invoice_a = invoice_draft_refresh(tenant=a, period=march)
    invoice_b = invoice_draft_refresh(tenant=b, period=march)
    key_a = api_key_factory(tenant=a, scopes=["usage:read"]).key
    listing = api_client.get("/v1/invoices", **bearer(key_a)).json()
    assert [item["id"] for item in listing["data"]] == [invoice_a.public_id]
    detail = api_client.get(f"/v1/invoices/{invoice_a.public_id}", **bearer(key_a)).json()
    assert detail["object"] == "invoice" and detail["status"] == "draft" and detail["period"] == "2026-03"
    assert Decimal(detail["total"]) == sum(Decimal(line["amount"]) for line in detail["lines"]) == Decimal("0.98")  # 0.4M x 2 + 0.1M x 1 + 0.01M x 8 (USD per 1M)
    assert {line["kind"] for line in detail["lines"]} == {"input", "cached_input", "output"}
    missing = api_client.get(f"/v1/invoices/{invoice_b.public_id}", **bearer(key_a))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "invoice_not_found"
    assert api_client.get("/v1/invoices/nope", **bearer(key_a)).status_code == 404
    no_scope = api_key_factory(tenant=a, scopes=["inference"]).key
    assert api_client.get("/v1/invoices", **bearer(no_scope)).status_code == 403


@pytest.mark.django_db
def test_invoice_ids_are_opaque_and_row_ids_are_not_accepted(api_client, tenant_factory, api_key_factory,
                                                             price_factory, record_write):
    """Issue 35 (6): a tenant names an invoice by its random public id; its sequential row id, and any id
    that is not a public id ("²", which str.isdigit() accepts and int() refuses: a 500 before), are 404."""
    import re

    price_factory()
    a = tenant_factory()
    with time_machine.travel(datetime(2026, 3, 3, tzinfo=timezone.utc), tick=False):
        record_write(a)
    invoice = invoice_draft_refresh(tenant=a, period=month_parse(label="2026-03", tz="UTC"))
    key = api_key_factory(tenant=a, scopes=["usage:read"]).key
    assert re.fullmatch(r"inv_[A-Za-z0-9]{20}", invoice.public_id)
    assert api_client.get(f"/v1/invoices/{invoice.public_id}", **bearer(key)).json()["id"] == invoice.public_id
    for bad in (str(invoice.pk), "%C2%B2", "\u00b2", "inv_" + "x" * 200, "00" + str(invoice.pk), "-1"):
        response = api_client.get(f"/v1/invoices/{bad}", **bearer(key))
        assert response.status_code == 404, (bad, response.status_code)
        # an id of a public id's shape is looked up (and not found); another shape matches no route
        assert response.json()["error"]["code"] in ("invoice_not_found", "unknown_url")
