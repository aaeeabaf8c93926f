"""Operator admin for billing: prices (add-only, history, retired not deleted), adjustments (add-only), the
usage ledger and invoices (read-only)."""

from __future__ import annotations

from decimal import Decimal

from django import forms
from django.contrib import admin, messages
from django.db.models import CharField
from django.db.models.functions import Cast
from django.urls import reverse
from django.utils.html import format_html

from billing.models import Adjustment, Invoice, InvoiceLine, Price, UsageRecord
from billing.models.prices import PRICE_FIELDS
from billing.money import DEFAULT_BATCH_DISCOUNT_PERCENT, price_check, usd_str
from billing.services.adjustments import adjustment_create
from billing.services.price_cache import price_rows
from billing.services.prices import price_create, price_retire, price_start_check


class AddOnlyAdmin(admin.ModelAdmin):
    """Rows are added, then only read: a correction is a new row."""

    def has_change_permission(self, request, obj=None):
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return False

    def get_readonly_fields(self, request, obj=None):
        if obj is not None:
            return [field.name for field in self.model._meta.fields]
        return self.readonly_fields


class PriceForm(forms.ModelForm):
    batch_discount_percent = forms.IntegerField(
        min_value=0, max_value=100, required=False, initial=DEFAULT_BATCH_DISCOUNT_PERCENT,
        label="Batch discount (%)",
        help_text=f"Batch API lines pay every kind of token this whole percent less (default "
                  f"{DEFAULT_BATCH_DISCOUNT_PERCENT})")

    class Meta:
        model = Price
        fields = ("model", "input_per_million", "cached_input_per_million", "output_per_million",
                  "batch_discount_percent", "effective_from", "note")

    def clean(self):
        data = super().clean()
        if data.get("batch_discount_percent") is None and "batch_discount_percent" not in self.errors:
            data["batch_discount_percent"] = DEFAULT_BATCH_DISCOUNT_PERCENT
        if data.get("model") and data.get("effective_from"):
            price_start_check(model=data["model"], effective_from=data["effective_from"])
        return data


class AdjustmentForm(forms.ModelForm):
    amount_usd = forms.DecimalField(min_value=Decimal("0.000000000000001"), decimal_places=15, label="Amount (USD)")

    class Meta:
        model = Adjustment
        fields = ("tenant", "kind", "amount_usd", "reason", "effective_at")


def _price_text(name: str, label: str):
    @admin.display(description=label)
    def show(self, obj):
        return getattr(obj, f"{name}_text", None)
    return show


@admin.register(Price)
class PriceAdmin(AddOnlyAdmin):
    """Versions are added, never edited or deleted; one set by mistake is retired (the action), which keeps
    it and the records it priced. The amounts are shown as stored text, so a row written by hand that the
    price loader skips (billing.services.price_cache) is listed, marked, and can be retired."""

    form = PriceForm
    list_display = ("model", "effective_from", "input_text", "cached_input_text", "output_text",
                    "batch_discount_percent", "state", "created_by", "created_at", "note")
    list_filter = ("model",)
    readonly_fields = ()
    ordering = ("model", "-effective_from")
    actions = ["retire"]
    input_text = _price_text("input_per_million", "Input per 1M (USD)")
    cached_input_text = _price_text("cached_input_per_million", "Cached input per 1M (USD)")
    output_text = _price_text("output_per_million", "Output per 1M (USD)")

    def get_queryset(self, request):
        # never converts the amounts (a hand-written 99999999999999 would raise in SQLite's converter): their text
        return (super().get_queryset(request).defer(*PRICE_FIELDS)
                .annotate(**{f"{name}_text": Cast(name, CharField()) for name in PRICE_FIELDS}))

    def get_fields(self, request, obj=None):
        if obj is None:
            return super().get_fields(request, obj)
        return ["model", "input_text", "cached_input_text", "output_text", "batch_discount_percent", "effective_from",
                "state", "created_by", "created_at", "note", "retired_at", "retired_by"]

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return self.readonly_fields
        return self.get_fields(request, obj)

    @admin.display(description="State")
    def state(self, obj):
        if obj.retired_at is not None:
            return f"retired {obj.retired_at:%Y-%m-%d %H:%M} UTC"
        for name in PRICE_FIELDS:
            try:
                price_check(getattr(obj, f"{name}_text", None))
            except ValueError as exc:
                return format_html('<strong style="color:#ba2121">INVALID ({}): not loaded</strong>', exc)
        return "in use"

    def changelist_view(self, request, extra_context=None):
        for pk, model, _start, terms, reason, _discount in price_rows():
            if terms is None:
                messages.error(request, f"Price #{pk} of {model} cannot be used ({reason}). It is skipped, and "
                                        f"{model} is not served while it is the version in force: retire it "
                                        "(select it, then the action) and add a valid version.")
        return super().changelist_view(request, extra_context)

    @admin.action(description="Retire the selected price versions (kept, price nothing from now on)",
                  permissions=["change"])
    def retire(self, request, queryset):
        retired = [price for price in queryset if price_retire(price=price, retired_by=request.user)]
        for price in retired:
            self.log_change(request, price, "Retired")
        models_left = {price.model for price in retired} - set(
            Price.objects.filter(model__in={p.model for p in retired}, retired_at__isnull=True)
            .values_list("model", flat=True))
        self.message_user(request, f"Retired {len(retired)} price version(s); every process uses the versions "
                                   "before them within the price cache's TTL.")
        for model in sorted(models_left):
            self.message_user(request, f"No price version of {model} is left: its requests are not charged "
                                       "until one is added.", level=messages.WARNING)

    def save_model(self, request, obj, form, change):
        created = price_create(
            model=obj.model, input_per_million=obj.input_per_million,
            cached_input_per_million=obj.cached_input_per_million, output_per_million=obj.output_per_million,
            batch_discount_percent=obj.batch_discount_percent,
            effective_from=obj.effective_from, created_by=request.user, note=obj.note,
        )
        obj.pk, obj._state.adding = created.pk, False


@admin.register(Adjustment)
class AdjustmentAdmin(AddOnlyAdmin):
    list_display = ("tenant", "kind", "amount_usd", "reason", "operator", "effective_at", "created_at")
    list_filter = ("kind",)
    search_fields = ("tenant__slug", "reason")
    form = AdjustmentForm

    def get_fields(self, request, obj=None):
        if obj is not None:
            return [field.name for field in self.model._meta.fields]
        return ["tenant", "kind", "amount_usd", "reason", "effective_at"]

    @admin.display(description="Amount (USD)")
    def amount_usd(self, obj):
        return usd_str(obj.amount_femtos)

    def save_model(self, request, obj, form, change):
        created = adjustment_create(
            tenant=obj.tenant, kind=obj.kind, amount_usd=form.cleaned_data["amount_usd"], reason=obj.reason,
            operator=request.user, effective_at=obj.effective_at,
        )
        obj.pk, obj._state.adding = created.pk, False


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    """Read-only ledger: records are written by workers, once per request, with their frozen cost."""

    list_display = (
        "request_id", "tenant", "api_key", "model", "tier", "endpoint", "prompt_tokens", "cached_tokens",
        "completion_tokens", "finish_reason", "cost_usd", "price", "batch_id", "queued_s", "ttft_s", "duration_s",
        "created_at",
    )
    list_filter = ("finish_reason", "endpoint", "tier", "model", "created_at")
    search_fields = ("request_id", "tenant__slug", "api_key__prefix", "worker_id", "batch_id")
    list_select_related = ("tenant", "api_key", "price")
    date_hierarchy = "created_at"
    show_full_result_count = False

    @admin.display(description="Cost (USD)")
    def cost_usd(self, obj):
        return usd_str(obj.cost_femtos)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class InvoiceLineInline(admin.TabularInline):
    model = InvoiceLine
    fields = ("position", "kind", "model", "price", "price_multiplier", "quantity", "unit_price_per_million",
              "exact_usd", "amount_cents")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Invoice)
class InvoiceAdmin(admin.ModelAdmin):
    """Invoices are written by `invoices_close` (and its beat task), never by hand."""

    list_display = ("number", "tenant", "kind", "period", "status", "total", "finalized_at", "printable")
    list_filter = ("status", "kind", "period")
    search_fields = ("number", "tenant__slug")
    inlines = [InvoiceLineInline]

    @admin.display(description="Print / CSV")
    def printable(self, obj):
        return format_html('<a href="{}">HTML</a> · <a href="{}">CSV</a>',
                           reverse("invoice-html", args=[obj.public_id]), reverse("invoice-csv", args=[obj.public_id]))

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

from billing import budget_admin  # noqa: E402,F401  (the tenant's budget in tenants' admins)
