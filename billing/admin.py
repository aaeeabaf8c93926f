"""Operator admin for billing: prices (add-only, history), adjustments (add-only), the usage ledger and
invoices (read-only)."""

from __future__ import annotations

from decimal import Decimal

from django import forms
from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from billing.models import Adjustment, Invoice, InvoiceLine, Price, UsageRecord
from billing.money import usd_str
from billing.services.adjustments import adjustment_create
from billing.services.prices import price_create, price_start_check


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
    class Meta:
        model = Price
        fields = ("model", "input_per_million", "cached_input_per_million", "output_per_million", "effective_from",
                  "note")

    def clean(self):
        data = super().clean()
        if data.get("model") and data.get("effective_from"):
            price_start_check(model=data["model"], effective_from=data["effective_from"])
        return data


class AdjustmentForm(forms.ModelForm):
    amount_usd = forms.DecimalField(min_value=Decimal("0.000000000000001"), decimal_places=15, label="Amount (USD)")

    class Meta:
        model = Adjustment
        fields = ("tenant", "kind", "amount_usd", "reason", "effective_at")


@admin.register(Price)
class PriceAdmin(AddOnlyAdmin):
    form = PriceForm
    list_display = ("model", "effective_from", "input_per_million", "cached_input_per_million",
                    "output_per_million", "created_by", "created_at", "note")
    list_filter = ("model",)
    readonly_fields = ()
    ordering = ("model", "-effective_from")

    def save_model(self, request, obj, form, change):
        created = price_create(
            model=obj.model, input_per_million=obj.input_per_million,
            cached_input_per_million=obj.cached_input_per_million, output_per_million=obj.output_per_million,
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
        "completion_tokens", "finish_reason", "cost_usd", "price", "queued_s", "ttft_s", "duration_s", "created_at",
    )
    list_filter = ("finish_reason", "endpoint", "tier", "model", "created_at")
    search_fields = ("request_id", "tenant__slug", "api_key__prefix", "worker_id")
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
                           reverse("invoice-html", args=[obj.pk]), reverse("invoice-csv", args=[obj.pk]))

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
