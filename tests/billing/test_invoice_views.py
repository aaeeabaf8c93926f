"""The printable invoice page and its CSV: staff and the tenant's members only."""

import csv
import io
from datetime import datetime, timezone
from decimal import Decimal

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.urls import reverse

from billing.periods import month_parse
from billing.services.invoices import invoice_draft_refresh
from tenants.models import Membership


@pytest.fixture
def invoice(tenant, price_factory, record_write):
    price_factory(input="2", cached="1", output="8")
    with time_machine.travel(datetime(2026, 3, 3, tzinfo=timezone.utc), tick=False):
        record_write(tenant, prompt_tokens=300_000, cached_tokens=100_000, completion_tokens=20_000)
    return invoice_draft_refresh(tenant=tenant, period=month_parse(label="2026-03", tz="UTC"))


def _login(client, name, **flags):
    user = get_user_model().objects.create_user(name, password="a-long-test-password-1", **flags)
    client.force_login(user)
    return user


@pytest.mark.django_db
def test_a_member_prints_the_invoice_and_downloads_its_lines(client, invoice, tenant):
    Membership.objects.create(user=_login(client, "member"), tenant=tenant, role="viewer")
    page = client.get(reverse("invoice-html", args=[invoice.public_id]))
    assert page.status_code == 200
    html = page.content.decode()
    assert invoice.number in html and str(invoice.total) in html and "half to even" in html
    rows = list(csv.reader(io.StringIO(client.get(reverse("invoice-csv", args=[invoice.public_id])).content.decode())))
    assert rows[0][0] == "position" and rows[-1][1] == "total"
    assert sum(Decimal(row[9]) for row in rows[1:-1]) == Decimal(rows[-1][9]) == invoice.total
    assert {row[1] for row in rows[1:-1]} == {"input", "cached_input", "output"}


@pytest.mark.django_db
def test_others_get_404_and_anonymous_users_log_in(client, invoice):
    assert client.get(reverse("invoice-html", args=[invoice.public_id])).status_code == 302
    _login(client, "stranger")
    assert client.get(reverse("invoice-html", args=[invoice.public_id])).status_code == 404
    assert client.get(reverse("invoice-csv", args=[invoice.public_id])).status_code == 404
    _login(client, "staff", is_staff=True)
    assert client.get(reverse("invoice-csv", args=[invoice.public_id])).status_code == 200


@pytest.mark.django_db
def test_the_printable_pages_take_the_public_id_only(client, invoice, tenant):
    """A member with the row id (sequential: it tells how many invoices exist) gets 404; so does any other id."""
    Membership.objects.create(user=_login(client, "member-ids"), tenant=tenant, role="viewer")
    assert client.get(f"/billing/invoices/{invoice.public_id}/").status_code == 200
    for bad in (str(invoice.pk), "%C2%B2", invoice.public_id + "x", invoice.public_id[:-1]):
        assert client.get(f"/billing/invoices/{bad}/").status_code == 404, bad
        assert client.get(f"/billing/invoices/{bad}.csv").status_code == 404, bad
        assert client.get(f"/dashboard/{tenant.slug}/invoices/{bad}/").status_code == 404, bad
    assert client.get(f"/dashboard/{tenant.slug}/invoices/{invoice.public_id}/").status_code == 200
