"""Price versions: added (service, command, admin), never edited; bootstrap's default."""

from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.urls import reverse

from billing.models import Price
from billing.services.prices import DEFAULT_PRICES, price_create, price_lead_time, prices_bootstrap_defaults

NOW = datetime(2026, 5, 10, 12, tzinfo=timezone.utc)


def _create(**overrides):
    fields = dict(model="m", input_per_million="1", cached_input_per_million="0.5", output_per_million="2")
    fields.update(overrides)
    return price_create(**fields)


@pytest.mark.django_db
def test_first_price_may_start_any_time_later_ones_after_the_lead_time():
    first = _create(effective_from=NOW - timedelta(days=30), now=NOW)
    assert first.input_per_million == Decimal("1")
    with pytest.raises(ValidationError, match="or later"):
        _create(effective_from=NOW, now=NOW)
    second = _create(input_per_million="1.5", now=NOW)  # default start: the earliest allowed
    assert second.effective_from == NOW + price_lead_time()
    with pytest.raises(ValidationError, match="already has a version"):
        _create(effective_from=second.effective_from, now=NOW - timedelta(days=1))
    assert list(Price.objects.filter(model="m").values_list("pk", flat=True)) == [second.pk, first.pk]


@pytest.mark.django_db
@pytest.mark.parametrize("bad", ["0.0000001", "-1", "abc", "NaN"])
def test_bad_prices_are_refused(bad):
    with pytest.raises(ValidationError):
        _create(output_per_million=bad, effective_from=NOW)


@pytest.mark.django_db
def test_a_saved_version_is_never_edited():
    price = _create(effective_from=NOW)
    price.input_per_million = Decimal("9")
    with pytest.raises(ValueError, match="never edited"):
        price.save()
    assert Price.objects.get(pk=price.pk).input_per_million == Decimal("1")


@pytest.mark.django_db
def test_price_set_command(capsys):
    with time_machine.travel(NOW, tick=False):
        call_command("price_set", "--model", "m", "--input", "0.15", "--cached-input", "0.075", "--output", "0.6",
                     "--effective-from", "2026-05-01T00:00:00Z")
        call_command("price_set", "--model", "m", "--input", "0.2", "--cached-input", "0.1", "--output", "0.8")
        with pytest.raises(CommandError, match="effective_from"):
            call_command("price_set", "--model", "m", "--input", "1", "--cached-input", "1", "--output", "1",
                         "--effective-from", "2026-05-10T12:00:00+00:00")
        with pytest.raises(CommandError, match="ISO-8601"):
            call_command("price_set", "--model", "m", "--input", "1", "--cached-input", "1", "--output", "1",
                         "--effective-from", "yesterday")
    old, new = Price.objects.filter(model="m").order_by("effective_from")
    assert (old.input_per_million, old.cached_input_per_million, old.output_per_million) == (
        Decimal("0.15"), Decimal("0.075"), Decimal("0.6"))
    assert new.effective_from == NOW + price_lead_time() and new.output_per_million == Decimal("0.8")
    assert "Price #" in capsys.readouterr().out


@pytest.mark.django_db
def test_bootstrap_prices_the_demo_model_once():
    assert [p.model for p in prices_bootstrap_defaults()] == list(DEFAULT_PRICES)
    assert prices_bootstrap_defaults() == []
    price = Price.objects.get(model="smollm2-135m-instruct")
    assert price.cached_input_per_million < price.input_per_million


@pytest.mark.django_db
def test_bootstrap_command_sets_the_default_price(capsys):
    call_command("bootstrap", "--admin-password", "a-long-test-password-1")
    assert Price.objects.filter(model="smollm2-135m-instruct").count() == 1


@pytest.mark.django_db
def test_admin_adds_versions_and_shows_history_read_only(client):
    user = get_user_model().objects.create_superuser("root", "root@example.com", "a-long-test-password-1")
    client.force_login(user)
    old = _create(effective_from=NOW - timedelta(days=3))
    add = reverse("admin:billing_price_add")
    form = {"model": "m", "input_per_million": "3", "cached_input_per_million": "1", "output_per_million": "6",
            "effective_from_0": "2000-01-01", "effective_from_1": "00:00:00", "note": ""}
    assert client.post(add, form).status_code == 200  # refused: before the lead time, page shows the error
    form.update({"effective_from_0": "2099-01-01"})
    assert client.post(add, form).status_code == 302
    new = Price.objects.get(model="m", effective_from__year=2099)
    assert new.created_by == user
    page = client.get(reverse("admin:billing_price_change", args=[old.pk]))
    assert page.status_code == 200 and b'name="input_per_million"' not in page.content
    assert client.post(reverse("admin:billing_price_change", args=[old.pk]), {**form, "input_per_million": "0"}).status_code == 403
    listing = client.get(reverse("admin:billing_price_changelist")).content.decode()
    assert str(old.pk) in listing and str(new.pk) in listing
    assert Price.objects.get(pk=old.pk).input_per_million == Decimal("1")
