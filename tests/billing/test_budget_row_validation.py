"""What a budget row and the ledger refuse: alert thresholds that are not distinct whole percentages (the
settlement's alert check and the overview page compare them as integers), and a ledger total for a scope that
has no period counter (a tenant's per-model rate scope)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from django.core.exceptions import ValidationError

from billing.ledger import ledger_totals
from billing.models import TenantBudget
from tenants.services.limits import LimitScope


@pytest.mark.django_db
@pytest.mark.parametrize("percents", [["50", "80"], [50, 50], [0], [1001], [50.0], [True], list(range(1, 12)), {"a": 1},
                                      "50,80"])
def test_alert_thresholds_must_be_distinct_whole_percentages(tenant_factory, percents):
    row = TenantBudget(tenant=tenant_factory(), budget_alert_percents=percents)
    with pytest.raises(ValidationError) as caught:
        row.full_clean()
    assert "budget_alert_percents" in caught.value.message_dict


@pytest.mark.django_db
@pytest.mark.parametrize("percents", [[], [50, 80, 100], [1, 1000]])
def test_good_alert_thresholds_pass(tenant_factory, percents):
    TenantBudget(tenant=tenant_factory(), budget_alert_percents=percents).full_clean()


@pytest.mark.django_db
def test_no_ledger_total_for_a_per_model_scope(tenant_factory):
    """Its id is a tenant's: counting it as a key's family would read another key's ledger."""
    tenant = tenant_factory()
    start, end = datetime(2026, 11, 1, tzinfo=timezone.utc), datetime(2026, 12, 1, tzinfo=timezone.utc)
    with pytest.raises(ValueError, match="no ledger total"):
        ledger_totals(scope=LimitScope.tenant_model(tenant.pk, "smollm2-135m-instruct"), start=start, end=end)
    assert ledger_totals(scope=LimitScope.tenant(tenant.pk), start=start, end=end) == {"quota": 0, "spend": 0}
