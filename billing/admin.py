"""Operator admin for billing: the usage ledger (read-only)."""

from __future__ import annotations

from django.contrib import admin

from billing.models import UsageRecord


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    """Read-only ledger: records are written by workers, once per request."""

    list_display = (
        "request_id", "tenant", "api_key", "model", "tier", "endpoint", "prompt_tokens", "cached_tokens",
        "completion_tokens", "finish_reason", "queued_s", "ttft_s", "duration_s", "created_at",
    )
    list_filter = ("finish_reason", "endpoint", "tier", "model", "created_at")
    search_fields = ("request_id", "tenant__slug", "api_key__prefix", "worker_id")
    list_select_related = ("tenant", "api_key")
    date_hierarchy = "created_at"
    show_full_result_count = False

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
