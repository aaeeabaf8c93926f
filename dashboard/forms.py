"""The dashboard's forms: the usage filter, a new API key (with its own limits), the owner's budget."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django import forms

from dashboard.selectors.usage import MAX_RANGE_DAYS
from tenants.models import ApiKey

SCOPE_CHOICES = [(scope, scope) for scope in ApiKey.ALL_SCOPES]


class UsageFilterForm(forms.Form):
    start = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    model = forms.ChoiceField(required=False)
    key = forms.ChoiceField(required=False, label="API key")

    def __init__(self, *args, models: list[str], keys: list[ApiKey], today, **kwargs):
        super().__init__(*args, **kwargs)
        self.today = today
        self.fields["model"].choices = [("", "all models"), *[(name, name) for name in models]]
        self.fields["key"].choices = [("", "all keys"), *[(key.public_id, f"{key.name} ({key.redacted})") for key in keys]]

    def clean(self):
        data = super().clean()
        end = data.get("end") or self.today
        start = data.get("start") or end - timedelta(days=29)
        if start > end:
            raise forms.ValidationError("The range starts after it ends.")
        if (end - start).days + 1 > MAX_RANGE_DAYS:
            raise forms.ValidationError(f"At most {MAX_RANGE_DAYS} days at a time.")
        data["start"], data["end"] = start, end
        return data


def _limit(label: str) -> forms.IntegerField:
    return forms.IntegerField(required=False, min_value=1, label=label, help_text="empty: the tenant's limit only")


class ApiKeyCreateForm(forms.Form):
    name = forms.CharField(max_length=100)
    scopes = forms.MultipleChoiceField(choices=SCOPE_CHOICES, required=False, widget=forms.CheckboxSelectMultiple,
                                       help_text="none ticked: every scope")
    expires_days = forms.IntegerField(required=False, min_value=1, max_value=3650, label="Expires after (days)")
    requests_per_minute = _limit("Requests per minute")
    tokens_per_minute = _limit("Tokens per minute")
    max_concurrent_requests = _limit("Concurrent requests")
    monthly_token_quota = _limit("Monthly token quota")
    monthly_budget_usd = forms.DecimalField(required=False, min_value=Decimal("0.000001"), decimal_places=6,
                                            max_digits=15, label="Monthly budget (USD)",
                                            help_text="empty: the tenant's budget only")

    LIMIT_NAMES = ("requests_per_minute", "tokens_per_minute", "max_concurrent_requests", "monthly_token_quota")

    def limit_values(self) -> dict[str, int]:
        """The key's own limits that were given (billing.admission applies them on top of the tenant's)."""
        values = {name: self.cleaned_data[name] for name in self.LIMIT_NAMES if self.cleaned_data.get(name)}
        budget = self.cleaned_data.get("monthly_budget_usd")
        if budget:
            values["monthly_spend_limit_micros"] = int(budget * 1_000_000)
        return values


class BudgetForm(forms.Form):
    monthly_budget_usd = forms.DecimalField(required=False, min_value=Decimal("0"), decimal_places=6, max_digits=15,
                                            label="Monthly budget (USD)", help_text="0 or empty: no budget")
