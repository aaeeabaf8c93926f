"""The dashboard's forms: the usage filter, a new API key (with its own limits), the owner's budget and its alerts."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, timedelta
from decimal import Decimal

from django import forms
from django.core.validators import MaxLengthValidator

from billing.selectors import MAX_ALERT_PERCENT, MAX_ALERTS
from dashboard.selectors.usage import MAX_RANGE_DAYS
from tenants.models import ApiKey

SCOPE_CHOICES = [(scope, scope) for scope in ApiKey.ALL_SCOPES]
ALL_MODELS = "All models"
MODEL_NAME_MAX = 100  # billing.models.UsageRecord.model's length: a longer name was never used
BATCH_CHOICES = [("", "live and batch"), ("false", "live only"), ("true", "Batch API only")]  # the usage API's
BATCH_FILTER = {"": None, "false": False, "true": True}  # batch=true|false, as its cleaned value
EARLIEST_DAY = date(2000, 1, 1)  # the usage filter's bounds: far dates would overflow the zone arithmetic (a 500)


class UsageFilterForm(forms.Form):
    """The usage page's range and filters. The model picker offers "All models" and the models the tenant used
    in the range (`models_in(start, end)`, from billing's figures); it also accepts a model the tenant used
    at another time (`models`), so a pick survives a change of range (and shows zeros). Any other name,
    another tenant's included, is a form error: never a 500, never anyone else's figures."""

    start = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    # A CharField with a picker: which names are valid depends on the range, known only in clean().
    # (The length as a validator: a max_length would write a maxlength attribute onto the <select>.)
    model = forms.CharField(required=False, widget=forms.Select, validators=[MaxLengthValidator(MODEL_NAME_MAX)])
    key = forms.ChoiceField(required=False, label="API key")
    batch = forms.ChoiceField(required=False, label="Requests", choices=BATCH_CHOICES)

    def __init__(self, *args, models: list[str], models_in: Callable[[date, date], list[str]], keys: list[ApiKey],
                 today, **kwargs):
        super().__init__(*args, **kwargs)
        self.today = today
        self.known_models = frozenset(models)
        self.models_in = models_in
        self.period_models: list[str] = []  # the range's models, once clean() has run on a valid range
        self._offer(models)
        self.fields["key"].choices = [("", "all keys"), *[(key.public_id, f"{key.name} ({key.redacted})") for key in keys]]

    def _offer(self, names) -> None:
        self.fields["model"].widget.choices = [("", ALL_MODELS), *[(name, name) for name in sorted(names)]]

    def clean(self):
        data = super().clean()
        end = data.get("end") or self.today
        if not EARLIEST_DAY <= end <= self.today + timedelta(days=366):
            raise forms.ValidationError(f"The range must end between {EARLIEST_DAY} and a year from today.")
        start = data.get("start") or end - timedelta(days=29)
        if start < EARLIEST_DAY:
            raise forms.ValidationError(f"The range cannot start before {EARLIEST_DAY}.")
        if start > end:
            raise forms.ValidationError("The range starts after it ends.")
        if (end - start).days + 1 > MAX_RANGE_DAYS:
            raise forms.ValidationError(f"At most {MAX_RANGE_DAYS} days at a time.")
        data["start"], data["end"] = start, end
        self.period_models = self.models_in(start, end)
        model = data.get("model")
        if model and model not in self.known_models and model not in self.period_models:
            self.add_error("model", "Not a model this tenant has used: pick one from the list.")
        else:
            self._offer({*self.period_models, *([model] if model else [])})
        return data


def _limit(label: str, max_value: int = 2_147_483_647) -> forms.IntegerField:
    """A per-key limit; `max_value`: what its column holds (PositiveIntegerField; the quota is a BigIntegerField)."""
    return forms.IntegerField(required=False, min_value=1, max_value=max_value, label=label,
                              help_text="empty: the tenant's limit only")


class ApiKeyCreateForm(forms.Form):
    name = forms.CharField(max_length=100)
    scopes = forms.MultipleChoiceField(choices=SCOPE_CHOICES, required=False, widget=forms.CheckboxSelectMultiple,
                                       help_text="none ticked: every scope")
    expires_days = forms.IntegerField(required=False, min_value=1, max_value=3650, label="Expires after (days)")
    requests_per_minute = _limit("Requests per minute")
    tokens_per_minute = _limit("Tokens per minute")
    max_concurrent_requests = _limit("Concurrent requests")
    monthly_token_quota = _limit("Monthly token quota", max_value=2**63 - 1)
    monthly_budget_usd = forms.DecimalField(required=False, min_value=Decimal("0.000001"), decimal_places=6,
                                            max_digits=15, label="Monthly budget (USD)",
                                            help_text="empty: the tenant's budget only")

    LIMIT_NAMES = ("requests_per_minute", "tokens_per_minute", "max_concurrent_requests", "monthly_token_quota")

    def limit_values(self) -> dict[str, int]:
        """The key's own limits that were given (billing admission applies them on top of the tenant's)."""
        values = {name: self.cleaned_data[name] for name in self.LIMIT_NAMES if self.cleaned_data.get(name)}
        budget = self.cleaned_data.get("monthly_budget_usd")
        if budget:
            values["monthly_spend_limit_micros"] = int(budget * 1_000_000)
        return values


class BudgetForm(forms.Form):
    """The owners' own budget; the operator's cap (if any) is not theirs to change, and the lower one applies."""

    monthly_budget_usd = forms.DecimalField(required=False, min_value=Decimal("0"), decimal_places=6, max_digits=15,
                                            label="Your monthly budget (USD)",
                                            help_text="0 or empty: none of your own (the operator's cap, if any, "
                                                      "still applies)")


class BudgetAlertsForm(forms.Form):
    alert_percents = forms.CharField(required=False, max_length=60, label="Budget alerts at (% of the budget)",
                                     help_text="comma-separated whole percentages, e.g. 50, 80, 100; "
                                               "empty: the platform's")

    def clean_alert_percents(self) -> list[int]:
        text = self.cleaned_data.get("alert_percents", "")
        try:
            values = sorted({int(part) for part in text.replace(" ", "").split(",") if part})
        except ValueError:
            raise forms.ValidationError("Whole percentages separated by commas.") from None
        if any(p < 1 or p > MAX_ALERT_PERCENT for p in values) or len(values) > MAX_ALERTS:
            raise forms.ValidationError(f"At most {MAX_ALERTS} percentages from 1 to {MAX_ALERT_PERCENT}.")
        return values
